#!/usr/bin/env bash
# Training throughput of NanoLM against the same architecture in PyTorch (bench/torch_train.py,
# Debian's python3-torch) with the same thread count, measured in the same run: 30 steps of
# shakespeare-char (batch 12 x 64) and small (batch 2 x 256); each run's figure is the median
# tokens/s of its steps 6..30. nanolm and PyTorch runs alternate (REPS pairs, default 5 and 3),
# and the ratio printed is the median of the per-pair ratios, so that load from other jobs on a
# shared machine hits both sides of a pair alike. Every run's figure is printed too. Beside
# tokens/s: nanolm's model FLOPs utilisation (6N + attention FLOPs per token x the median
# tokens/s) against this machine's fp32 FMA peak and its sgemm rate, as `nanolm train` measures
# them after each run (CPU-clock timings, nanolm/peak.h); medians over the runs.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${NANOLM_BUILD:-build}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
bin="$build/nanolm"
data=${NANOLM_DATA:-$root/data}/tinyshakespeare/input.txt
if [[ ! -x "$bin" || ! -f "$data" ]]; then echo "bench_train: needs $bin and $data"; exit 1; fi
threads=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
# Both nanolm and PyTorch run OpenMP; with spin-waiting threads on a 2-core machine one run
# measured 0.98x with 2 minutes of system time, with passive waiting 1.47x. Same setting for both.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
steps=30
have_torch=0
if /usr/bin/python3 -c "import torch" 2>/dev/null; then have_torch=1; else echo "bench_train: PyTorch (python3-torch) is not installed; printing nanolm alone"; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

jnum() { grep -o "\"$1\":[^,}]*" "$tmp/run.json" | head -1 | sed 's/.*:[[:space:]]*//'; }

nanolm_rate() { # preset batch seq -> "tokens/s mfu_fma% mfu_sgemm%": median tokens/s of steps 6..30 of one run
  "$bin" train --data "$data" --preset "$1" --steps $steps --batch "$2" --seq "$3" --eval-every 0 --eval-windows 1 \
    --log "$tmp/log.csv" --json >"$tmp/run.json" || { echo "0 0 0"; return 1; }
  local r
  r=$(awk -F, 'NR > 6 {print $8}' "$tmp/log.csv" | median)
  awk -v r="$r" -v f="$(jnum model_flops_per_token)" -v p="$(jnum fma_peak_flops_per_s)" -v s="$(jnum sgemm_flops_per_s)" \
    'BEGIN {printf "%s %.1f %.1f\n", r, 100 * r * f / p, 100 * r * f / s}'
}

printf "%-18s %8s %14s %14s %8s   %s\n" preset threads "nanolm tok/s" "torch tok/s" ratio "nanolm MFU (of FMA peak / of sgemm)"
for cfg in "shakespeare-char 12 64 1.5 5" "small 2 256 1.0 3"; do
  set -- $cfg
  preset=$1 B=$2 T=$3 target=$4 reps=${REPS:-$5}
  nr=(); tr=(); rr=(); mf=(); ms=()
  for ((rep = 0; rep < reps; rep++)); do
    read -r n f s <<<"$(nanolm_rate "$preset" "$B" "$T")"
    nr+=("$(printf %.0f "$n")"); mf+=("$f"); ms+=("$s")
    if [[ $have_torch == 1 ]]; then
      t=$(/usr/bin/python3 "$root/bench/torch_train.py" "$data" "$preset" $steps "$B" "$T" "$threads" | sed -E 's/.*median ([0-9.]+) tokens.*/\1/')
      tr+=("$(printf %.0f "$t")")
      rr+=("$(awk -v a="$n" -v b="$t" 'BEGIN {printf "%.3f", a / b}')")
    fi
  done
  n=$(printf "%s\n" "${nr[@]}" | median)
  mfu="$(printf "%s\n" "${mf[@]}" | median)% / $(printf "%s\n" "${ms[@]}" | median)%"
  if [[ $have_torch == 1 ]]; then
    t=$(printf "%s\n" "${tr[@]}" | median)
    r=$(printf "%s\n" "${rr[@]}" | median)
    printf "%-18s %8d %14.0f %14.0f %7.2fx  %s  (target >= %sx)\n" "$preset" "$threads" "$n" "$t" "$r" "$mfu" "$target"
    printf "    runs: nanolm %s | torch %s | pair ratios %s | MFU of sgemm %s\n" "${nr[*]}" "${tr[*]}" "${rr[*]}" "${ms[*]}"
  else
    printf "%-18s %8d %14.0f %14s %8s   %s\n" "$preset" "$threads" "$n" "-" "-" "$mfu"
    printf "    runs: nanolm %s | MFU of sgemm %s\n" "${nr[*]}" "${ms[*]}"
  fi
done
