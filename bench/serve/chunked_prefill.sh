#!/usr/bin/env bash
# The long-prompt experiment (Sarathi-Serve's point): 8 streams decode while prompts of 1024
# tokens keep arriving. Without chunking a long prompt's prefill runs in one step and every
# decoding stream waits for it (an inter-token latency spike); with --chunk 128 or 256 the
# prefill is spread over steps that also carry the decodes. For each chunk setting the server is
# started afresh, and two loads run side by side: a closed-loop decode load (8 streams, 16-token
# prompts, DECODE_OUT output tokens, DECODE_REQS requests) and Poisson arrivals of 1024-token
# prompts (1 output token) at LONG_RATE/s. Prints the decode streams' ITL p99 and the
# throughput (prompt + generated tokens the engine ran, from /metrics, per second from the start
# of the loads to the end of both) per setting, and the ratios to no chunking. Not part of `make bench` (bench/serve/ is not globbed) (a few minutes); usage: bench/serve/chunked_prefill.sh [BUILD]
set -euo pipefail
build=${1:-${NANOLM_BUILD:-build}}
root=$(cd "$(dirname "$0")/../.." && pwd)
tok="$root/data/stories260K/tok512.bin"
arch=${ARCH:-'{"name":"rand-d512-l8","vocab_size":512,"dim":512,"n_layers":8,"n_heads":8,"n_kv_heads":8,"hidden_dim":1408,"seq_len":2048}'}
decode_out=${DECODE_OUT:-128}
decode_reqs=${DECODE_REQS:-16}
long_rate=${LONG_RATE:-0.5}
long_reqs=${LONG_REQS:-12}
tmp=$(mktemp -d)
pid=
cleanup() { [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
num() { sed -n "s/.*\"$1\":[[:space:]]*\\([0-9.eE+-]*\\).*/\\1/p" "$2" | head -1; }
printf '%-8s %14s %14s %16s %12s %12s\n' chunk "ITL p99 ms" "ITL p50 ms" "total tok/s" "ITL ratio" "tput ratio"
base_itl=
base_tps=
for chunk in 0 256 128; do
  rm -f "$tmp/port"
  OMP_NUM_THREADS=2 "$build/nanolm" serve --dummy-arch "$arch" --tokenizer "$tok" --port 0 --port-file "$tmp/port" \
    --chunk "$chunk" --max-step-tokens 2048 --max-batch 16 --threads 2 2>"$tmp/log" &
  pid=$!
  for _ in $(seq 600); do [[ -s $tmp/port ]] && break; sleep 0.1; done
  url="http://127.0.0.1:$(cat "$tmp/port")"
  t0=$(date +%s.%N)
  "$build/nanolm" bench serve --url "$url" --requests "$long_reqs" --rate "$long_rate" --concurrency 4 \
    --prompt-len 1024 --output-len 1 --seed 5 --json >"$tmp/long.json" &
  long=$!
  "$build/nanolm" bench serve --url "$url" --requests "$decode_reqs" --concurrency 8 --prompt-len 16 \
    --output-len "$decode_out" --seed 6 --json >"$tmp/dec.json"
  wait "$long"
  t1=$(date +%s.%N)
  done_tokens=$(curl -s "$url/metrics" | awk '$1 == "nanolm_prompt_tokens_total" || $1 == "nanolm_generation_tokens_total" {s += $2} END {print s}')
  kill -TERM "$pid"; wait "$pid" || true; pid=
  itl=$(num itl_p99_ms "$tmp/dec.json")
  itl50=$(num itl_p50_ms "$tmp/dec.json")
  tps=$(awk -v n="$done_tokens" -v a="$t0" -v b="$t1" 'BEGIN{print n / (b - a)}') # prompt + generated tokens the engine ran per second of the experiment
  [[ -z $base_itl ]] && base_itl=$itl && base_tps=$tps
  printf '%-8s %14.1f %14.1f %16.1f %12.3f %12.3f\n' "$chunk" "$itl" "$itl50" "$tps" \
    "$(awk -v a="$itl" -v b="$base_itl" 'BEGIN{print a/b}')" "$(awk -v a="$tps" -v b="$base_tps" 'BEGIN{print a/b}')"
done
