#!/usr/bin/python3
"""Reference GPTQ for one layer, for tests/test_gptq.c.

Written from the GPTQ paper (Frantar et al. 2022, Algorithm 1) and the structure of its public
reference implementation (Hessian 2 X X^T as a running mean, dead inputs, 1% dampening,
cholesky -> cholesky_inverse -> cholesky(upper), blocks of 128 with lazy updates, group grids
found when a group's first column is reached, from the block-start weights), in float64 with
torch's own linear algebra. It shares no code with the C implementation.

Grid: min-max with a zero point (the reference quantizer), scale rounded to fp32 (as nanolm
stores it). Run with Debian's python3-torch:
    /usr/bin/python3 tests/ref/make_gptq_fixture.py
Writes tests/ref/gptq/{x.f32, w.f32, meta.json, <config>.codes.u8, .scales.f32, .zeros.f32}.
"""
import json
import os

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gptq")
ROWS, COLS, TOKENS = 48, 256, 512
CONFIGS = [  # (bits, group, symmetric)
    (4, 32, False), (3, 32, False), (3, 64, False), (4, 128, False), (8, 128, False),
    (4, 0, True), (2, 64, False),
]


def grid(x, bits, sym):
    """Per-row grid of x (rows, n) -> scale, zero (rows,), the reference quantizer's rule."""
    maxq = 2 ** bits - 1
    zero_t = torch.zeros(x.shape[0], dtype=x.dtype)
    xmin = torch.minimum(x.min(1)[0], zero_t)
    xmax = torch.maximum(x.max(1)[0], zero_t)
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        neg = xmin < 0
        xmin[neg] = -xmax[neg]
    both0 = (xmin == 0) & (xmax == 0)
    xmin[both0] = -1
    xmax[both0] = 1
    scale = ((xmax - xmin) / maxq).float().double()
    if sym:
        zero = torch.full_like(scale, (maxq + 1) / 2)
    else:
        zero = torch.round(-xmin / scale)
    return scale, zero


def quant(x, scale, zero, maxq):
    q = torch.clamp(torch.round(x / scale) + zero, 0, maxq)
    return q, scale * (q - zero)


def gptq(W, H, bits, group, sym, blocksize=128, percdamp=0.01):
    W = W.clone()
    H = H.clone()
    rows, cols = W.shape
    maxq = 2 ** bits - 1
    if group == 0:
        scale, zero = grid(W, bits, sym)
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    damp = percdamp * torch.mean(torch.diag(H))
    idx = torch.arange(cols)
    H[idx, idx] += damp
    L = torch.linalg.cholesky(H)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True)
    ngroups = 1 if group == 0 else (cols + group - 1) // group
    Q = torch.zeros(rows, cols, dtype=torch.int64)
    S = torch.zeros(rows, ngroups, dtype=torch.float64)
    Z = torch.zeros(rows, ngroups, dtype=torch.float64)
    if group == 0:
        S[:, 0], Z[:, 0] = scale, zero
    loss = 0.0
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        W1 = W[:, i1:i2].clone()
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if group != 0 and col % group == 0:
                scale, zero = grid(W[:, col:col + group], bits, sym)
                S[:, col // group], Z[:, col // group] = scale, zero
            w = W1[:, i]
            d = Hinv1[i, i]
            q, wq = quant(w, scale, zero, maxq)
            Q[:, col] = q.long()
            loss += float(((w - wq) ** 2 / d ** 2).sum() / 2)
            err = (w - wq) / d
            W1[:, i:] -= err.unsqueeze(1).matmul(Hinv1[i, i:].unsqueeze(0))
            Err1[:, i] = err
        W[:, i2:] -= Err1.matmul(Hinv[i1:i2, i2:])
    return Q, S, Z, loss


def main():
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(1234)
    # Correlated inputs (a random mixing of independent features), one outlier feature
    # 12x larger, and two dead features (always 0), like real activations.
    Z0 = torch.randn(TOKENS, COLS, generator=g)
    M = torch.eye(COLS) + 0.3 * torch.randn(COLS, COLS, generator=g) / COLS ** 0.5
    X = Z0 @ M
    X[:, 17] *= 12.0
    X[:, 40] = 0.0
    X[:, 200] = 0.0
    W = 0.05 * torch.randn(ROWS, COLS, generator=g)
    W[:, 5] *= 6.0
    X = X.float()
    W = W.float()
    X.numpy().tofile(os.path.join(OUT, "x.f32"))
    W.numpy().tofile(os.path.join(OUT, "w.f32"))
    Xd, Wd = X.double(), W.double()
    H = 2.0 * Xd.t() @ Xd / TOKENS
    meta = {"rows": ROWS, "cols": COLS, "tokens": TOKENS, "block": 128, "damp": 0.01,
            "configs": []}
    for bits, group, sym in CONFIGS:
        Q, S, Zp, loss = gptq(Wd, H, bits, group, sym)
        name = "b%d_g%d_%s" % (bits, group, "sym" if sym else "asym")
        Q.to(torch.uint8).numpy().tofile(os.path.join(OUT, name + ".codes.u8"))
        S.float().numpy().tofile(os.path.join(OUT, name + ".scales.f32"))
        Zp.float().numpy().tofile(os.path.join(OUT, name + ".zeros.f32"))
        deq = torch.zeros_like(Wd)
        for c in range(COLS):
            gi = 0 if group == 0 else c // group
            deq[:, c] = S[:, gi] * (Q[:, c].double() - Zp[:, gi])
        out_err = float(((Wd - deq) @ Xd.t()).pow(2).sum())
        meta["configs"].append({"name": name, "bits": bits, "group": group, "symmetric": sym,
                                "loss": loss, "output_sq_error": out_err})
        print("%-14s loss %.6f  ||(W-Wq)X||^2 %.6f" % (name, loss, out_err))
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
