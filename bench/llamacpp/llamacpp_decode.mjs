// Greedy decode of a GGUF file with llama.cpp (node-llama-cpp's prebuilt CPU libraries), from
// given token ids: prints one JSON line {tokens, decode_tok_s, threads}. Decode time runs from
// the first generated token to the last (prompt prefill and model load excluded), as
// bench_llamacpp.sh times nanolm.
// Usage: node llamacpp_decode.mjs MODEL.gguf THREADS N_NEW ID,ID,...
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [model_path, threads_s, n_s, ids_s] = process.argv.slice(2);
const threads = Number(threads_s), n_new = Number(n_s);
const prompt = ids_s.split(",").map(Number);
const llama = await getLlama({gpu: false, build: "never", maxThreads: threads, logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath: model_path, gpuLayers: 0});
const ctx = await model.createContext({contextSize: prompt.length + n_new + 8, threads: {ideal: threads, min: threads},
                                       batchSize: 512, sequences: 1});
const seq = ctx.getSequence();
const out = [];
let t0 = 0, t1 = 0;
for await (const tok of seq.evaluate(prompt, {temperature: 0})) {
    const now = performance.now();
    if (out.length === 0) t0 = now;
    t1 = now;
    out.push(tok);
    if (out.length >= n_new) break;
}
const rate = out.length > 1 ? (out.length - 1) / ((t1 - t0) / 1000) : 0;
console.log(JSON.stringify({tokens: out, decode_tok_s: rate, threads, gpu: llama.gpu, cpu: llama.cpuMathCores}));
await ctx.dispose();
await model.dispose();
await llama.dispose();
