#!/usr/bin/env bash
# Training throughput of DDP on 2 ranks versus 1 rank, same global batch, measured in the same
# run: NanoLM (dim 128, 4 layers, seq 64) on tinyshakespeare, 10 steps, one thread per rank.
# Prints tokens/s of each and the speed-up (ideal 2.0x when the machine has 2 free cores).
set -euo pipefail
build=${NANOLM_BUILD:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
data=${NANOLM_DATA:-$root/data}/tinyshakespeare/input.txt
[[ -f "$data" ]] || { echo "$(basename "$0"): $data is missing (committed under data/)" >&2; exit 1; }
shape="--dim 128 --layers 4 --heads 4 --kv-heads 4 --hidden 256 --seq 64 --steps 10 --data $data"
tps() { sed -n 's/^\([0-9.]*\) tokens\/s.*/\1/p'; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
one=$("$build/nanolm" parallel train $shape --batch 16 | tps)
two=$(mpirun --allow-run-as-root --oversubscribe -np 2 "$build/nanolm" parallel train $shape --batch 8 --dp 2 | tps)
echo "DDP throughput, global batch 16 x 64 tokens: 1 rank $one tokens/s, 2 ranks $two tokens/s," \
     "speed-up $(awk -v a="$one" -v b="$two" 'BEGIN { printf "%.2fx", b / a }') (load: $(cut -d' ' -f1 /proc/loadavg))"
