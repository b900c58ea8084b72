// Makes tests/ref/tok_fixture.json: token ids (as a 32-bit FNV-1a hash per text) that
// independent JavaScript tokenizers give for ~11,000 texts, for tests/test_tokenizer_json.c.
//
//   cd tests/ref/tok && npm install && cd ../../.. && node tests/ref/make_tok_fixture.mjs build/nanolm
//
// References: js-tiktoken's own GPT-2 ranks ("gpt2"), and @huggingface/tokenizers (tokenizers.js,
// the Hugging Face port of the Rust library) on tokenizer.json files built from GPT-2's
// encoder.json + vocab.bpe (../shared/data/gpt2) with GPT-2's, Llama 3's and Qwen2's
// pre-tokenizers, and on the SentencePiece-style tokenizer.json that `nanolm export` writes
// for stories260K's tok512.bin. Texts: the synthetic ones below (committed in the fixture), then
// non-empty lines of ../shared/data corpora (read at test time, never committed).
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, "tok", "package.json"));
const { Tokenizer } = await import(join(here, "tok/node_modules/@huggingface/tokenizers/dist/tokenizers.mjs"));
const { getEncoding } = require("js-tiktoken");
const nanolm = process.argv[2] || "build/nanolm";
const data = join(here, "../../../shared/data");

// ---- texts ----------------------------------------------------------------------------------
let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) >>> 8) / 16777216;
const pick = (a) => a[Math.floor(rand() * a.length)];
const fragments = [
  "Hello", "world", "naïve café", "Ünïcödé", "東京都", "日本語のテキスト", "中文分词测试", "한국어 문장",
  "Привет, мир", "Ελληνικά", "العربية", "עברית", "हिन्दी भाषा", "ภาษาไทย", "Tiếng Việt",
  "e\u0301", "A\u030A", "\u1100\u1161\u11A8", "ﬁ ligature", "Ω≈ç√∫", "🙂", "🚀🚀🚀", "👨‍👩‍👧‍👦",
  "🇫🇷🇯🇵", "👍🏽", "❤️", "🏳️‍🌈", "∑x²", "1234567890", "3.14159", "1,000,000", "２０２４", "٣٤٥",
  "0x1F", "1e-9", "42nd", "v2.0.1", "I'M", "you'LL", "it's", "we've", "they'd", "DON'T", "'s", "''",
  "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2003", "\u200b",
  "<|endoftext|>", "<s>", "</s>", "<unk>", "<0x41>", "Ġ", "▁", "snake_case", "camelCase", "URL: https://x.org/a?b=1",
  "e-mail@example.com", "#hashtag", "@user", "$100.00", "50%", "C++", "a->b", "x==y", "(parens)",
  "[brackets]", "{braces}", "\"quoted\"", "«guillemets»", "—dash—", "…", "¿Qué?", "¡Hola!",
];
const synthetic = [];
for (const f of fragments) synthetic.push(f, " " + f, f + " ", f + f);
for (let i = 0; i < 700; i++) {
  let s = "";
  const n = 1 + Math.floor(rand() * 8);
  for (let k = 0; k < n; k++) s += pick(fragments) + pick(["", " ", "", "  ", "\n", ", ", ".", "\t", ""]);
  synthetic.push(s);
}
for (let n = 1; n <= 40; n++) synthetic.push(" ".repeat(n) + "x" + " ".repeat(n), "\n".repeat(n % 7 + 1) + " ".repeat(n), "9".repeat(n));

function nonEmptyLines(path, max) {
  let lines;
  try { lines = readFileSync(path, "utf8").split("\n").filter((l) => l.length > 0); } catch { return null; }
  return max ? lines.slice(0, max) : lines;
}
const sources = [
  { file: "tinyshakespeare/input.txt", max: 8000 },
  { file: "tinystories/tinystories_head.txt", max: 0 },
  { file: "bpe-train/corpus.en", max: 0 },
];
const texts = [...synthetic];
for (const s of sources) {
  const l = nonEmptyLines(join(data, s.file), s.max);
  if (!l) throw new Error(`missing ../shared/data/${s.file}`);
  s.count = l.length;
  texts.push(...l);
}
const sample = readFileSync(join(data, "tinystories/tinystories_sample.txt"), "utf8");
sources.push({ file: "tinystories/tinystories_sample.txt", whole: true, count: 1 });
texts.push(sample);

