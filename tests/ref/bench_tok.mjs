// Times JavaScript tokenizers on one text for bench/bench_tokenizer.c (run from the project root):
//   node tests/ref/bench_tok.mjs TOKENIZER_JSON TEXT_FILE REPS
// Prints one line per implementation: "name tokens median_seconds".
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, "tok", "package.json"));
const [tokPath, textPath, repsArg] = process.argv.slice(2);
const text = readFileSync(textPath, "utf8");
const reps = Number(repsArg || 5);
function time(name, fn) {
  let n = fn(); // warm-up (and the token count)
  const t = [];
  for (let i = 0; i < reps; i++) {
    const t0 = process.hrtime.bigint();
    n = fn();
    t.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  t.sort((a, b) => a - b);
  console.log(`${name} ${n} ${t[Math.floor(t.length / 2)]}`);
}
const { getEncoding } = require("js-tiktoken");
const tk = getEncoding("gpt2");
time("js-tiktoken", () => tk.encode(text, "all").length);
const { Tokenizer } = await import(join(here, "tok/node_modules/@huggingface/tokenizers/dist/tokenizers.mjs"));
const hf = new Tokenizer(JSON.parse(readFileSync(tokPath, "utf8")), {});
time("@huggingface/tokenizers", () => hf.encode(text, { add_special_tokens: false }).ids.length);
const gpt = await import(join(here, "tok/node_modules/gpt-tokenizer/esm/encoding/gpt2.js"));
time("gpt-tokenizer", () => gpt.encode(text, { allowedSpecial: "all" }).length);
