#!/usr/bin/python3
"""Writes the seed corpora fuzz/corpus/<target>/ (committed; each file a few KB at most).

Seeds are small files of each format as nanolm writes them (same layout, written here from
the format descriptions in include/nanolm/*.h) and short heads of the real files in
data/ (or $NANOLM_DATA); a missing data file is skipped with a note.
Run from the project root: NANOLM_BIN=build/nanolm /usr/bin/python3 fuzz/make_corpus.py
"""
import json
import math
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("NANOLM_DATA", os.path.join(ROOT, "data"))
OUT = os.path.join(ROOT, "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def shared(rel, limit):
    p = os.path.join(DATA, rel)
    if not os.path.exists(p):
        print("make_corpus: skipping missing", rel)
        return None
    with open(p, "rb") as f:
        return f.read(limit)


# ---- safetensors ----
def safetensors(tensors, meta=None):
    header, blob = {}, b""
    if meta is not None:
        header["__metadata__"] = meta
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob


f32 = lambda xs: struct.pack("<%df" % len(xs), *xs)
put("safetensors", "two_f32.st", safetensors(
    [("a", "F32", [2, 3], f32([1, 2, 3, 4, 5, 6])), ("b", "F32", [], f32([7]))], {"arch": "tiny"}))
put("safetensors", "dtypes.st", safetensors([
    ("h", "F16", [4], struct.pack("<4H", 0x3C00, 0x8000, 0x7C00, 0x0001)),
    ("bf", "BF16", [2, 2], struct.pack("<4H", 0x3F80, 0xFF80, 0x7FC0, 0x0001)),
    ("i8", "I8", [3], bytes([1, 255, 128])), ("u8", "U8", [1], b"\x07"),
    ("i32", "I32", [2], struct.pack("<2i", -1, 1 << 30)), ("i64", "I64", [1], struct.pack("<q", -5)),
    ("d", "F64", [1], struct.pack("<d", math.pi)), ("empty", "F32", [0, 4], b"")]))
put("safetensors", "empty.st", safetensors([]))
for name in ("st_from_nanolm.safetensors", "st_from_numpy.safetensors"):
    with open(os.path.join(ROOT, "tests", "ref", name), "rb") as f:
        put("safetensors", name, f.read())


# ---- llama2.c checkpoints ----
def llama2c(dim, hidden, layers, heads, kv, vocab, seq, tied=True):
    hs = dim // heads
    n = vocab * dim + layers * dim
    n += layers * (heads * hs) * dim + 2 * layers * (kv * hs) * dim + layers * dim * (heads * hs)
    n += layers * dim + 3 * layers * hidden * dim + dim
    rope = seq * hs
    cls = 0 if tied else vocab * dim
    vals = [((i * 37) % 101 - 50) / 64.0 for i in range(n + rope + cls)]
    head = struct.pack("<7i", dim, hidden, layers, heads, kv, vocab if tied else -vocab, seq)
    return head + f32(vals)


put("llama2c", "tiny_tied.bin", llama2c(8, 16, 1, 2, 1, 16, 4))
put("llama2c", "tiny_untied.bin", llama2c(8, 12, 2, 4, 2, 10, 2, tied=False))
head = shared("stories260K/stories260K.bin", 2048)
if head:
    put("llama2c", "stories260K_head.bin", head)      # real header, truncated weights


# ---- llama2.c tokenizer ----
def tokenizer(pieces):
    mtl = max(len(p) for p, _ in pieces)
    out = struct.pack("<i", mtl)
    for p, s in pieces:
        out += struct.pack("<fi", s, len(p)) + p
    return out


base = [(b"<unk>", 0.0), (b"\n<s>\n", 0.0), (b"\n</s>\n", 0.0)]
base += [(("<0x%02X>" % b).encode(), 0.0) for b in range(256)]
merges = [b" ", b"e", b"t", b"a", b"o", b" t", b"he", b" the", b"in", b" a", b"an", b"nd", b" and",
          b"on", b"ce", b" on", b" once", b"up", b" up", b"\xc3\xa9"]
put("tokenizer", "synthetic.bin", tokenizer(base + [(m, -float(i)) for i, m in enumerate(merges)]))
put("tokenizer", "spaces_inside.bin", tokenizer(base + [(b" ", -1.0), (b"a b", -2.0), (b"a", -3.0), (b"b", -4.0)]))
head = shared("stories260K/tok512.bin", 3072)
if head:
    put("tokenizer", "tok512_head.bin", head)          # real vocabulary, cut inside a piece


# ---- data loader: 8 bytes of geometry, then the text ----
def geometry(B, T, world, rank, step, split):
    return bytes([B, T, world - 1, rank]) + struct.pack("<I", step + 4)[:3] + bytes([split])


text = shared("tinystories/tinystories_sample.txt", 2048) or b"Once upon a time there was a tiny file.\n" * 8
put("data", "sample.bin", geometry(2, 16, 2, 1, 3, 0) + text)
put("data", "short.bin", geometry(1, 8, 1, 0, 0, 1) + b"0123456789abcdef")
put("data", "empty.bin", geometry(1, 1, 1, 0, 0, 2))
shk = shared("tinyshakespeare/input.txt", 1024)
if shk:
    put("data", "shakespeare_head.bin", geometry(4, 32, 4, 3, 100, 2) + shk)


# ---- CLI numbers: 16 bytes of range (lo, hi), then the string ----
rng = struct.pack("<qq", -1000, 1000)
for i, s in enumerate([b"1e9", b"7B", b"1.5T", b"2k", b"-0", b"nan", b"inf", b"0x1p-3", b"1e400",
                       b"123", b"-9223372036854775808", b" 5", b"5 "]):
    put("cli_numbers", "n%02d.txt" % i, rng + s)

# ---- names: formats, quantization schemes, FP8 scalings ----
for i, s in enumerate([b"bf16", b"E4M3FN", b"fp8_e5m2", b"mxfp4", b"int4", b"float32", b"half", b"e8m0",
                       b"int8-channel", b"int4-b32", b"affine-uint8-channel", b"mxfp6-e2m3-away", b"mxint8",
                       b"tensor", b"delayed", b"block", b"mx"]):
    put("names", "n%02d.txt" % i, s)

# ---- formats cast arguments, NUL separated ----
for i, args in enumerate([[b"257", b"--to", b"bf16"], [b"-1.5", b"--to", b"e4m3", b"--json"],
                          [b"1e9", b"-t", b"e2m1", b"--rounding", b"stochastic", b"--seed", b"7"],
                          [b"inf", b"--to", b"e5m2", b"--overflow", b"ieee"], [b"nan", b"--to", b"int4"],
                          [b"-inf", b"--to", b"e8m0", b"-r", b"rtz"], [b"0.1", b"--to", b"tf32", b"-o", b"saturate"]]):
    put("formats_cli", "a%02d.bin" % i, b"\0".join(args))

# ---- NanoLM checkpoints: safetensors with nanolm's metadata, a tiny arch, as nanolm writes them ----
def nanolm_ckpt(dim, hidden, layers, heads, kv, vocab, tied, state):
    hd = dim // heads
    shapes = [("model.embed_tokens.weight", [vocab, dim])]
    for l in range(layers):
        p = "model.layers.%d." % l
        shapes += [(p + "input_layernorm.weight", [dim]), (p + "self_attn.q_proj.weight", [heads * hd, dim]),
                   (p + "self_attn.k_proj.weight", [kv * hd, dim]), (p + "self_attn.v_proj.weight", [kv * hd, dim]),
                   (p + "self_attn.o_proj.weight", [dim, heads * hd]), (p + "post_attention_layernorm.weight", [dim]),
                   (p + "mlp.gate_proj.weight", [hidden, dim]), (p + "mlp.up_proj.weight", [hidden, dim]),
                   (p + "mlp.down_proj.weight", [dim, hidden])]
    shapes.append(("model.norm.weight", [dim]))
    if not tied:
        shapes.append(("lm_head.weight", [vocab, dim]))
    arch = {"name": "tiny", "vocab_size": vocab, "dim": dim, "n_layers": layers, "n_heads": heads,
            "n_kv_heads": kv, "hidden_dim": hidden, "seq_len": 8, "rope_theta": 10000, "norm_eps": 1e-05,
            "tied_embeddings": int(tied), "head_dim": 0}
    meta = {"format": "pt", "nanolm.arch": json.dumps(arch, separators=(",", ":")), "nanolm.tokenizer": "byte"}
    tensors = []
    for name, shp in shapes:
        k = 1
        for d in shp:
            k *= d
        tensors.append((name, "F32", shp, f32([((i * 7) % 13 - 6) / 16.0 for i in range(k)])))
    if state:
        meta["nanolm.train"] = json.dumps({"step": 3, "precision": "fp32", "rng": ["1", "2", "3", "4"],
                                           "adamw": {"t": 3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                                                     "weight_decay": 0.1},
                                           "scaler": {"scale": 65536, "good_steps": 0, "skipped": 0, "growth_interval": 2000}},
                                          separators=(",", ":"))
        for name, shp in list(shapes):
            k = 1
            for d in shp:
                k *= d
            tensors.append(("optimizer.exp_avg." + name, "F32", shp, f32([0.01] * k)))
            tensors.append(("optimizer.exp_avg_sq." + name, "F32", shp, f32([0.001] * k)))
    return safetensors(tensors, meta)


put("checkpoint", "tiny_untied_state.st", nanolm_ckpt(8, 12, 1, 2, 1, 6, False, True))
put("checkpoint", "tiny_tied.st", nanolm_ckpt(4, 8, 2, 2, 2, 5, True, False))
put("checkpoint", "tiny_llama2c.bin", llama2c(8, 16, 1, 2, 1, 16, 4))

# ---- planner catalog JSON (first byte: 0 = GPU file, 1 = model file) and scaling CSV ----
hw = [b'[{"name": "h100-pcie", "base": "h100", "flops_bf16": 756e12, "intra_bw": 64e9}, {"name": "h100", "price_per_hour": 1.99}]',
      b'{"name": "x", "mem_bytes": 80e9, "gpus_per_node": 4, "latency_s": 2e-5, "intra_eff": 0.7, "source": "made up"}']
models = [b'{"name": "tiny", "vocab_size": 1000, "dim": 256, "n_layers": 4, "n_heads": 4, "hidden_dim": 688}',
          b'[{"name": "llama-3-8b-32k", "base": "llama-3-8b", "seq_len": 32768}, {"name": "moe", "base": "tiny", "n_experts": 8, "top_k": 2, "expert_hidden_dim": 128}]']
for i, j in enumerate(hw):
    put("catalog", "hw%d.json" % i, b"\0" + j)
for i, j in enumerate(models):
    put("catalog", "model%d.json" % i, b"\1" + j)
put("scaling_csv", "nd.csv", b"N,D,loss\n1e8,2e9,3.1\n4e8,8e9,2.8\n1e9,2e10,2.5\n")
put("scaling_csv", "flops.csv", b"params,FLOPs,loss\n70e6,8.4e17,3.5\n1.6e8,3e18,3.2\n")
put("scaling_csv", "bad.csv", b"N,D,loss\n1e9,2e10,2.5\n1e9,abc,2.4\n")
# ---- KV transfer messages (include/nanolm/kv_transfer.h); first byte: bit 0 = answer, bit 1 = int8 KV.
# The fuzz target's model shape: 2 layers, 4 heads, 2 kv heads, head dim 8, vocab 64, context 32.
def kvx_request(tokens, int8=False, temperature=1.0, top_p=1.0, top_k=0, seed=1):
    h = b"NKVQ" + struct.pack("<7I", 1, 2, 4, 2, 8, 64, 32) + struct.pack("<II", int(int8), len(tokens))
    h += struct.pack("<ffII", temperature, top_p, top_k, 0) + struct.pack("<Q", seed)
    return h + struct.pack("<%di" % len(tokens), *tokens)


def kvx_answer(tokens, int8=False, block_size=16, first=7, error=None):
    n = len(tokens)
    if error is not None:
        text = error.encode()
        return (b"NKVK" + struct.pack("<II", 1, 10) + struct.pack("<7I", 2, 4, 2, 8, 64, 32, int(int8)) +
                bytes(4 * 4 + 8 * 4 + 8) + struct.pack("<II", len(text), 0) + text)
    rows = 2 * 2 * n
    kv = bytes((i * 7) % 251 for i in range(rows * 16)) + struct.pack("<H", 0x3c00) * (rows * 2) if int8 else \
        struct.pack("<%df" % (rows * 16), *[0.01 * (i % 50) for i in range(rows * 16)])
    h = b"NKVK" + struct.pack("<II", 1, 0) + struct.pack("<7I", 2, 4, 2, 8, 64, 32, int(int8))
    h += struct.pack("<IIII", block_size, (n + block_size - 1) // block_size, n, first)
    h += struct.pack("<4Q", 1, 2, 3, 4) + struct.pack("<QII", len(kv), 0, 0)
    return h + struct.pack("<%di" % n, *tokens) + kv


put("kv_transfer", "request.bin", b"\0" + kvx_request([1, 5, 9, 63]))
put("kv_transfer", "request_int8_sampled.bin", b"\2" + kvx_request(list(range(20)), True, 0.7, 0.9, 40, 99))
put("kv_transfer", "answer_fp32.bin", b"\1" + kvx_answer([3, 4, 5]))
put("kv_transfer", "answer_int8.bin", b"\3" + kvx_answer([1] * 17, True, 8))
put("kv_transfer", "answer_error.bin", b"\1" + kvx_answer([], error="the waiting queue is full"))
# ---- GGUF (include/nanolm/gguf.h): small files as nanolm's writer lays them out ----
def gguf_str(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, tensors, version=3):
    """kvs: (key, type, raw value bytes); tensors: (name, ne, ggml type, raw data)."""
    h = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, raw in kvs:
        h += gguf_str(k) + struct.pack("<I", t) + raw
    off, blob = 0, b""
    for name, ne, t, raw in tensors:
        h += gguf_str(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        h += struct.pack("<IQ", t, off)
        pad = (-len(raw)) % 32
        blob += raw + bytes(pad)
        off += len(raw) + pad
    h += bytes((-len(h)) % 32)
    return h + blob


def kv_u32(k, v):
    return (k, 4, struct.pack("<I", v))


def kv_f32(k, v):
    return (k, 6, struct.pack("<f", v))


def kv_s(k, v):
    return (k, 8, gguf_str(v))


def kv_arr(k, et, fmt, vals):
    return (k, 9, struct.pack("<IQ", et, len(vals)) + b"".join(struct.pack(fmt, v) for v in vals))


def kv_arr_s(k, vals):
    return (k, 9, struct.pack("<IQ", 8, len(vals)) + b"".join(gguf_str(v) for v in vals))


def f32s(n, scale=0.01):
    return struct.pack("<%df" % n, *[scale * ((i * 37) % 17 - 8) for i in range(n)])


def q8_0(n):
    return b"".join(struct.pack("<H", 0x2000) + bytes((j * 5) % 256 for j in range(32)) for _ in range(n // 32))


def q4_0(n):
    return b"".join(struct.pack("<H", 0x2400) + bytes((j * 11) % 256 for j in range(16)) for _ in range(n // 32))


def tiny_llama(wtype, data_fn):
    """A llama model of dim 32, 1 layer, 2 heads, hidden 64, vocab 260 (<unk>, <s>, </s>,
    256 byte pieces, a space), tied embedding, the llama (SentencePiece) tokenizer."""
    C, H, V = 32, 64, 260
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["\u2581"]
    kvs = [kv_s("general.architecture", "llama"), kv_s("general.name", "tiny"),
           kv_u32("llama.context_length", 64), kv_u32("llama.embedding_length", C),
           kv_u32("llama.block_count", 1), kv_u32("llama.feed_forward_length", H),
           kv_u32("llama.attention.head_count", 2), kv_u32("llama.attention.head_count_kv", 2),
           kv_f32("llama.rope.freq_base", 10000.0), kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5),
           kv_s("tokenizer.ggml.model", "llama"), kv_arr_s("tokenizer.ggml.tokens", toks),
           kv_arr("tokenizer.ggml.scores", 6, "<f", [0.0] * V),
           kv_arr("tokenizer.ggml.token_type", 5, "<i", [2, 3, 3] + [6] * 256 + [1]),
           kv_u32("tokenizer.ggml.bos_token_id", 1), kv_u32("tokenizer.ggml.eos_token_id", 2)]
    ones = struct.pack("<%df" % C, *[1.0] * C)
    ts = [("token_embd.weight", [C, V], wtype, data_fn(C * V)), ("blk.0.attn_norm.weight", [C], 0, ones)]
    for n, ne in (("attn_q", [C, C]), ("attn_k", [C, C]), ("attn_v", [C, C]), ("attn_output", [C, C]),
                  ("ffn_gate", [C, H]), ("ffn_up", [C, H]), ("ffn_down", [H, C])):
        ts.append(("blk.0.%s.weight" % n, ne, wtype, data_fn(ne[0] * ne[1])))
    ts += [("blk.0.ffn_norm.weight", [C], 0, ones), ("output_norm.weight", [C], 0, ones)]
    return gguf(kvs, ts)


put("gguf", "kv_types.gguf", gguf([kv_u32("general.alignment", 32), kv_s("general.name", "kvs"),
                                   ("i8", 1, b"\xff"), ("u16", 2, b"\x01\x02"), ("i64", 11, struct.pack("<q", -3)),
                                   ("f64", 12, struct.pack("<d", 0.5)), ("b", 7, b"\x01"),
                                   kv_arr("ia", 5, "<i", [1, -2, 3]), kv_arr_s("sa", ["x", "yz"])],
                                  [("a", [32], 8, q8_0(32)), ("b", [2, 1], 0, f32s(2))]))
put("gguf", "tiny_q8_0.gguf", tiny_llama(8, q8_0))
put("gguf", "tiny_q4_0.gguf", tiny_llama(2, q4_0))
# The catalog as `nanolm plan catalog --json` prints it, split into a GPU and a model file
# (needs the CLI: NANOLM_BIN=build/nanolm).
if os.environ.get("NANOLM_BIN"):
    import subprocess
    cat = json.loads(subprocess.run([os.environ["NANOLM_BIN"], "plan", "catalog", "--json"], check=True,
                                    capture_output=True).stdout)
    put("catalog", "cli_gpus.json", b"\0" + json.dumps(cat["gpus"][:4]).encode())
    put("catalog", "cli_models.json", b"\1" + json.dumps(cat["models"][:4]).encode())
print("make_corpus: wrote", OUT)
