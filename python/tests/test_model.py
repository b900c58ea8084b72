"""nanolm.Model: loading (llama2.c .bin, safetensors, quantized safetensors), generate and eval_loss
against the CLI, quantize_model and model_size_bytes, and the errors."""
import json
import struct

import numpy as np
import pytest

from conftest import ROOT, cli_json, data_path

import nanolm
from nanolm import quant

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
         "One day, she saw a big, red ball. She wanted to play with it, but it was too high. Lily asked her "
         "mom to help her. Her mom said yes and they played together all day. They were very happy.\n")


@pytest.fixture(scope="module")
def stories():
    return data_path("stories260K/stories260K.bin"), data_path("stories260K/tok512.bin")


@pytest.fixture
def story_file(tmp_path):
    p = tmp_path / "story.txt"
    p.write_text(STORY)
    return p


def test_load_llama2c_matches_its_header(stories):
    ckpt, tok = stories
    m = nanolm.Model.load(ckpt, tokenizer=tok)
    dim, hidden, layers, heads, kv_heads, vocab, seq = struct.unpack("<7i", ckpt.read_bytes()[:28])
    a = m.arch
    assert (a["dim"], a["hidden_dim"], a["n_layers"], a["n_heads"], a["n_kv_heads"], a["vocab_size"], a["seq_len"]) \
        == (dim, hidden, layers, heads, kv_heads, abs(vocab), seq)
    assert m.vocab_size == abs(vocab) and m.params.dtype == np.float32 and m.params.size == m.n_params
    assert m.size_bytes() == 4 * m.n_params  # fp32, tied classifier counted once
    assert "Model(" in repr(m)


def test_load_safetensors_matches_the_file():
    """tests/ref/interop.safetensors: the arch from its metadata, and the flat parameter vector holds
    the file's tensors in the model's memory order (the embedding first)."""
    path = ROOT / "tests/ref/interop.safetensors"
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    arch = json.loads(header["__metadata__"]["nanolm.arch"])
    m = nanolm.Model.load(path)
    for k in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "seq_len"):
        assert m.arch[k] == arch[k], k
    assert m.n_params == sum(int(np.prod(t["shape"])) for k, t in header.items() if k != "__metadata__")
    e = header["model.embed_tokens.weight"]
    lo, hi = e["data_offsets"]
    emb = np.frombuffer(raw[8 + n + lo:8 + n + hi], "<f4")
    np.testing.assert_array_equal(m.params[:emb.size], emb)
    with pytest.raises(ValueError, match="no tokenizer"):
        m.generate("hi")
    # token ids work without a tokenizer
    toks = np.arange(40) % arch["vocab_size"]
    assert np.isfinite(m.eval_loss(toks, batch=1, seq=8))


def test_generate_greedy_matches_cli(stories):
    ckpt, tok = stories
    m = nanolm.Model.load(ckpt, tokenizer=tok)
    text = m.generate("Once upon a time", steps=64, temperature=0)
    assert text.startswith("Once upon a time, there was a little girl named Lily. She loved to play outside")
    d = cli_json("generate", "--ckpt", ckpt, "--tokenizer", tok, "--prompt", "Once upon a time", "--steps", 64,
                 "--temperature", 0)
    assert text == d["text"]


def test_generate_sampled_matches_cli(stories):
    ckpt, tok = stories
    m = nanolm.Model.load(ckpt, tokenizer=tok)
    for kv in ("fp32", "int8"):
        text = m.generate("Lily", steps=40, temperature=1.0, seed=42, kv_cache=kv)
        d = cli_json("generate", "--ckpt", ckpt, "--tokenizer", tok, "--prompt", "Lily", "--steps", 40,
                     "--temperature", 1.0, "--seed", 42, "--kv-cache", kv)
        assert text == d["text"], kv
    assert m.encode("Once upon a time").tolist()[:5] == [1, 403, 407, 261, 378]


def test_eval_loss_matches_cli(stories, story_file):
    ckpt, tok = stories
    m = nanolm.Model.load(ckpt, tokenizer=tok)
    loss = m.eval_loss(story_file, batch=2, seq=32)
    d = cli_json("eval", "--ckpt", ckpt, "--tokenizer", tok, "--data", story_file, "--batch", 2, "--seq", 32,
                 same_blas=True)
    assert loss == pytest.approx(d["mean_loss"], rel=1e-6)
    # the same tokens as an array (nl_data_open encodes with BOS)
    assert m.eval_loss(m.encode(STORY), batch=2, seq=32) == pytest.approx(loss, rel=1e-6)  # BOS + text
    with pytest.raises(ValueError, match="sized for batch 2"):
        m.eval_loss(story_file, batch=8, seq=32)


