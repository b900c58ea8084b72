#!/usr/bin/python3
"""Writes tests/ref/quant_fixture.{bin,json}: PyTorch's own quantization codes and observer
parameters on 100,000 fp32 values, so that tests/test_quant_torch.c can hold nanolm to them.

Run from the project root with Debian's PyTorch:  /usr/bin/python3 tests/ref/make_quant_fixture.py

quant_fixture.bin (little-endian), in this order:
  x              float32[100000]        the values (viewed as (100, 1000) for per channel)
  one int8/uint8 array of 100000 codes per entry of "cases" in the JSON, in that order
quant_fixture.json: n, rows, cols, cases [{name, kind: per_tensor|per_channel, dtype: qint8|quint8,
  scale | scales, zero_point | zero_points}], observer {scale, zero_point} (MinMaxObserver, affine,
  quint8, whole tensor) and observer_per_channel {scales, zero_points} (PerChannelMinMaxObserver,
  affine, quint8, axis 0).
"""
import json
import os

import numpy as np
import torch

N, ROWS, COLS = 100_000, 100, 1000
rng = np.random.default_rng(20240601)
step = 2.0 ** -5  # a power of two: (k + 0.5) * step is an exact tie after x * (1/scale)
x = np.concatenate([
    rng.standard_normal(50_000) * 1.5,
    (rng.integers(-300, 300, 25_000) + 0.5) * step,   # exact .5 ties, some beyond the code range
    (rng.integers(-20, 20, 5_000) + 0.5) * step * 4,   # ties for the scale 2^-3 channels
    rng.uniform(-12.0, 12.0, 10_000),                  # clamped at both ends
    rng.standard_normal(9_996) * 1e-3,
    [0.0, -0.0, 4.0, -4.0],
]).astype(np.float32)
rng.shuffle(x[:N - 4])
assert x.size == N
xt = torch.from_numpy(x)

cases, blobs = [], []
for dtype, qt, zps in (("qint8", torch.qint8, (0, -3)), ("quint8", torch.quint8, (128, 37))):
    for scale, zp in ((step, zps[0]), (step, zps[1]), (0.0173, zps[1])):
        q = torch.quantize_per_tensor(xt, scale, zp, qt)
        cases.append({"name": f"per_tensor_{dtype}_s{scale:g}_z{zp}", "kind": "per_tensor", "dtype": dtype,
                      "scale": float(scale), "zero_point": int(zp)})
        blobs.append(q.int_repr().numpy().tobytes())
    # Per channel: every fourth row a power-of-two scale (ties), the rest arbitrary.
    scales = np.array([step if r % 4 == 0 else (step * 4 if r % 4 == 1 else 0.003 + 0.0007 * r)
                       for r in range(ROWS)], dtype=np.float64)
    lo, hi = (-128, 127) if dtype == "qint8" else (0, 255)
    zpc = rng.integers(lo + 20, hi - 20, ROWS)
    zpc[::4] = zps[0]
    q = torch.quantize_per_channel(xt.view(ROWS, COLS), torch.from_numpy(scales), torch.from_numpy(zpc), 0, qt)
    cases.append({"name": f"per_channel_{dtype}", "kind": "per_channel", "dtype": dtype,
                  "scales": [float(s) for s in scales], "zero_points": [int(z) for z in zpc]})
    blobs.append(q.int_repr().numpy().tobytes())

obs = torch.ao.quantization.MinMaxObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine)
obs(xt)
s, z = obs.calculate_qparams()
obsc = torch.ao.quantization.PerChannelMinMaxObserver(ch_axis=0, dtype=torch.quint8,
                                                      qscheme=torch.per_channel_affine)
# Every other row shifted to be all positive: the range is widened to include 0.
xc = xt.view(ROWS, COLS).clone()
xc[1::2] = xc[1::2].abs() + 0.25
obsc(xc)
sc, zc = obsc.calculate_qparams()

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "quant_fixture.bin"), "wb") as f:
    f.write(x.tobytes())
    for b in blobs:
        f.write(b)
meta = {"torch": torch.__version__, "n": N, "rows": ROWS, "cols": COLS, "cases": cases,
        "observer": {"scale": float(s.item()), "zero_point": int(z.item())},
        "observer_per_channel": {"note": "rows 1, 3, 5, ... are |x| + 0.25",
                                 "scales": [float(v) for v in sc], "zero_points": [int(v) for v in zc]}}
with open(os.path.join(here, "quant_fixture.json"), "w") as f:
    json.dump(meta, f, indent=1)
print("wrote", len(cases), "cases; observer", meta["observer"])
