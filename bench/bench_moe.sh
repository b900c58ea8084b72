#!/usr/bin/env bash
# Mixture of experts under mpirun (4 and 2 ranks, one thread each):
#  1. all-to-all busbw, our pairwise exchange vs native MPI_Alltoallv, measured in the same run
#     (nanolm collectives bench; busbw = algbw x (p-1)/p, ratio ours/native per size);
#  2. NanoLM-MoE training throughput (moe-course-tiny: 64 routed + 2 shared experts, top-6),
#     global batch 8 x 32 tokens, EP = 1 (one rank) vs EP = 2 (two ranks), median of 3 runs of
#     20 steps each, and the speed-up (ideal 2x only with 2 free cores).
set -euo pipefail
build=${NANOLM_BUILD:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
data=${NANOLM_DATA:-$root/data}/tinyshakespeare/input.txt
[[ -f "$data" ]] || { echo "$(basename "$0"): $data is missing (committed under data/)" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mpi="mpirun --allow-run-as-root --oversubscribe"
echo "all-to-all on 4 ranks, ours vs native MPI_Alltoallv:"
$mpi -np 4 "$build/nanolm" collectives bench --ops all-to-all --sizes 1M,16M,64M --reps 5 | sed -n '1,/^$/p'
tps() { sed -n 's/^.* s, \([0-9]*\) tokens\/s$/\1/p'; }
median() { sort -n | sed -n 2p; }
args="moe train --data $data --steps 20 --seq 32"
one=$(for i in 1 2 3; do "$build/nanolm" $args --batch 8 --ep 1 | tps; done | median)
two=$(for i in 1 2 3; do $mpi -np 2 "$build/nanolm" $args --batch 4 --ep 2 | tps; done | median)
echo "MoE training throughput, global batch 8 x 32 tokens: EP=1 $one tokens/s, EP=2 $two tokens/s," \
     "speed-up $(awk -v a="$one" -v b="$two" 'BEGIN { printf "%.2fx", b / a }') (load: $(cut -d' ' -f1 /proc/loadavg))"