def test_quantize_model_matches_cli(stories, story_file):
    """quantize_model + model_size_bytes on stories260K: the numbers of `nanolm quant model --json`
    (int8-channel W8A8 and int4-b32), loss almost unchanged, linear weights almost 4x lighter."""
    ckpt, tok = stories
    d = cli_json("quant", "model", "--ckpt", ckpt, "--tokenizer", tok, "--data", story_file, "--seq", 32,
                 "--batch", 2, "--scheme", "int8-channel", "--scheme", "int4-b32", same_blas=True)
    rows = {r["scheme"]: r for r in d["schemes"]}
    m = nanolm.Model.load(ckpt, tokenizer=tok)
    fp32_bytes = quant.model_size_bytes(m)
    fp32_loss = m.eval_loss(story_file, batch=2, seq=32)
    assert fp32_bytes == rows["fp32"]["model_bytes"]
    for scheme in ("int8-channel", "int4-b32"):
        quant.quantize_model(m, scheme)
        assert m.scheme == scheme
        assert quant.model_size_bytes(m) == rows[scheme]["model_bytes"], scheme
        loss = m.eval_loss(story_file, batch=2, seq=32)
        assert loss == pytest.approx(rows[scheme]["mean_loss"], rel=1e-6), scheme
    quant.quantize_model(m)  # int8-channel again
    lin_fp32 = d["fp32_linear_bytes"]
    lin_int8 = lin_fp32 - (fp32_bytes - quant.model_size_bytes(m))
    assert lin_fp32 / lin_int8 > 3.7
    assert abs(m.eval_loss(story_file, batch=2, seq=32) - fp32_loss) < 0.02
    with pytest.raises(ValueError, match="W8A8 needs int8-channel"):
        quant.quantize_model(m, "int4-b32", mode="w8a8")
    with pytest.raises(ValueError):
        quant.quantize_model(m, "int9-channel")
    with pytest.raises(TypeError):
        quant.model_size_bytes(object())


def test_quantized_checkpoint_loads(stories, story_file, tmp_path):
    ckpt, tok = stories
    out = tmp_path / "q.safetensors"
    d = cli_json("quant", "model", "--ckpt", ckpt, "--tokenizer", tok, "--data", story_file, "--seq", 32,
                 "--batch", 2, "--scheme", "int8-channel", "--out", out)
    m = nanolm.Model.load(out, tokenizer=tok)
    assert m.scheme == "quantized"
    row = [r for r in d["schemes"] if r["scheme"] == "int8-channel"][0]
    assert quant.model_size_bytes(m) == row["model_bytes"]
    assert m.generate("Once upon a time", steps=24, temperature=0).startswith("Once upon a time, there was")


def test_load_errors(stories, tmp_path):
    ckpt, tok = stories
    with pytest.raises(OSError, match="nope.safetensors") as e:
        nanolm.Model.load(tmp_path / "nope.safetensors")
    assert isinstance(e.value, nanolm.FileError)
    cut = tmp_path / "cut.bin"
    cut.write_bytes(ckpt.read_bytes()[:5000])
    with pytest.raises(OSError, match="cut.bin"):
        nanolm.Model.load(cut, tokenizer=tok)
    with pytest.raises(ValueError, match="tokenizer"):
        nanolm.Model.load(ckpt)
    m = nanolm.Model.load(ckpt, tokenizer=tok)
    with pytest.raises(ValueError, match="kv_cache"):
        m.generate("x", kv_cache="fp8")
    with pytest.raises(ValueError, match="seq"):
        m.eval_loss([1, 2, 3], seq=10 ** 6)
    m.close()
    with pytest.raises(ValueError, match="closed"):
        m.generate("x")


def test_params_view_outlives_its_model(stories):
    """Model.params keeps the model's memory alive: reading it after close() or after the model is
    collected gives the same numbers (it used to read freed memory and kill the interpreter). Run in
    a child interpreter, so that a crash fails this test rather than ending the session."""
    import os
    import subprocess
    import sys
    ckpt, tok = stories
    code = ("import gc, sys, nanolm\n"
            "ckpt, tok = sys.argv[1], sys.argv[2]\n"
            "m = nanolm.Model.load(ckpt, tokenizer=tok)\n"
            "p = m.params\n"
            "want = float(p.astype('float64').sum())\n"
            "m.close()\n"
            "after_close = float(p.astype('float64').sum())\n"
            "del m\n"
            "gc.collect()\n"
            "q = nanolm.Model.load(ckpt, tokenizer=tok).params\n"
            "gc.collect()\n"
            "junk = [bytearray(1 << 20) for _ in range(8)]\n"
            "print(want, after_close, float(p.astype('float64').sum()), float(q.astype('float64').sum()))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, "-c", code, str(ckpt), str(tok)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, f"child exited {r.returncode}: {r.stderr[-2000:]}"
    want, *others = map(float, r.stdout.split())
    assert want != 0.0 and others == [want, want, want]
