#!/usr/bin/env bash
# The long-prompt experiment (Sarathi-Serve's point): 8 streams decode while prompts of 1024
# tokens keep arriving. Without chunking a long prompt's prefill runs in one step and every
# decoding stream waits for it (an inter-token latency spike); with --chunk 128 or 256 the
# prefill is spread over steps that also carry the decodes.
#
# How often the prompts arrive decides what a p99 can see. A stalled gap is one per decode stream
# per prompt, while the decode gaps between two prompts number (time between prompts) / (decode
# step): for a p99 to see the stalls they must be more than 1% of the gaps. A 1024-token prefill
# costs about as much as 100-200 decode steps here, so with rare prompts the unchunked p99 is an
# ordinary decode gap (the spikes are all in the max), while chunking spreads each prompt over
# several longer gaps and p99 says chunking hurts. The experiment therefore offers two loads:
#   BUSY=closed (default): the prompts keep arriving: one long prompt is always waiting or in
#     prefill (closed loop, concurrency 1), the heaviest prefill load a server sees;
#   BUSY=F (0 < F < 1): Poisson arrivals at F / P per second, where P is the time of one whole
#     prefill measured first (median of 3): prefill takes about a share F of the engine's time.
# Both loads run for DURATION seconds (bench serve --duration), side by side with the decode load.
#
# For each chunk setting the server is started afresh. The decode load: closed loop, 8 streams,
# 16-token prompts, DECODE_OUT output tokens. The long prompts: LONG_LEN tokens, 1 output token.
# Prints the decode streams' ITL p50/p99/max and the number of gaps, the throughput (prompt +
# generated tokens the engine ran, from /metrics, per second from the start of the loads to the
# end of both), and the ratios to no chunking.
# The settings run in ROUNDS rounds, each a segment of every setting back to back (the order
# rotated from round to round), and every ratio is taken within its round: this machine's speed
# drifts by tens of percent within a minute, which a ratio of segments minutes apart would carry.
# The summary gives each setting's median over the rounds.
# Not part of `make bench` (a few minutes). Usage: bench/serve/chunked_prefill.sh [BUILD]
# Environment: ARCH (model JSON), THREADS (2), BUSY (closed), DURATION (10, seconds per segment),
# ROUNDS (3), LONG_LEN (1024), DECODE_OUT (64), CHUNKS ("0 256 128"; the first is the baseline).
set -euo pipefail
build=${1:-${NANOLM_BUILD:-build}}
root=$(cd "$(dirname "$0")/../.." && pwd)
tok="$root/data/stories260K/tok512.bin"
arch=${ARCH:-'{"name":"rand-d512-l8","vocab_size":512,"dim":512,"n_layers":8,"n_heads":8,"n_kv_heads":8,"hidden_dim":1408,"seq_len":2048}'}
threads=${THREADS:-2}
decode_out=${DECODE_OUT:-64}
long_len=${LONG_LEN:-1024}
busy=${BUSY:-closed}
duration=${DURATION:-10}
rounds=${ROUNDS:-3}
chunks=${CHUNKS:-"0 256 128"}
tmp=$(mktemp -d)
pid=
cleanup() { [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
num() { sed -n "s/.*\"$1\":[[:space:]]*\\([0-9.eE+-]*\\).*/\\1/p" "$2" | head -1; }
calc() { awk "BEGIN{print $1}"; }
start_server() { # chunk
  rm -f "$tmp/port"
  OMP_NUM_THREADS=$threads "$build/nanolm" serve --dummy-arch "$arch" --tokenizer "$tok" --port 0 \
    --port-file "$tmp/port" --chunk "$1" --max-step-tokens 2048 --max-batch 16 --threads "$threads" 2>"$tmp/log" &
  pid=$!
  for _ in $(seq 600); do [[ -s $tmp/port ]] && break; sleep 0.1; done
  url="http://127.0.0.1:$(cat "$tmp/port")"
}
stop_server() { kill -TERM "$pid"; wait "$pid" || true; pid=; }

if [[ $busy == closed ]]; then
  long_load=(--requests 1000000 --concurrency 1)
  what="one long prompt always waiting (closed loop)"
else
  start_server 0
  "$build/nanolm" bench serve --url "$url" --requests 1 --concurrency 1 --prompt-len "$long_len" --output-len 1 \
    --seed 4 --json >/dev/null # warm-up
  "$build/nanolm" bench serve --url "$url" --requests 3 --concurrency 1 --prompt-len "$long_len" --output-len 1 \
    --seed 4 --json >"$tmp/cal.json"
  stop_server
  prefill_ms=$(num ttft_p50_ms "$tmp/cal.json")
  long_rate=$(calc "$busy * 1000 / $prefill_ms")
  long_load=(--requests 1000000 --rate "$long_rate" --concurrency 64)
  what="Poisson arrivals at $long_rate/s (one prefill alone: $prefill_ms ms; BUSY $busy)"
fi
echo "$threads threads, model $arch"
echo "long prompts of $long_len tokens: $what; 8 decode streams of $decode_out tokens; $rounds rounds of $duration s per setting"
printf '%-6s %-8s %10s %10s %10s %10s %14s %10s %10s\n' round chunk "ITL p50" "ITL p99" "ITL max" "gaps" "total tok/s" \
  "p99 ratio" "tput ratio"
read -r -a settings <<<"$chunks"
base=${settings[0]}
: >"$tmp/all"
for ((r = 0; r < rounds; r++)); do
  order=()
  for ((k = 0; k < ${#settings[@]}; k++)); do order+=("${settings[(k + r) % ${#settings[@]}]}"); done
  for chunk in "${order[@]}"; do
    start_server "$chunk"
    t0=$(date +%s.%N)
    "$build/nanolm" bench serve --url "$url" "${long_load[@]}" --duration "$duration" \
      --prompt-len "$long_len" --output-len 1 --seed $((5 + r)) --json >"$tmp/long.json" &
    long=$!
    "$build/nanolm" bench serve --url "$url" --requests 1000000 --duration "$duration" --concurrency 8 \
      --prompt-len 16 --output-len "$decode_out" --seed $((6 + r)) --json >"$tmp/dec.json"
    wait "$long"
    t1=$(date +%s.%N)
    done_tokens=$(curl -s "$url/metrics" | awk '$1 == "nanolm_prompt_tokens_total" || $1 == "nanolm_generation_tokens_total" {s += $2} END {print s}')
    stop_server
    # prompt + generated tokens the engine ran per second of the segment
    echo "$r $chunk $(num itl_p50_ms "$tmp/dec.json") $(num itl_p99_ms "$tmp/dec.json") $(num itl_max_ms "$tmp/dec.json")" \
      "$(num itl_n "$tmp/dec.json") $(calc "$done_tokens / ($t1 - $t0)")" >>"$tmp/all"
  done
  # this round's lines, in the order of CHUNKS, with ratios to this round's baseline
  awk -v r="$r" -v base="$base" -v list="$chunks" '
    $1 == r { p50[$2] = $3; p99[$2] = $4; mx[$2] = $5; n[$2] = $6; tps[$2] = $7 }
    END { k = split(list, c, " ");
      for (i = 1; i <= k; i++) printf "%-6s %-8s %10.1f %10.1f %10.1f %10s %14.1f %10.3f %10.3f\n", r, c[i], p50[c[i]],
        p99[c[i]], mx[c[i]], n[c[i]], tps[c[i]], p99[c[i]] / p99[base], tps[c[i]] / tps[base] }' "$tmp/all" |
    tee -a "$tmp/rounds"
done
echo "medians over $rounds rounds (ratios taken within each round):"
printf '%-8s %10s %10s %14s %10s %10s\n' chunk "ITL p50" "ITL p99" "total tok/s" "p99 ratio" "tput ratio"
for chunk in $chunks; do
  awk -v c="$chunk" '$2 == c { print $3, $4, $7, $8, $9 }' "$tmp/rounds" | awk '
    { for (j = 1; j <= 5; j++) v[j, NR] = $j }
    function med(j,   a, i, k, t) { for (i = 1; i <= NR; i++) a[i] = v[j, i];
      for (i = 2; i <= NR; i++) for (k = i; k > 1 && a[k - 1] > a[k]; k--) { t = a[k]; a[k] = a[k - 1]; a[k - 1] = t }
      return NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }
    END { printf "%10.1f %10.1f %14.1f %10.3f %10.3f\n", med(1), med(2), med(3), med(4), med(5) }' |
    sed "s/^/$(printf '%-8s' "$chunk")/"
done
