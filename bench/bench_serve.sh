#!/usr/bin/env bash
# Serving throughput against concurrency, measured in one run: `nanolm serve` with random weights
# of the issue's 85M shape (dim 768, 12 layers, 12 heads, hidden 2048, vocab 512, seq_len 1024),
# fp32, 2 threads, and `nanolm bench serve` closed-loop at 1, 8 and 32 concurrent streams.
# Prints output tokens/s per concurrency and the ratio to one stream (targets: 8 streams >= 5x,
# 32 >= 8x). SERVE_BENCH_OUT (tokens per request, default 64) and SERVE_BENCH_ROUNDS (requests
# per stream, default 2) size the run; SERVE_BENCH_ARCH overrides the shape (JSON).
set -euo pipefail
build=${NANOLM_BUILD:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$build/nanolm"
tok="$root/data/stories260K/tok512.bin"
[[ -f $tok ]] || tok="$root/data/stories260K/tok512.bin"
[[ -f $tok ]] || { echo "bench_serve: needs tok512.bin (data/stories260K)"; exit 0; }
arch=${SERVE_BENCH_ARCH:-'{"name":"rand85M","vocab_size":512,"dim":768,"n_layers":12,"n_heads":12,"n_kv_heads":12,"hidden_dim":2048,"seq_len":1024}'}
out=${SERVE_BENCH_OUT:-64}
rounds=${SERVE_BENCH_ROUNDS:-2}
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
printf '%-12s %10s %14s %12s %12s %12s %8s\n' streams requests "out tok/s" "TTFT p50 ms" "TPOT p50 ms" "ITL p99 ms" ratio
base=
for c in 1 8 32; do
  n=$((c * rounds))
  "$bin" bench serve --url "http://127.0.0.1:$port" --requests "$n" --concurrency "$c" --prompt-len 16 \
    --output-len "$out" --json >"$tmp/r$c.json"
  tps=$(sed -n 's/.*"output_tokens_per_s":[[:space:]]*\([0-9.eE+-]*\).*/\1/p' "$tmp/r$c.json")
  ttft=$(sed -n 's/.*"ttft_p50_ms":[[:space:]]*\([0-9.eE+-]*\).*/\1/p' "$tmp/r$c.json")
  tpot=$(sed -n 's/.*"tpot_p50_ms":[[:space:]]*\([0-9.eE+-]*\).*/\1/p' "$tmp/r$c.json")
  itl=$(sed -n 's/.*"itl_p99_ms":[[:space:]]*\([0-9.eE+-]*\).*/\1/p' "$tmp/r$c.json")
  [[ -z $base ]] && base=$tps
  printf '%-12s %10s %14.1f %12.1f %12.2f %12.2f %7.2fx\n' "$c" "$n" "$tps" "$ttft" "$tpot" "$itl" \
    "$(awk -v a="$tps" -v b="$base" 'BEGIN{print a/b}')"
done
