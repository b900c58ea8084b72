"""nanoGPT's train.py on the CPU, written small (as bench/torch_train.py is for NanoLM's shape): the
GPT of nanoGPT's model.py (learned positions, LayerNorm without bias, causal self-attention, GELU
MLP of 4x width, weight tying, dropout 0) trained on the characters of a text file (nanoGPT's
shakespeare_char: vocab = the sorted set of characters, 90/10 split) with nanoGPT's settings for
the CPU: 4 layers, 4 heads, 128 wide, block 64, batch 12, AdamW (betas 0.9/0.99, weight decay 0.1
on the matrices), lr 1e-3 with 100 warmup steps and cosine decay, gradient clipping at 1.0.
PyTorch 1.13 (Debian) has no scaled_dot_product_attention, so attention takes model.py's
masked path, as nanoGPT does there. Evaluation: the validation loss of one batch at the end (as
`nanolm train --eval-every 0 --eval-windows 1`), not nanoGPT's 20 batches every 250 steps.

usage: /usr/bin/python3 bench/nanogpt_train.py FILE STEPS THREADS
prints: nanogpt: STEPS steps, loss L, val V, loop S s (the steps and the final evaluation)
"""
import math
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

N_LAYER, N_HEAD, N_EMBD, BLOCK, BATCH = 4, 4, 128, 64, 12
LR, MIN_LR, WARMUP, DECAY_ITERS, WD, BETAS, CLIP = 1e-3, 1e-4, 100, 2000, 0.1, (0.9, 0.99), 1.0


class LayerNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD, bias=False)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD, bias=False)
        self.register_buffer("bias", torch.tril(torch.ones(BLOCK, BLOCK)).view(1, 1, BLOCK, BLOCK))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(N_EMBD, dim=2)
        k = k.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2)
        q = q.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2)
        v = v.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(N_EMBD, 4 * N_EMBD, bias=False)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * N_EMBD, N_EMBD, bias=False)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = LayerNorm(N_EMBD), CausalSelfAttention(), LayerNorm(N_EMBD), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, N_EMBD), nn.Embedding(BLOCK, N_EMBD)
        self.h = nn.ModuleList([Block() for _ in range(N_LAYER)])
        self.ln_f = LayerNorm(N_EMBD)
        self.lm_head = nn.Linear(N_EMBD, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * N_LAYER))

    def _init_weights(self, m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(0, T, dtype=torch.long))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def get_lr(it):
    if it < WARMUP:
        return LR * it / WARMUP
    ratio = min(1.0, (it - WARMUP) / (DECAY_ITERS - WARMUP))
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def main():
    path, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    torch.manual_seed(1337)
    text = open(path, encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(data))
    train, val = data[:n], data[n:]

    def get_batch(d):
        ix = torch.randint(len(d) - BLOCK, (BATCH,))
        return torch.stack([d[i:i + BLOCK] for i in ix]), torch.stack([d[i + 1:i + 1 + BLOCK] for i in ix])

    model = GPT(len(chars))
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WD},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS)
    t0 = time.perf_counter()
    for it in range(steps):
        for g in opt.param_groups:
            g["lr"] = get_lr(it)
        x, y = get_batch(train)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
    with torch.no_grad():
        x, y = get_batch(val)
        vl = model(x, y).item()
    dt = time.perf_counter() - t0
    print("nanogpt: %d steps, loss %.4f, val %.4f, loop %.3f s (threads %d)" % (steps, loss.item(), vl, dt, threads))


if __name__ == "__main__":
    main()
