#!/usr/bin/env bash
# The measured pipeline bubble next to the formula (P-1)/(M+P-1): GPipe and 1F1B, P = 2..4
# stages, M = 1, 2, 4, 8 micro-batches, NanoLM (dim 128, 4 layers, hidden 512, seq 64, 16 windows)
# on tinyshakespeare.
# measured = mean over ranks of idle / (busy + idle), where idle is the time a stage waits for a
# micro-batch's activations or gradients, over 2 steps. Ranks share the machine's cores
# (--oversubscribe), so with more ranks than free cores the waits include scheduling.
set -euo pipefail
build=${NANOLM_BUILD:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
data=${NANOLM_DATA:-$root/data}/tinyshakespeare/input.txt
[[ -f "$data" ]] || { echo "$(basename "$0"): $data is missing (committed under data/)" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
shape="--dim 128 --layers 4 --heads 4 --kv-heads 4 --hidden 512 --seq 64 --steps 2 --batch 16 --data $data"
printf "%-6s %3s %3s %10s %9s\n" schedule P M measured formula
for sched in gpipe 1f1b; do
  for P in 2 3 4; do
    for M in 1 2 4 8; do
      line=$(mpirun --allow-run-as-root --oversubscribe -np "$P" "$build/nanolm" parallel train $shape \
               --pp "$P" --microbatches "$M" --schedule "$sched" | grep '^mean measured bubble')
      printf "%-6s %3s %3s %10s %9s\n" "$sched" "$P" "$M" "$(awk '{print $4}' <<<"$line")" "$(awk '{print $7}' <<<"$line")"
    done
  done
done
echo "(load average $(cut -d' ' -f1 /proc/loadavg) on $(getconf _NPROCESSORS_ONLN) cores)"
