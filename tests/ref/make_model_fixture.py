"""Writes tests/ref/model_golden.bin: a small random NanoLM (GQA, untied classifier) in PyTorch,
its inputs, logits, loss, every parameter gradient, and the losses of 10 AdamW steps.

Run from the project root with Debian's python3-torch:  /usr/bin/python3 tests/ref/make_model_fixture.py

File format (little-endian): b"NLFX", int32 count, then count records of
  int32 name_len, name bytes, int32 dtype (0 = float32, 1 = int32), int32 ndim, int32 dims[ndim], data.
"""
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nanolm_torch import NanoLM, make_optimizer  # noqa: E402

torch.manual_seed(1234)
torch.set_num_threads(1)
A = dict(vocab_size=37, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=48, seq_len=16,
         rope_theta=10000.0, norm_eps=1e-5, tied=False)
B, T = 2, 12
LR, WD, CLIP, STEPS = 1e-2, 0.1, 1.0, 10

model = NanoLM(A)
with torch.no_grad():
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.copy_(1.0 + 0.1 * torch.randn_like(p))
        else:
            p.normal_(0.0, 0.1)

idx = torch.randint(0, A["vocab_size"], (B, T))
tgt = torch.randint(0, A["vocab_size"], (B, T))

records = []


def add(name, t):
    t = t.detach().clone().contiguous()  # clone: parameters change later in place
    records.append((name, t))


add("config", torch.tensor([A["vocab_size"], A["dim"], A["n_layers"], A["n_heads"], A["n_kv_heads"],
                            A["hidden_dim"], A["seq_len"], B, T], dtype=torch.int32))
add("hyper", torch.tensor([A["rope_theta"], A["norm_eps"], LR, WD, CLIP], dtype=torch.float32))
add("tokens", idx.int())
add("targets", tgt.int())
for name, p in model.named_parameters():
    add("param:" + name, p.float())

logits, loss = model(idx, tgt)
loss.backward()
add("logits", logits.float())
add("loss", loss.reshape(1).float())
for name, p in model.named_parameters():
    add("grad:" + name, p.grad.float())

# 10 AdamW steps on the same batch: loss at each step before the update
model.zero_grad(set_to_none=True)
opt = make_optimizer(model, LR, WD)
losses = []
for step in range(STEPS):
    opt.zero_grad(set_to_none=True)
    _, loss = model(idx, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    losses.append(loss.item())
add("adamw_losses", torch.tensor(losses, dtype=torch.float32))

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_golden.bin")
with open(out, "wb") as f:
    f.write(b"NLFX")
    f.write(struct.pack("<i", len(records)))
    for name, t in records:
        nb = name.encode()
        f.write(struct.pack("<i", len(nb)))
        f.write(nb)
        dtype = 1 if t.dtype == torch.int32 else 0
        f.write(struct.pack("<ii", dtype, t.dim()))
        f.write(struct.pack("<%di" % t.dim(), *t.shape))
        f.write(t.numpy().astype("<i4" if dtype else "<f4").tobytes())
print("wrote", out, "loss %.6f" % records[[r[0] for r in records].index("loss")][1].item(), "adamw", losses)
