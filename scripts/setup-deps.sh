#!/usr/bin/env bash
# Installs the Debian packages nanolm needs, only those that are missing (idempotent).
# Usage: scripts/setup-deps.sh [fuzz] [torch] [check] [format] [pip] [node] [jinja] [aarch64]
# With everything present it does nothing and needs no apt. Otherwise: as root it runs apt-get
# itself; else it tries sudo without a password; else it prints the exact apt-get line and
# exits 1. On a machine without apt/dpkg it checks the build's needs directly (cmake,
# pkg-config, a C compiler, OpenBLAS and cJSON through pkg-config) and names what is missing.
set -euo pipefail

pkgs=(cmake pkg-config gcc g++ make libopenblas-dev libopenmpi-dev openmpi-bin
      libcjson-dev libcmocka-dev libpcre2-dev libutf8proc-dev python3 python3-numpy python3-pytest
      libmicrohttpd-dev curl)
# Extra packages for optional targets: `scripts/setup-deps.sh fuzz` adds the fuzzing toolchain.
arm64=0
for extra in "$@"; do
  case "$extra" in
    fuzz) pkgs+=(clang libclang-rt-14-dev libomp-14-dev) ;;
    torch) pkgs+=(python3-torch python3-numpy) ;;
    check) pkgs+=(valgrind) ;;
    format) pkgs+=(clang-format) ;;  # scripts/check-format.sh (clang-format-diff)
    pip) pkgs+=(python3-venv python3-pip python3-setuptools python3-wheel) ;;  # pip install ./python
    node) pkgs+=(nodejs npm) ;;  # bench/bench_llamacpp.sh (llama.cpp through the npm package node-llama-cpp)
    jinja) pkgs+=(python3-jinja2) ;;  # tests/ref/make_chat_fixture.py (chat template renderings)
    # make test-aarch64: the cross compiler, qemu's user-mode emulator and the arm64 builds of the
    # libraries the library links (Debian multiarch; MPI is left out of that build)
    aarch64) pkgs+=(gcc-aarch64-linux-gnu qemu-user libc6:arm64 libgomp1:arm64 libopenblas-dev:arm64
                    libcjson-dev:arm64 libcmocka-dev:arm64 libpcre2-dev:arm64 libutf8proc-dev:arm64
                    libmicrohttpd-dev:arm64)
             arm64=1 ;;
    *) echo "setup-deps: unknown extra '$extra' (known: fuzz, torch, check, format, pip, node, jinja, aarch64)" >&2; exit 2 ;;
  esac
done

if ! command -v dpkg-query >/dev/null 2>&1; then
  # Not Debian: check what the build itself needs; MPI and cmocka are optional (the parallel
  # commands and the tests are left out without them).
  need=()
  for tool in cmake pkg-config make; do command -v "$tool" >/dev/null 2>&1 || need+=("$tool"); done
  command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || need+=("a C11 compiler (gcc or clang)")
  if command -v pkg-config >/dev/null 2>&1; then
    pkg-config --exists openblas || need+=("OpenBLAS with openblas.pc")
    pkg-config --exists libcjson || need+=("cJSON with libcjson.pc")
    pkg-config --exists libpcre2-8 || need+=("PCRE2 with libpcre2-8.pc")
    pkg-config --exists libutf8proc || need+=("utf8proc with libutf8proc.pc")
    pkg-config --exists libmicrohttpd || need+=("GNU libmicrohttpd with libmicrohttpd.pc")
    pkg-config --exists cmocka || echo "setup-deps: optional: cmocka (cmocka.pc) to build the tests" >&2
    command -v mpicc >/dev/null 2>&1 || echo "setup-deps: optional: an MPI library (Open MPI) for the parallel commands" >&2
  fi
  if [[ ${#need[@]} -gt 0 ]]; then
    echo "setup-deps: no apt here; install these with your package manager:" >&2
    printf '  %s\n' "${need[@]}" >&2
    echo "  (Debian names: ${pkgs[*]})" >&2
    exit 1
  fi
  exit 0
fi

missing=()
for p in "${pkgs[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "setup-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# the arm64 packages need dpkg to accept that architecture (multiarch) before apt-get update
add_arch=()
if [[ $arm64 -eq 1 ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then add_arch=(dpkg --add-architecture arm64); fi
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
  [[ ${#add_arch[@]} -eq 0 ]] || "${add_arch[@]}"
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  [[ ${#add_arch[@]} -eq 0 ]] || sudo -n "${add_arch[@]}"
  sudo -n apt-get update -q
  sudo -n DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup-deps: missing packages and no root or sudo; run:" >&2
  [[ ${#add_arch[@]} -eq 0 ]] || echo "  sudo ${add_arch[*]} && sudo apt-get update" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
