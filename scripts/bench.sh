#!/usr/bin/env bash
# Runs every benchmark. Each prints ratios against a baseline measured in the same run.
# Benchmarks are the build's bench_* executables and bench/*.sh scripts (which may call mpirun
# or /usr/bin/python3 for the PyTorch comparison).
set -uo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
rc=0
for b in "$build"/bench_*; do
  [[ -x "$b" ]] || continue
  echo "== $(basename "$b")"
  "$b" || rc=1
done
for s in "$root"/bench/*.sh; do
  [[ -f "$s" ]] || continue
  echo "== $(basename "$s")"
  NANOLM_BUILD="$build" bash "$s" || rc=1
done
exit $rc
