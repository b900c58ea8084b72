"""Safetensors interop: loads tests/ref/interop.safetensors -- a checkpoint WRITTEN BY NANOLM
(nl_ckpt_save of the golden test's model; regenerate it with
`NANOLM_WRITE_FIXTURES=1 build/test_model_golden`) -- into the PyTorch NanoLM with a strict
state_dict load, runs the golden test's tokens and writes the logits to
tests/ref/interop_logits.bin (NLFX format, see make_model_fixture.py). test_model_golden checks
that nanolm's forward on the same file reproduces them.

Run from the project root: /usr/bin/python3 tests/ref/make_interop_fixture.py
The safetensors file is parsed here with json + torch.frombuffer (the safetensors package is not
needed): 8-byte little-endian header length, JSON header, data area.
"""
import json
import os
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from nanolm_torch import NanoLM  # noqa: E402


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    tensors = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        tensors[name] = torch.frombuffer(bytearray(data[b:e]), dtype=torch.float32).reshape(info["shape"])
    return meta, tensors


def read_nlfx(path):
    raw = open(path, "rb").read()
    assert raw[:4] == b"NLFX"
    (count,) = struct.unpack_from("<i", raw, 4)
    p, out = 8, {}
    for _ in range(count):
        (ln,) = struct.unpack_from("<i", raw, p); p += 4
        name = raw[p:p + ln].decode(); p += ln
        dt, nd = struct.unpack_from("<ii", raw, p); p += 8
        dims = struct.unpack_from("<%di" % nd, raw, p); p += 4 * nd
        cnt = 1
        for d in dims:
            cnt *= d
        t = torch.frombuffer(bytearray(raw[p:p + 4 * cnt]), dtype=torch.int32 if dt else torch.float32).reshape(dims)
        p += 4 * cnt
        out[name] = t
    return out


meta, tensors = read_safetensors(os.path.join(HERE, "interop.safetensors"))
arch = json.loads(meta["nanolm.arch"])
a = dict(vocab_size=arch["vocab_size"], dim=arch["dim"], n_layers=arch["n_layers"], n_heads=arch["n_heads"],
         n_kv_heads=arch["n_kv_heads"], hidden_dim=arch["hidden_dim"], seq_len=arch["seq_len"],
         rope_theta=arch["rope_theta"], norm_eps=arch["norm_eps"], tied=bool(arch["tied_embeddings"]))
model = NanoLM(a)
state = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
model.load_state_dict(state, strict=True)  # every HF name present, no extra, shapes equal
golden = read_nlfx(os.path.join(HERE, "model_golden.bin"))
with torch.no_grad():
    logits, _ = model(golden["tokens"].long())
print("max |torch(nanolm file) - golden logits| = %.3g" % (logits - golden["logits"]).abs().max().item())
out = os.path.join(HERE, "interop_logits.bin")
with open(out, "wb") as f:
    f.write(b"NLFX" + struct.pack("<i", 1))
    name = b"logits"
    f.write(struct.pack("<i", len(name)) + name + struct.pack("<ii", 0, logits.dim()))
    f.write(struct.pack("<%di" % logits.dim(), *logits.shape))
    f.write(logits.contiguous().numpy().astype("<f4").tobytes())
print("wrote", os.path.relpath(out))
