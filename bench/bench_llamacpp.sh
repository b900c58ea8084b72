#!/usr/bin/env bash
# nanolm against llama.cpp on the same weights, in the same run (issue 32, part 3).
#
# llama.cpp: the prebuilt CPU libraries of the npm package node-llama-cpp, pinned to 3.21.1 in
# bench/llamacpp/package.json (installed there on first use; it picks the CPU variant itself).
# Weights: nanolm's GGUF writer makes the files both engines read: the 85M-parameter random model
# of bench_decode (bench_gguf make85m) and stories260K (nanolm export --to gguf), each as f32, f16,
# q8_0 and q4_0. llama.cpp decodes the file of each type (f32, f16, q8_0, q4_0); nanolm decodes
# with its weight format (fp32, bf16, int8, int4) the f32 file for fp32 and bf16, the q8_0 file
# for int8 (dequantized, then nanolm's per-row int8), and the q4_0 file for int4 (its blocks are
# nanolm's int4 groups: exactly llama.cpp's weights).
# Measured: greedy decode of N new tokens after the same prompt ids; tokens/s from the first
# generated token to the last (prompt prefill and model load excluded), at 1 and 2 threads, in
# ROUNDS rounds that alternate which engine runs first; medians over the rounds, and their ratio.
# Greedy tokens are compared for fp32/f32 (the other pairs round the weights differently).
# Usage: bench/bench_llamacpp.sh  (env: NANOLM_BUILD=build, ROUNDS=3, N85=32, NSTORIES=200 new tokens
# at 1 thread; N85_2=8, NSTORIES_2=32 at 2 threads, where on a 2-core machine shared with other
# work both engines' spinning threads wait for descheduled peers and decode can run 10-100x slower)
# Without node/npm, or when the package cannot be installed, it says so and exits 0.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${NANOLM_BUILD:-build}
[[ $build = /* ]] || build="$root/$build"
rounds=${ROUNDS:-3}
n85=${N85:-32}
nst=${NSTORIES:-200}
n85_2=${N85_2:-8}
nst_2=${NSTORIES_2:-32}
pkg="$root/bench/llamacpp"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "bench_llamacpp: skipped: needs node and npm (scripts/setup-deps.sh node)"
  exit 0
fi
if [[ ! -d $pkg/node_modules/node-llama-cpp ]]; then
  echo "bench_llamacpp: installing node-llama-cpp 3.21.1 into bench/llamacpp/node_modules" >&2
  if ! (cd "$pkg" && npm install --no-audit --no-fund --no-package-lock >&2); then
    echo "bench_llamacpp: skipped: npm install of node-llama-cpp failed"
    exit 0
  fi
fi
for b in bench_gguf nanolm; do
  [[ -x $build/$b ]] || { echo "bench_llamacpp: $build/$b is missing (cmake --build $build)" >&2; exit 1; }
done
stories="$root/data/stories260K"
dir="$build/llamacpp"
mkdir -p "$dir"
[[ -f $dir/m85-q4_0.gguf ]] || "$build/bench_gguf" make85m "$dir" >/dev/null || exit 1
for t in f32 f16 q8_0 q4_0; do
  [[ -f $dir/s260-$t.gguf ]] || "$build/nanolm" export --ckpt "$stories/stories260K.bin" \
    --tokenizer "$stories/tok512.bin" --to gguf --dtype "$t" "$dir/s260-$t.gguf" >/dev/null || exit 1
done
p85=$(python3 -c 'print(",".join(str((j * 7) % 512) for j in range(16)))')
pst=$(OMP_NUM_THREADS=1 "$build/bench_gguf" decode "$dir/s260-f32.gguf" 1 1 fp32 "text:Once upon a time" |
  python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["prompt"])))')
cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)
echo "bench_llamacpp: $cpu, $(nproc) cores; $rounds rounds; new tokens at 1 / 2 threads: 85M $n85 / $n85_2, stories260K $nst / $nst_2"
res="$dir/results.jsonl"
: >"$res"
run_nanolm() { # model format threads n prompt file-type
  local out
  out=$(OMP_WAIT_POLICY=active OMP_NUM_THREADS=$3 "$build/bench_gguf" decode "$dir/$1-$6.gguf" "$3" "$4" "$2" "$5") ||
    return 1
  echo "{\"engine\": \"nanolm\", \"model\": \"$1\", \"fmt\": \"$2\", \"threads\": $3, \"r\": $out}" >>"$res"
}
run_llama() { # model type threads n prompt
  local out
  out=$(node "$pkg/llamacpp_decode.mjs" "$dir/$1-$2.gguf" "$3" "$4" "$5" 2>/dev/null | tail -1) || return 1
  echo "{\"engine\": \"llama.cpp\", \"model\": \"$1\", \"fmt\": \"$2\", \"threads\": $3, \"r\": $out}" >>"$res"
}
pairs=("fp32 f32" "bf16 f16" "int8 q8_0" "int4 q4_0")
for ((r = 1; r <= rounds; r++)); do
  for model in m85 s260; do
    for pr in "${pairs[@]}"; do
      read -r nf lf <<<"$pr"
      file=f32
      [[ $nf = int8 || $nf = int4 ]] && file=$lf
      for th in 1 2; do
        if [[ $model = m85 ]]; then p=$p85 n=$n85; ((th == 1)) || n=$n85_2; else p=$pst n=$nst; ((th == 1)) || n=$nst_2; fi
        if ((r % 2)); then
          run_nanolm $model "$nf" $th $n "$p" "$file" && run_llama $model "$lf" $th $n "$p"
        else
          run_llama $model "$lf" $th $n "$p" && run_nanolm $model "$nf" $th $n "$p" "$file"
        fi || { echo "bench_llamacpp: a run failed ($model $pr, $th threads)" >&2; exit 1; }
      done
    done
  done
  echo "bench_llamacpp: round $r done" >&2
done
python3 - "$res" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
pairs = [("fp32", "f32"), ("bf16", "f16"), ("int8", "q8_0"), ("int4", "q4_0")]
names = {"m85": "85M random", "s260": "stories260K"}
print("| model | nanolm / llama.cpp | threads | nanolm tok/s | llama.cpp tok/s | ratio | greedy tokens |")
print("|---|---|---|---|---|---|---|")
rounds = len([x for x in rows if x["model"] == "m85" and x["threads"] == 1 and x["engine"] == "nanolm" and x["fmt"] == "fp32"])
for model in ("m85", "s260"):
    for nf, lf in pairs:
        for th in (1, 2):
            a = [x for x in rows if x["model"] == model and x["threads"] == th and x["engine"] == "nanolm" and x["fmt"] == nf]
            b = [x for x in rows if x["model"] == model and x["threads"] == th and x["engine"] == "llama.cpp" and x["fmt"] == lf]
            ma = statistics.median(x["r"]["decode_tok_s"] for x in a)
            mb = statistics.median(x["r"]["decode_tok_s"] for x in b)
            ta, tb = a[0]["r"]["tokens"], b[0]["r"]["tokens"]
            same = next((i for i, (u, v) in enumerate(zip(ta, tb)) if u != v), None)
            agree = "%d/%d equal" % (len(ta), len(ta)) if same is None and len(ta) == len(tb) else "differ at %s" % same
            if nf in ("bf16", "int8"):
                agree += " (weights rounded differently)"
            elif nf == "int4":
                agree += " (same weights; activations rounded differently)"
            print("| %s | %s / %s | %d | %.1f | %.1f | %.2fx | %s |" % (names[model], nf, lf, th, ma, mb, ma / mb, agree))
print("medians of %d rounds; each round's ratios:" % rounds)
for model in ("m85", "s260"):
    for nf, lf in pairs:
        for th in (1, 2):
            a = [x["r"]["decode_tok_s"] for x in rows if x["model"] == model and x["threads"] == th and x["engine"] == "nanolm" and x["fmt"] == nf]
            b = [x["r"]["decode_tok_s"] for x in rows if x["model"] == model and x["threads"] == th and x["engine"] == "llama.cpp" and x["fmt"] == lf]
            print("  %s %s/%s %dt: %s" % (names[model], nf, lf, th, " ".join("%.2f" % (u / v) for u, v in zip(a, b))))
PY
