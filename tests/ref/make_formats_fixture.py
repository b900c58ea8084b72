#!/usr/bin/python3
"""Writes tests/ref/formats_torch.bin: fp32 inputs and PyTorch's bf16 and fp16 codes for them.

Run with Debian's PyTorch (python3-torch 1.13):  /usr/bin/python3 tests/ref/make_formats_fixture.py
The codes come from `tensor.to(torch.bfloat16)` and `tensor.to(torch.float16)` on the CPU.

File layout (little-endian):
  8 bytes  magic b"NLFMTFX1"
  uint32   n
  uint32   n fp32 bit patterns (inputs)
  uint16   n bf16 codes
  uint16   n fp16 codes
Inputs: 100,000 values: special values (zeros, +-inf, NaNs with several payloads, exact ties
of bf16 and fp16 rounding, fp32 subnormals, fp16 subnormals and the values around them, values
near the fp16 overflow threshold 65520 and near FLT_MAX), then random bit patterns and random
normals over many scales. Deterministic (fixed seed).
"""
import os
import struct

import numpy as np
import torch

N = 100_000
rng = np.random.RandomState(20261129)


def bits(values):
    return np.asarray(values, dtype=np.float32).view(np.uint32)


special = []
u = lambda *xs: special.extend(int(x) & 0xFFFFFFFF for x in xs)
# zeros, infinities, NaNs (quiet, signalling payloads, negative)
u(0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
  0x7FA00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00001, 0x7F80FFFF, 0xFF812345)
# bf16 ties (low 16 bits exactly 0x8000) with even and odd kept parts, all exponents
for e in range(0, 255):
    for m in (0x000000, 0x010000, 0x7E0000, 0x7F0000, 0x3A0000):
        for s in (0, 1):
            u((s << 31) | (e << 23) | m | 0x8000)
            u((s << 31) | (e << 23) | m | 0x7FFF)
            u((s << 31) | (e << 23) | m | 0x8001)
# fp16 ties (low 13 bits 0x1000) in fp16's normal range (fp32 exponents 113..142)
for e in range(100, 145):
    for m in (0x000000, 0x002000, 0x7FC000, 0x7FE000, 0x355000):
        for s in (0, 1):
            u((s << 31) | (e << 23) | m | 0x1000)
            u((s << 31) | (e << 23) | m | 0x0FFF)
            u((s << 31) | (e << 23) | m | 0x1001)
# fp32 subnormals
for m in (1, 2, 3, 0x8000, 0x8001, 0x7FFF, 0x18000, 0x400000, 0x7FFFFF, 0x7F8000, 0x0FFFFF):
    u(m, 0x80000000 | m)
# fp16 subnormal range and its edges: k * 2^-25 for small k (ties at odd k), 2^-24 +- ulp
for k in range(0, 2100):
    special.extend(bits([k * 2.0 ** -25, -k * 2.0 ** -25]).tolist())
special.extend(bits([2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25, 0.99 * 2.0 ** -25, 2.0 ** -26,
                     2.0 ** -14, 2.0 ** -14 * (1 - 2.0 ** -11), 6.0e-8, 5.9604645e-8]).tolist())
# around the overflow thresholds
special.extend(bits([65504, 65505, 65519, 65519.996, 65520, 65521, 70000, 1e5, -65520, -65519,
                     3.4028235e38, -3.4028235e38, 3.3961776e38, 3.3895314e38, 3.39e38, 1e38,
                     257, 70000, 1e-8, 3.14159265, 1.0001, 0.1, -0.1, 1e-40, 1e-45]).tolist())
special = np.array(special, dtype=np.uint32)
assert len(special) < N // 2, len(special)

rest = N - len(special)
rand_bits = rng.randint(0, 2 ** 32, size=rest // 2, dtype=np.uint64).astype(np.uint32)
scales = 2.0 ** rng.randint(-40, 40, size=rest - rest // 2)
rand_norm = bits((rng.standard_normal(rest - rest // 2) * scales).astype(np.float32))
inputs = np.concatenate([special, rand_bits, rand_norm]).astype(np.uint32)
assert len(inputs) == N

x = torch.from_numpy(inputs.view(np.float32).copy())
bf16 = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
fp16 = x.to(torch.float16).view(torch.int16).numpy().view(np.uint16)

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "formats_torch.bin")
tmp = out + ".tmp"
with open(tmp, "wb") as f:
    f.write(b"NLFMTFX1")
    f.write(struct.pack("<I", N))
    f.write(inputs.astype("<u4").tobytes())
    f.write(bf16.astype("<u2").tobytes())
    f.write(fp16.astype("<u2").tobytes())
os.replace(tmp, out)
print(f"wrote {out}: {N} values (torch {torch.__version__})")
