#!/usr/bin/env bash
# Prefix caching, measured in one run: two `nanolm serve` processes with the same random weights
# (default shape: dim 384, 6 layers, 6 heads, hidden 1024, vocab 512, seq_len 1024; fp32, 2
# threads), one with prefix caching (the default) and one with --no-prefix-cache, loaded by
# `nanolm bench serve` closed-loop with C clients whose prompts all start with the same 512-token
# system prompt followed by 32 tokens of their own, 32 output tokens each. Every pass draws its
# own prompts (a seed of its own, the same for both servers within a round): only the system
# prompt is shared, never a whole prompt that an earlier pass computed. One untimed pass per
# server first (the cached one computes the system prompt there); then rounds alternate the two
# servers, so that each round's ratio compares runs made seconds apart on a machine whose speed
# drifts. Prints every round, then the medians: TTFT p50 cached / uncached (target <= 0.25) and
# output tokens/s cached / uncached (target >= 1.5). PREFIX_BENCH_CLIENTS (default 16),
# PREFIX_BENCH_REQS (requests per client, default 2), PREFIX_BENCH_ROUNDS (default 3) and
# PREFIX_BENCH_ARCH (JSON) size the run.
set -euo pipefail
build=${NANOLM_BUILD:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$build/nanolm"
tok="$root/data/stories260K/tok512.bin"
[[ -f $tok ]] || { echo "bench_prefix_cache: needs tok512.bin (data/stories260K)"; exit 0; }
arch=${PREFIX_BENCH_ARCH:-'{"name":"rand11M","vocab_size":512,"dim":384,"n_layers":6,"n_heads":6,"n_kv_heads":6,"hidden_dim":1024,"seq_len":1024}'}
clients=${PREFIX_BENCH_CLIENTS:-16}
reqs=${PREFIX_BENCH_REQS:-2}
rounds=${PREFIX_BENCH_ROUNDS:-3}
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
start() { # $1: name, then serve options
  local name=$1
  shift
  OMP_NUM_THREADS=2 "$bin" serve --dummy-arch "$arch" --tokenizer "$tok" --port 0 --port-file "$tmp/$name.port" \
    --max-batch 32 --threads 2 "$@" 2>"$tmp/$name.log" &
  pids+=($!)
  for _ in $(seq 600); do [[ -s $tmp/$name.port ]] && break; kill -0 "${pids[-1]}" || { cat "$tmp/$name.log"; exit 1; }; sleep 0.1; done
}
start on
start off --no-prefix-cache
# one closed-loop run against server $1, $2 requests, prompts of seed $3; leaves its JSON in $tmp/r.json
load() {
  "$bin" bench serve --url "http://127.0.0.1:$(cat "$tmp/$1.port")" --requests "$2" --concurrency "$clients" \
    --shared-prefix 512 --prompt-len 32 --output-len 32 --seed "$3" --json >"$tmp/r.json"
}
field() { sed -n "s/.*\"$1\":[[:space:]]*\([0-9.eE+-]*\).*/\1/p" "$tmp/r.json" | head -1; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END{print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
echo "bench_prefix_cache: $clients clients, 512-token shared system prompt + 32 own tokens, 32 output tokens, $reqs requests per client"
load on "$clients" 1  # untimed: pages in the pools; the cached server computes the system prompt
load off "$clients" 1
printf '%-6s %-8s %14s %12s %12s\n' round cache "out tok/s" "TTFT p50 ms" "TPOT p50 ms"
declare -A ttft tps
ttft_x= tps_x=
n=$((clients * reqs))
for r in $(seq "$rounds"); do
  for s in on off; do
    load "$s" "$n" $((100 + r))
    ttft[$s]=$(field ttft_p50_ms)
    tps[$s]=$(field output_tokens_per_s)
    printf '%-6s %-8s %14.1f %12.1f %12.2f\n' "$r" "$s" "${tps[$s]}" "${ttft[$s]}" "$(field tpot_p50_ms)"
  done
  ttft_x+="$(awk -v a="${ttft[on]}" -v b="${ttft[off]}" 'BEGIN{print a/b}') "
  tps_x+="$(awk -v a="${tps[on]}" -v b="${tps[off]}" 'BEGIN{print a/b}') "
done
hit=$(curl -s "http://127.0.0.1:$(cat "$tmp/on.port")/metrics" 2>/dev/null | sed -n 's/^nanolm_prefix_cache_hit_rate //p' || true)
echo "medians over $rounds rounds (cached / uncached, each round's ratio):"
printf '  TTFT p50     %.3fx  (target <= 0.25)\n' "$(echo "$ttft_x" | median)"
printf '  output tok/s %.2fx  (target >= 1.5)\n' "$(echo "$tps_x" | median)"
[[ -n $hit ]] && printf '  prefix cache hit rate (tokens, /metrics of the cached server): %.3f\n' "$hit"
exit 0
