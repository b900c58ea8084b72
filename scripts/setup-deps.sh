#!/usr/bin/env bash
# Installs the Debian packages nanolm needs, only those that are missing (idempotent).
# As root it runs apt-get itself; otherwise it tries sudo without a password; otherwise it
# prints the exact apt-get line to run and exits 1.
set -euo pipefail

pkgs=(cmake pkg-config gcc g++ make libopenblas-dev libopenmpi-dev openmpi-bin
      libcjson-dev libcmocka-dev libpcre2-dev libutf8proc-dev fortunes python3 python3-numpy python3-pytest
      libmicrohttpd-dev curl)
# Extra packages for optional targets: `scripts/setup-deps.sh fuzz` adds the fuzzing toolchain.
for extra in "$@"; do
  case "$extra" in
    fuzz) pkgs+=(clang libclang-rt-14-dev libomp-14-dev) ;;
    torch) pkgs+=(python3-torch python3-numpy) ;;
    pip) pkgs+=(python3-venv python3-pip python3-setuptools python3-wheel) ;;  # pip install ./python
    *) echo "setup-deps: unknown extra '$extra' (known: fuzz, torch, pip)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "setup-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if [[ $(id -u) -eq 0 ]]; then
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo -n apt-get update -q
  sudo -n DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup-deps: missing packages and no root or sudo; run:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
