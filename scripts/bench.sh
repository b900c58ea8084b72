#!/usr/bin/env bash
# Runs every benchmark. Each prints ratios against a baseline measured in the same run.
# Benchmarks are the build's bench_* executables and bench/*.sh scripts (which may call mpirun
# or /usr/bin/python3 for the PyTorch comparison).
set -uo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
# OpenMP threads that spin after a parallel region steal the cores from OpenBLAS's own threads
# (and from PyTorch's), which slows the baselines and inflates ratios (measured: W8A8 vs sgemm
# 95x instead of 2.8x at M = 16). Every benchmark runs with passive waiting unless told otherwise.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
rc=0
for b in "$build"/bench_*; do
  [[ -x "$b" ]] || continue
  echo "== $(basename "$b")"
  case "$(basename "$b")" in
    # The decode benchmark uses no OpenBLAS; its ~100 short parallel regions per token need
    # threads that spin between regions (a sleeping thread takes longer to wake than a
    # 2-thread decode region lasts).
    bench_decode) OMP_WAIT_POLICY=active "$b" || rc=1 ;;
    # nanolm's half of bench/bench_llamacpp.sh, which runs it
    bench_gguf) echo "(run by bench/bench_llamacpp.sh)" ;;
    *) "$b" || rc=1 ;;
  esac
done
for s in "$root"/bench/*.sh; do
  [[ -f "$s" ]] || continue
  echo "== $(basename "$s")"
  NANOLM_BUILD="$build" bash "$s" || rc=1
done
exit $rc
