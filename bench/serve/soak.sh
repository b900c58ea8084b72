#!/usr/bin/env bash
# Soak run of `nanolm serve` (not part of `make bench`: minutes long): REQUESTS requests (default
# 2000) at concurrency CONC (default 64) with random prompt (8..256 tokens) and output (8..128)
# lengths on stories260K; a share DISCONNECT (default 0.1) of the clients close their connection
# mid-stream, after a random number of tokens; DURATION (seconds, default 0: none) stops starting
# requests after that long. Passes when no request failed, the KV pool is back to 0 blocks used
# with nothing running or waiting, /health answers 200, and the server's resident memory after
# the run is within 10% (+ 8 MiB) of what it was halfway through (a leak grows steadily; the
# allocator's arenas and the thread stacks plateau, and a loaded machine reaches that plateau
# later than one warm-up wave: 19 -> 57 MiB at concurrency 16 with or without disconnects).
# Usage: bench/serve/soak.sh [BUILD]
set -euo pipefail
build=${1:-${NANOLM_BUILD:-build}}
root=$(cd "$(dirname "$0")/../.." && pwd)
data="$root/data/stories260K"
requests=${REQUESTS:-2000}
conc=${CONC:-64}
disconnect=${DISCONNECT:-0.1}
duration=${DURATION:-0}
tmp=$(mktemp -d)
pid=
cleanup() { [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
OMP_NUM_THREADS=2 "$build/nanolm" serve --ckpt "$data/stories260K.bin" --tokenizer "$data/tok512.bin" --port 0 \
  --port-file "$tmp/port" --max-batch 64 --max-waiting 512 2>"$tmp/log" &
pid=$!
for _ in $(seq 600); do [[ -s $tmp/port ]] && break; sleep 0.1; done
url="http://127.0.0.1:$(cat "$tmp/port")"
rss() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
metric() { curl -s "$url/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
load() {
  "$build/nanolm" bench serve --url "$url" --requests "$1" --concurrency "$conc" --prompt-len 8 --prompt-len-max 256 \
    --output-len 8 --output-len-max 128 --temperature 1 --seed "$2" --disconnect "$disconnect" \
    --duration "$3" --json
}
field() { sed -n "s/.*\"$1\":[[:space:]]*\([0-9.eE+-]*\).*/\1/p" "$tmp/soak.json"; }
echo "soak: warm-up ($conc requests)"
load "$conc" 7 0 >"$tmp/warm.json"
rss0=$(rss)
echo "soak: $requests requests at concurrency $conc, $disconnect of them leaving mid-stream," \
     "${duration} s at most (0: no limit) (RSS after warm-up ${rss0} KiB)"
start=$(date +%s)
# resident memory every second during the run, to tell a leak (steady growth) from a plateau
( while kill -0 "$pid" 2>/dev/null; do rss >>"$tmp/rss" 2>/dev/null || break; sleep 1; done ) &
sampler=$!
load "$requests" 11 "$duration" >"$tmp/soak.json" || true
kill "$sampler" 2>/dev/null || true
wait "$sampler" 2>/dev/null || true
[[ -n ${SOAK_JSON:-} ]] && cp "$tmp/soak.json" "$SOAK_JSON"
end=$(date +%s)
rss1=$(rss)
sent=$(field requests)
failed=$(field failed)
ok=$(field ok)
left=$(field disconnected)
tps=$(field output_tokens_per_s)
for _ in $(seq 50); do # the requests of clients that left are cancelled within a few steps
  used=$(metric nanolm_kv_blocks_used)
  running=$(metric nanolm_requests_running)
  waiting=$(metric nanolm_requests_waiting)
  [[ $used == 0 && $running == 0 && $waiting == 0 ]] && break
  sleep 0.2
done
aborted=$(curl -s "$url/metrics" | awk '$1 == "nanolm_requests_total{outcome=\"aborted\"}" {print $2}')
health=$(curl -s -o /dev/null -w '%{http_code}' "$url/health")
echo "soak: $sent requests: $ok ok, ${left:-0} left mid-stream, $failed failed in $((end - start)) s" \
     "($tps output tokens/s); server: $aborted aborted; KV blocks used $used, running $running, waiting $waiting;" \
     "/health $health; RSS ${rss0} -> ${rss1} KiB"
awk '{v[NR] = $1} END {if (NR < 4) exit; printf "soak: RSS during the run (KiB) at 25%% %d, 50%% %d, 75%% %d, 100%% %d of %d samples\n",
     v[int(NR / 4)], v[int(NR / 2)], v[int(3 * NR / 4)], v[NR], NR}' "$tmp/rss"
if [[ $failed == 0 && $used == 0 && $running == 0 && $waiting == 0 && $health == 200 ]] &&
   awk -v b="$rss1" '{v[NR] = $1} END {exit !(NR >= 2 && b <= v[int(NR / 2)] * 1.10 + 8192)}' "$tmp/rss"; then
  echo "soak: PASS"
else
  echo "soak: FAIL"
  exit 1
fi
