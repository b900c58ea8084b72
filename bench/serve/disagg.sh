#!/usr/bin/env bash
# Prefill/decode disaggregation (DistServe, Splitwise) beside colocated serving, with and without
# chunked prefill. The same mixed load runs against three setups, each started afresh:
#   colocated, --chunk 0       one process, 2 threads: a long prefill stalls every decode
#   colocated, --chunk 256     one process, 2 threads: prefill in chunks that share steps
#   disaggregated              `serve --role prefill` (1 thread) and `serve --role decode
#                              --prefill ...` (1 thread, the HTTP front): the same 2 cores split
# Load (two `nanolm bench serve` side by side): Poisson arrivals of LONG_LEN-token prompts (1
# output token) at LONG_RATE/s (LONG_REQS requests), and DECODE_STREAMS closed-loop streams of
# 16-token prompts and DECODE_OUT output tokens that keep starting requests for as long as the
# long prompts keep arriving (LONG_REQS / LONG_RATE seconds; a fixed number of decode requests
# was over within a second on idle cores, before most long prompts came).
# Prints per setup the medians over REPS runs of: the decode streams' TTFT p50, TPOT p99 and ITL
# p99, the long prompts' TTFT p50, and the KV bytes moved per request (decode front's /metrics:
# nanolm_kv_transfer_bytes_total / nanolm_kv_transfers_total), beside the bytes
# 2 x layers x kv_heads x head_dim x 4 x prompt tokens predicts for the same requests.
# Not part of `make bench` (minutes). Usage: bench/serve/disagg.sh [BUILD]   (run it under nice
# on a shared machine and say so with the numbers).
set -euo pipefail
build=${1:-${NANOLM_BUILD:-build}}
root=$(cd "$(dirname "$0")/../.." && pwd)
tok="$root/data/stories260K/tok512.bin"
layers=${LAYERS:-8}
dim=${DIM:-512}
heads=${HEADS:-8}
kv_heads=${KV_HEADS:-8}
arch="{\"name\":\"rand-d$dim-l$layers\",\"vocab_size\":512,\"dim\":$dim,\"n_layers\":$layers,\"n_heads\":$heads,\"n_kv_heads\":$kv_heads,\"hidden_dim\":1408,\"seq_len\":2048}"
decode_streams=${DECODE_STREAMS:-8}
decode_out=${DECODE_OUT:-64}
long_len=${LONG_LEN:-512}
long_rate=${LONG_RATE:-2}
long_reqs=${LONG_REQS:-32}
reps=${REPS:-3}
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
num() { sed -n "s/.*\"$1\":[[:space:]]*\\([0-9.eE+-]*\\).*/\\1/p" "$2" | head -1; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
metric() { curl -s "$1/metrics" | awk -v k="$2" '$1 == k {print $2}'; }
# serve NAME THREADS ARGS...: starts a server, waits for its port file, sets $port
serve() {
  local name=$1 threads=$2
  shift 2
  rm -f "$tmp/$name.port"
  OMP_NUM_THREADS=$threads "$build/nanolm" serve --dummy-arch "$arch" --tokenizer "$tok" --port 0 \
    --port-file "$tmp/$name.port" --threads "$threads" --max-step-tokens 2048 --max-batch 16 "$@" 2>"$tmp/$name.log" &
  pids+=($!)
  for _ in $(seq 600); do [[ -s $tmp/$name.port ]] && break; sleep 0.1; done
  [[ -s $tmp/$name.port ]] || { echo "disagg.sh: $name did not start: $(cat "$tmp/$name.log")" >&2; exit 1; }
  port=$(cat "$tmp/$name.port")
}
stop_all() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null || true; done
  pids=()
}
per_token=$((2 * layers * kv_heads * (dim / heads) * 4))
span=$(awk -v n="$long_reqs" -v r="$long_rate" 'BEGIN{print n / r}')
echo "model $arch; load: $decode_streams streams x $decode_out tokens for $span s + $long_reqs prompts of $long_len tokens at $long_rate/s; medians of $reps runs"
printf '%-22s %12s %12s %12s %14s %16s %16s\n' setup "TTFT p50 ms" "TPOT p99 ms" "ITL p99 ms" "long TTFT ms" "KV bytes/req" "expected/req"
for setup in colocated-chunk0 colocated-chunk256 disaggregated; do
  : >"$tmp/rows"
  for _ in $(seq "$reps"); do
    case $setup in
      colocated-chunk0) serve colo 2 --chunk 0; url="http://127.0.0.1:$port" ;;
      colocated-chunk256) serve colo 2 --chunk 256; url="http://127.0.0.1:$port" ;;
      disaggregated)
        serve prefill 1 --role prefill --chunk 256
        serve decode 1 --role decode --prefill "127.0.0.1:$port"
        url="http://127.0.0.1:$port" ;;
    esac
    "$build/nanolm" bench serve --url "$url" --requests "$long_reqs" --rate "$long_rate" --concurrency 4 \
      --prompt-len "$long_len" --output-len 1 --seed 5 --json >"$tmp/long.json" &
    long=$!
    "$build/nanolm" bench serve --url "$url" --requests 1000000 --duration "$span" --concurrency "$decode_streams" \
      --prompt-len 16 --output-len "$decode_out" --seed 6 --json >"$tmp/dec.json"
    wait "$long"
    for f in long dec; do
      [[ $(num failed "$tmp/$f.json") == 0 ]] || { echo "disagg.sh: $setup: failed requests: $(cat "$tmp/$f.json")" >&2; exit 1; }
    done
    bytes=0
    expected=0
    if [[ $setup == disaggregated ]]; then # moved per request, and the formula for the requests this run made
      dec_reqs=$(num ok "$tmp/dec.json")
      total=$(metric "$url" nanolm_kv_transfer_bytes_total)
      want=$((per_token * (dec_reqs * 16 + long_reqs * long_len)))
      bytes=$(awk -v b="$total" -v n="$(metric "$url" nanolm_kv_transfers_total)" 'BEGIN{print b / n}')
      expected=$(awk -v w="$want" -v n="$((dec_reqs + long_reqs))" 'BEGIN{print w / n}')
      [[ $total == "$want" ]] || echo "disagg.sh: KV bytes moved $total, the formula gives $want" >&2
    fi
    echo "$(num ttft_p50_ms "$tmp/dec.json") $(num tpot_p99_ms "$tmp/dec.json") $(num itl_p99_ms "$tmp/dec.json") $(num ttft_p50_ms "$tmp/long.json") $bytes $expected" >>"$tmp/rows"
    stop_all
  done
  col() { awk -v c="$1" '{print $c}' "$tmp/rows" | median; }
  printf '%-22s %12.1f %12.2f %12.2f %14.1f %16.0f %16.0f\n' "$setup" "$(col 1)" "$(col 2)" "$(col 3)" "$(col 4)" "$(col 5)" "$(col 6)"
done
