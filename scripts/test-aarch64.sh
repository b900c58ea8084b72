#!/usr/bin/env bash
# Cross-compiles nanolm for aarch64 (cmake/aarch64-linux-gnu.cmake: Debian's gcc-aarch64-linux-gnu,
# the arm64 multiarch libraries, MPI off) and runs the core tests under qemu-aarch64 three times:
# the NEON path on qemu's default CPU (which has dotprod: sdot), NEON on a CPU without dotprod
# (QEMU_CPU=cortex-a72: the widening multiplies), and NANOLM_ISA=scalar (portable C). Correctness
# only: emulated speed means nothing. Usage: scripts/test-aarch64.sh [BUILD_DIR] [JOBS]
set -euo pipefail
build=${1:-build-aarch64}
jobs=${2:-2}
tests=(test_matvec test_matvec_int4 test_qlinear test_formats test_isa test_quant test_quant_mx test_fp8 test_kvcache
       test_engine)
cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
  -DNANOLM_MPI=OFF -DNANOLM_NATIVE=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target nanolm_cli "${tests[@]}"
regex="^($(IFS='|'; echo "${tests[*]}"))\$"
for run in neon neon-without-dotprod scalar; do
  env=()
  case "$run" in
    neon) ;;
    neon-without-dotprod) env=(QEMU_CPU=cortex-a72) ;;
    scalar) env=(NANOLM_ISA=scalar) ;;
  esac
  isa=$(env "${env[@]}" qemu-aarch64 -L / "$build/nanolm" version --json | sed -n 's/.*"isa":[[:space:]]*"\([a-z0-9]*\)".*/\1/p')
  echo "test-aarch64: $run (nanolm version: isa $isa)"
  (cd "$build" && env "${env[@]}" ctest --output-on-failure --timeout 1800 -j "$jobs" -R "$regex")
done
