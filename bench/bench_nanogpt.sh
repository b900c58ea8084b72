#!/usr/bin/env bash
# NanoLM against nanoGPT side by side: shakespeare-char, 200 steps, batch 12 x 64, one
# validation batch at the end, as a new user runs them:
#   nanolm train --preset shakespeare-char --batch 12 --steps 200 --lr 1e-3 --eval-every 0 --eval-windows 1
#   /usr/bin/python3 bench/nanogpt_train.py input.txt 200 THREADS   (nanoGPT's CPU configuration:
#   4 layers, 4 heads, 128 wide, block 64, batch 12, dropout 0; Debian's python3-torch)
# with the same thread count and OMP_WAIT_POLICY=passive for both. The two alternate, REPS pairs
# (default 5), so that load from other jobs on a shared machine hits both sides of a pair alike.
# Printed: each run's process wall time (what `time` says, start-up included) and its training
# loop time (nanolm: the run's wall_s; nanoGPT: the loop and the final evaluation), their
# medians, and the median of the per-pair ratios nanoGPT / nanolm (> 1: nanolm is faster).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${NANOLM_BUILD:-build}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
bin="$build/nanolm"
data=${NANOLM_DATA:-$root/data}/tinyshakespeare/input.txt
steps=${STEPS:-200}
reps=${REPS:-5}
if [[ ! -x "$bin" || ! -f "$data" ]]; then echo "bench_nanogpt: needs $bin and $data"; exit 1; fi
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "bench_nanogpt: needs PyTorch (scripts/setup-deps.sh torch)"
  exit 1
fi
threads=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
now() { date +%s.%N; }

echo "bench_nanogpt: $steps steps of shakespeare-char, batch 12 x 64, $threads threads, OMP_WAIT_POLICY=$OMP_WAIT_POLICY, $reps alternated pairs"
isa=$(grep -m1 '^flags' /proc/cpuinfo | grep -qw avx512f && echo "AVX-512" || (grep -m1 '^flags' /proc/cpuinfo | grep -qw avx2 && echo "AVX2, no AVX-512" || echo "no AVX2"))
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores, $isa, NANOLM_ISA=${NANOLM_ISA:-auto}"
nw=(); nl=(); gw=(); gl=(); rw=(); rl=(); mfu=()
for ((rep = 0; rep < reps; rep++)); do
  t0=$(now)
  "$bin" train --data "$data" --preset shakespeare-char --batch 12 --steps "$steps" --lr 1e-3 --eval-every 0 \
    --eval-windows 1 --json >"$tmp/n.json" || { echo "bench_nanogpt: nanolm failed"; exit 1; }
  t1=$(now)
  /usr/bin/python3 "$root/bench/nanogpt_train.py" "$data" "$steps" "$threads" >"$tmp/g.txt" || { echo "bench_nanogpt: nanoGPT failed"; exit 1; }
  t2=$(now)
  a=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
  b=$(awk -v a="$t1" -v b="$t2" 'BEGIN {printf "%.3f", b - a}')
  la=$(grep -o '"wall_s":[^,]*' "$tmp/n.json" | head -1 | sed 's/.*:[[:space:]]*//')
  lb=$(sed -E 's/.*loop ([0-9.]+) s.*/\1/' "$tmp/g.txt")
  m=$(grep -o '"mfu_sgemm":[^,}]*' "$tmp/n.json" | sed 's/.*:[[:space:]]*//')
  nw+=("$a"); gw+=("$b"); nl+=("$(printf %.3f "$la")"); gl+=("$lb"); mfu+=("$(awk -v m="$m" 'BEGIN {printf "%.1f", 100 * m}')")
  rw+=("$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", b / a}')")
  rl+=("$(awk -v a="$la" -v b="$lb" 'BEGIN {printf "%.3f", b / a}')")
  printf "  pair %d: nanolm %6.2f s (loop %6.2f s, MFU %s%% of sgemm)  nanoGPT %6.2f s (loop %6.2f s)  ratio %s (loop %s)\n" \
    $((rep + 1)) "$a" "$la" "${mfu[-1]}" "$b" "$lb" "${rw[-1]}" "${rl[-1]}"
done
printf "%-28s %10s %10s %8s\n" "median of $reps" "nanolm" "nanoGPT" "ratio"
printf "%-28s %9.2fs %9.2fs %7.2fx  (target >= 2x)\n" "process wall time" "$(printf "%s\n" "${nw[@]}" | median)" \
  "$(printf "%s\n" "${gw[@]}" | median)" "$(printf "%s\n" "${rw[@]}" | median)"
printf "%-28s %9.2fs %9.2fs %7.2fx\n" "training loop" "$(printf "%s\n" "${nl[@]}" | median)" \
  "$(printf "%s\n" "${gl[@]}" | median)" "$(printf "%s\n" "${rl[@]}" | median)"
printf "nanolm MFU against the sgemm rate: median %s%% (target >= 30%%)\n" "$(printf "%s\n" "${mfu[@]}" | median)"
