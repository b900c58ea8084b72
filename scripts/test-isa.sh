#!/usr/bin/env bash
# Runs the tests labelled "isa" (tests/isa.txt) once under each NANOLM_ISA cap below what this CPU
# has: avx512 -> avx2 and scalar; avx2 -> scalar; neon -> scalar. `make test` already ran them as
# detected. Usage: scripts/test-isa.sh BUILD_DIR [JOBS]
set -euo pipefail
build=${1:-build}
jobs=${2:-2}
detected=$(NANOLM_ISA=auto "$build/nanolm" version --json | sed -n 's/.*"isa_detected":[[:space:]]*"\([a-z0-9]*\)".*/\1/p')
case "$detected" in
  avx512) caps="avx2 scalar" ;;
  avx2|neon) caps="scalar" ;;
  scalar) caps="" ;;
  *) echo "test-isa: could not read the detected instruction set from '$build/nanolm version --json'" >&2; exit 1 ;;
esac
echo "test-isa: this CPU has $detected; running the isa-labelled tests under: ${caps:-nothing lower}"
for cap in $caps; do
  echo "test-isa: NANOLM_ISA=$cap"
  (cd "$build" && NANOLM_ISA=$cap ctest --output-on-failure --timeout 900 -j "$jobs" -L isa)
done
