#!/usr/bin/python3
"""Writes tests/ref/st_from_numpy.safetensors, a safetensors file made without nanolm, for
test_safetensors.c to read. The format is written by hand from its specification (8-byte
little-endian header length, JSON header padded with spaces, little-endian row-major data),
because Debian's python3-torch 1.13 has no safetensors module.

Values are chosen to exercise every dtype; the *.as_f32 companions hold numpy's own widening
of the 16-bit tensors, so the C decoder is checked against an independent implementation.
The data is laid out in a different order than the header keys, so the reader must sort by
offset. Run: /usr/bin/python3 tests/ref/st_write_fixture.py
"""
import json
import os
import struct

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "st_from_numpy.safetensors")


def bf16_bits(values):
    """bfloat16 bits of float32 values that bfloat16 represents exactly (top 16 bits)."""
    f = np.asarray(values, dtype=np.float32)
    bits = f.view(np.uint32)
    assert np.all(bits & 0xFFFF == 0), "value not exactly representable in bf16"
    return (bits >> 16).astype("<u2")


h_vals = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 2.0 ** -24, np.inf, 1.0 / 3.0], dtype=np.float32)
h = h_vals.astype("<f2")                       # numpy rounds 1/3 to nearest f16
b_vals = np.array([[1.0, -2.0, 0.5], [3.140625, 2.0 ** -130, -np.inf]], dtype=np.float32)

tensors = [  # (name, dtype, shape, little-endian bytes) in data order
    ("s.scalar", "F32", [], np.array(42.5, dtype="<f4").tobytes()),
    ("l.i64", "I64", [2], np.array([-(2 ** 40), 2 ** 40], dtype="<i8").tobytes()),
    ("h.f16", "F16", [8], h.tobytes()),
    ("a.f32", "F32", [3, 4], (np.arange(12, dtype=np.float32) * 0.25 - 1.5).reshape(3, 4).astype("<f4").tobytes()),
    ("b.bf16", "BF16", [2, 3], bf16_bits(b_vals).tobytes()),
    ("q.i8", "I8", [5], np.array([-128, -1, 0, 1, 127], dtype="i1").tobytes()),
    ("u.u8", "U8", [4], np.array([0, 1, 128, 255], dtype="u1").tobytes()),
    ("i.i32", "I32", [3], np.array([-2 ** 31, 0, 2 ** 31 - 1], dtype="<i4").tobytes()),
    ("h.as_f32", "F32", [8], h.astype("<f4").tobytes()),
    ("b.as_f32", "F32", [2, 3], b_vals.astype("<f4").tobytes()),
    ("empty", "F32", [0, 3], b""),
]

header = {"__metadata__": {"format": "pt", "source": "numpy"}}
off = 0
entries = {}
for name, dt, shape, data in tensors:
    entries[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
    off += len(data)
for name in sorted(entries):                   # header keys alphabetical, data not
    header[name] = entries[name]
hj = json.dumps(header, separators=(",", ":")).encode()
hj += b" " * ((8 - len(hj) % 8) % 8)
with open(OUT, "wb") as f:
    f.write(struct.pack("<Q", len(hj)))
    f.write(hj)
    for _, _, _, data in tensors:
        f.write(data)
print(f"wrote {OUT}: {8 + len(hj) + off} bytes, {len(tensors)} tensors")
