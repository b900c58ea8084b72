#!/usr/bin/env bash
# Our ring all-reduce (reduce-scatter + all-gather on MPI point-to-point) versus the native
# MPI_Allreduce, measured in the same run under mpirun -np 4, at 1, 16 and 128 MiB: busbw
# (nccl-tests' definition, 2(p-1)/p x size / time) and the ratio ours/native (target >= 0.9x at
# >= 16 MiB). Times are medians over 7 repetitions of the slowest rank.
set -euo pipefail
build=${NANOLM_BUILD:-build}
np=${NANOLM_BENCH_RANKS:-4}
mpirun --allow-run-as-root --oversubscribe -np "$np" "$build/nanolm" collectives bench \
  --ops all-reduce --sizes 1M,16M,128M --reps 7