// ---- tokenizers -----------------------------------------------------------------------------
const GPT2_SPLIT = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const LLAMA3_SPLIT =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_SPLIT =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// DeepSeek-V3's tokenizer.json: three Splits in sequence (digit runs of 1-3, CJK / kana runs, then
// its word regex; the class [^\r\n...] holds a literal CR and LF, as published), then ByteLevel.
const DEEPSEEK3_SPLITS = [
  "\\p{N}{1,3}",
  "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
  "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];
const byteLevel = (useRegex) => ({ type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: useRegex });
const split = (re, behavior = "Isolated", invert = false) => ({ type: "Split", pattern: { Regex: re }, behavior, invert });
const splitString = (str, behavior) => ({ type: "Split", pattern: { String: str }, behavior, invert: false });
const eot = { id: 50256, content: "<|endoftext|>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true };
// Everything but model.vocab / model.merges, which the test fills from ../shared/data/gpt2.
const gpt2Header = (normalizer, pre, ignoreMerges) => ({
  version: "1.0", truncation: null, padding: null, added_tokens: [eot], normalizer, pre_tokenizer: pre,
  post_processor: null, decoder: byteLevel(true),
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
           fuse_unk: false, byte_fallback: false, ignore_merges: ignoreMerges },
});
const headers = {
  "gpt2-hf": gpt2Header(null, byteLevel(true), false),
  "llama3-style": gpt2Header(null, { type: "Sequence", pretokenizers: [split(LLAMA3_SPLIT), byteLevel(false)] }, true),
  "qwen2-style": gpt2Header({ type: "NFC" }, { type: "Sequence", pretokenizers: [split(QWEN2_SPLIT), byteLevel(false)] }, false),
  "deepseek3-style": gpt2Header(null, { type: "Sequence", pretokenizers: [...DEEPSEEK3_SPLITS.map((r) => split(r)), byteLevel(false)] }, false),
  // Splits in sequence with a String pattern and the Removed behavior, then Llama 3's regex
  // (tokenizers.js implements Isolated and Removed; tests/test_tokenizer_json.c checks the merged
  // behaviors against the pieces tokenizers documents)
  "split-behaviors": gpt2Header(null, { type: "Sequence", pretokenizers: [
    split("(?:\\r?\\n)+"), splitString("--", "Isolated"), split("\\t", "Removed"),
    split(LLAMA3_SPLIT), byteLevel(false)] }, false),
};
// Gemma 3's pipeline on the SentencePiece-style export of tok512.bin: spaces become U+2581 in the
// normalizer (no prepended one), a Split on " " merged with the previous piece, byte fallback.
const GEMMA3_PATCH = {
  normalizer: { type: "Replace", pattern: { String: " " }, content: "\u2581" },
  pre_tokenizer: splitString(" ", "MergedWithPrevious"),
  decoder: { type: "Sequence", decoders: [{ type: "Replace", pattern: { String: "\u2581" }, content: " " },
                                          { type: "ByteFallback" }, { type: "Fuse" }] },
};
const encoder = JSON.parse(readFileSync(join(data, "gpt2/encoder.json"), "utf8"));
const merges = readFileSync(join(data, "gpt2/vocab.bpe"), "utf8").split("\n").slice(1).filter((l) => l.length);
const full = (h) => ({ ...h, model: { ...h.model, vocab: encoder, merges } });

const dir = mkdtempSync(join(tmpdir(), "nanolm-tok-"));
execFileSync(nanolm, ["export", "--ckpt", join(data, "stories260K/stories260K.bin"), "--tokenizer",
                      join(data, "stories260K/tok512.bin"), "--to", "hf", join(dir, "s260")]);
const spmText = readFileSync(join(dir, "s260/tokenizer.json"), "utf8");

function fnv32(ids) {
  let h = 0x811c9dc5;
  for (const id of ids) for (let k = 0; k < 4; k++) h = Math.imul(h ^ ((id >>> (8 * k)) & 255), 16777619) >>> 0;
  return h.toString(16).padStart(8, "0");
}
function run(name, reference, encodeFn, extra) {
  let total = 0;
  const hashes = texts.map((t) => { const ids = encodeFn(t); total += ids.length; return fnv32(ids); });
  console.error(`${name}: ${texts.length} texts, ${total} tokens`);
  return { name, reference, n_tokens: total, ...extra, hashes: hashes.join("") };
}
const variants = [];
const tiktoken = getEncoding("gpt2");
variants.push(run("gpt2", "js-tiktoken getEncoding('gpt2'), allowedSpecial 'all'", (t) => tiktoken.encode(t, "all"),
                  { tokenizer_from: "gpt2-hf" }));
for (const [name, h] of Object.entries(headers)) {
  const tok = new Tokenizer(full(h), {});
  variants.push(run(name, "@huggingface/tokenizers Tokenizer.encode, add_special_tokens false",
                    (t) => tok.encode(t, { add_special_tokens: false }).ids, { tokenizer: h }));
}
{
  const tok = new Tokenizer(JSON.parse(spmText), {});
  variants.push(run("spm-tok512", "@huggingface/tokenizers Tokenizer.encode, add_special_tokens false",
                    (t) => tok.encode(t, { add_special_tokens: false }).ids, { tokenizer_fnv32: fnv32(Buffer.from(spmText)) }));
}
{
  const tok = new Tokenizer({ ...JSON.parse(spmText), ...GEMMA3_PATCH }, {});
  variants.push(run("gemma3-style", "@huggingface/tokenizers Tokenizer.encode, add_special_tokens false",
                    (t) => tok.encode(t, { add_special_tokens: false }).ids,
                    { tokenizer_fnv32: fnv32(Buffer.from(spmText)), spm_patch: GEMMA3_PATCH }));
}
const fixture = {
  about: "made by tests/ref/make_tok_fixture.mjs; hashes: 8 hex digits per text, FNV-1a 32 over the ids as little-endian u32",
  versions: {
    "js-tiktoken": JSON.parse(readFileSync(join(here, "tok/node_modules/js-tiktoken/package.json"))).version,
    "@huggingface/tokenizers": JSON.parse(readFileSync(join(here, "tok/node_modules/@huggingface/tokenizers/package.json"))).version,
  },
  synthetic, sources, variants,
};
writeFileSync(join(here, "tok_fixture.json"), JSON.stringify(fixture) + "\n");
console.error(`wrote tests/ref/tok_fixture.json: ${texts.length} texts`);
