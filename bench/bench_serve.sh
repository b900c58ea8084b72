#!/usr/bin/env bash
# Serving throughput against concurrency, measured in one run: `nanolm serve` with random weights
# of the issue's 85M shape (dim 768, 12 layers, 12 heads, hidden 2048, vocab 512, seq_len 1024),
# fp32, 2 threads, and `nanolm bench serve` closed-loop at 1, 8 and 32 concurrent streams.
# As bench_decode's streams: one untimed pass at 32 streams first pages in the server's KV pool
# (a serving engine's steady state), then three rounds each run 1, 8 and 32 streams back to back,
# so that a round's ratios compare runs made seconds apart on a machine whose speed drifts. Prints
# every round, then the median output tokens/s per concurrency and the median of the rounds'
# ratios to one stream (targets: 8 streams >= 5x, 32 >= 8x). SERVE_BENCH_OUT (tokens per request,
# default 64), SERVE_BENCH_REQS (requests per stream, default 2) and SERVE_BENCH_ROUNDS (default
# 3) size the run; SERVE_BENCH_ARCH overrides the shape (JSON).
set -euo pipefail
build=${NANOLM_BUILD:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$build/nanolm"
tok="$root/data/stories260K/tok512.bin"
[[ -f $tok ]] || tok="$root/data/stories260K/tok512.bin"
[[ -f $tok ]] || { echo "bench_serve: needs tok512.bin (data/stories260K)"; exit 0; }
arch=${SERVE_BENCH_ARCH:-'{"name":"rand85M","vocab_size":512,"dim":768,"n_layers":12,"n_heads":12,"n_kv_heads":12,"hidden_dim":2048,"seq_len":1024}'}
out=${SERVE_BENCH_OUT:-64}
reqs=${SERVE_BENCH_REQS:-2}
rounds=${SERVE_BENCH_ROUNDS:-3}
tmp=$(mktemp -d)
pid=
cleanup() { [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
OMP_NUM_THREADS=2 "$bin" serve --dummy-arch "$arch" --tokenizer "$tok" --port 0 --port-file "$tmp/port" \
  --max-batch 32 --threads 2 2>"$tmp/log" &
pid=$!
for _ in $(seq 600); do [[ -s $tmp/port ]] && break; kill -0 "$pid" || { cat "$tmp/log"; exit 1; }; sleep 0.1; done
port=$(cat "$tmp/port")
echo "bench_serve: $(head -1 "$tmp/log" | sed 's/^serve: //')"
# one closed-loop run at concurrency $1, $2 requests; leaves its JSON in $tmp/r.json
load() {
  "$bin" bench serve --url "http://127.0.0.1:$port" --requests "$2" --concurrency "$1" --prompt-len 16 \
    --output-len "$out" --json >"$tmp/r.json"
}
field() { sed -n "s/.*\"$1\":[[:space:]]*\([0-9.eE+-]*\).*/\1/p" "$tmp/r.json"; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END{print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
load 32 32 # untimed: pages in the KV blocks that 32 streams use
printf '%-6s %-8s %10s %14s %12s %12s %12s %8s\n' round streams requests "out tok/s" "TTFT p50 ms" "TPOT p50 ms" \
  "ITL p99 ms" ratio
declare -A tps_of ratio_of
for r in $(seq "$rounds"); do
  base=
  for c in 1 8 32; do
    n=$((c * reqs))
    load "$c" "$n"
    tps=$(field output_tokens_per_s)
    [[ -z $base ]] && base=$tps
    ratio=$(awk -v a="$tps" -v b="$base" 'BEGIN{print a/b}')
    tps_of[$c]+="$tps "
    ratio_of[$c]+="$ratio "
    printf '%-6s %-8s %10s %14.1f %12.1f %12.2f %12.2f %7.2fx\n' "$r" "$c" "$n" "$tps" "$(field ttft_p50_ms)" \
      "$(field tpot_p50_ms)" "$(field itl_p99_ms)" "$ratio"
  done
done
echo "medians over $rounds rounds:"
printf '%-8s %14s %12s %8s\n' streams "out tok/s" "x one" target
for c in 1 8 32; do
  t=$(echo "${tps_of[$c]}" | median)
  x=$(echo "${ratio_of[$c]}" | median)
  target=$([[ $c == 8 ]] && echo 5 || { [[ $c == 32 ]] && echo 8 || echo 1; })
  printf '%-8s %14.1f %11.2fx %7sx%s\n' "$c" "$t" "$x" "$target" \
    "$(awk -v x="$x" -v t="$target" 'BEGIN{if (x < t) print "  (below target)"}')"
done
