#!/usr/bin/python3
"""Checks tests/ref/st_from_nanolm.safetensors, a file written by nanolm's safetensors writer
(test_safetensors.c writes the same bytes on every run and fails if they differ from this
committed copy; NANOLM_REGEN_FIXTURES=1 build/test_safetensors rewrites it).

Parses the format by hand from its specification (Debian's python3-torch 1.13 has no
safetensors module) and checks the layout rules and every value against the formulas the C
test used. Run: /usr/bin/python3 tests/ref/st_check_nanolm.py [FILE]
"""
import json
import os
import struct
import sys

import numpy as np

path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "st_from_nanolm.safetensors")
raw = open(path, "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert 8 + n <= len(raw), "header runs past the end of the file"
text = raw[8:8 + n]
assert text[:1] == b"{", "header must start with '{'"
assert (8 + n) % 8 == 0, f"data area starts at {8 + n}, not a multiple of 8"
stripped = text.rstrip(b" ")
assert all(c == 0x20 for c in text[len(stripped):]), "padding must be spaces"
header = json.loads(text)
data = raw[8 + n:]

meta = header.pop("__metadata__")
assert meta == {"arch": "test", "note": "written by nanolm"}, meta

# The tensors must tile the data area in the order they were added.
order = sorted(header, key=lambda k: header[k]["data_offsets"][0])
assert order == ["w.f32", "w.bf16", "w.f16", "w.i8", "w.u8", "w.i32", "w.i64", "scalar"], order
pos = 0
sizes = {"F32": 4, "BF16": 2, "F16": 2, "I8": 1, "U8": 1, "I32": 4, "I64": 8}
npdt = {"F32": "<f4", "F16": "<f2", "I8": "i1", "U8": "u1", "I32": "<i4", "I64": "<i8"}
arrays = {}
for name in order:
    e = header[name]
    b, end = e["data_offsets"]
    assert b == pos, f"{name}: begins at {b}, expected {pos}"
    count = int(np.prod(e["shape"])) if e["shape"] else 1
    assert end - b == count * sizes[e["dtype"]], name
    buf = data[b:end]
    if e["dtype"] == "BF16":
        a = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        a = np.frombuffer(buf, npdt[e["dtype"]])
    arrays[name] = a.reshape(e["shape"])
    pos = end
assert pos == len(data), "bytes after the last tensor"

i = np.arange(24)
assert header["w.f32"]["shape"] == [2, 3, 4]
assert np.array_equal(arrays["w.f32"], (i * 0.5 - 3).reshape(2, 3, 4).astype(np.float32))
assert np.array_equal(arrays["w.bf16"], ((np.arange(6) - 5) * 0.25).reshape(2, 3).astype(np.float32))
f16 = arrays["w.f16"].astype(np.float64)
assert np.array_equal(f16, [1.0, -2.0, 0.5, 65504.0, 2.0 ** -24, np.inf])
assert list(arrays["w.i8"]) == [-128, -1, 0, 1, 127]
assert list(arrays["w.u8"]) == [0, 7, 255]
assert list(arrays["w.i32"]) == [-7, 2 ** 31 - 1]
assert list(arrays["w.i64"]) == [-(2 ** 40), 3]
assert header["scalar"]["shape"] == [] and float(arrays["scalar"]) == 42.5
print(f"{path}: OK ({len(raw)} bytes, {len(order)} tensors, header {n} bytes, data at byte {8 + n})")
