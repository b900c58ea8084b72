"""NanoLM in PyTorch: the same architecture as src/model/ (Llama: RMSNorm, interleaved-pair RoPE,
causal GQA attention, SwiGLU MLP, optional tied classifier), parameter names as Hugging Face Llama.
Used by make_model_fixture.py (golden test) and bench/torch_train.py (speed baseline)."""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq_len, hd, theta):
    i = torch.arange(hd // 2, dtype=torch.float64)
    freq = theta ** (-(2.0 * i) / hd)
    ang = torch.arange(seq_len, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()   # (T, hd/2)


def apply_rope(x, cos, sin):
    # x (B, T, nh, hd): rotate pairs (2i, 2i+1) by angle t * theta^(-2i/hd)
    B, T, nh, hd = x.shape
    xr = x.view(B, T, nh, hd // 2, 2)
    x0, x1 = xr[..., 0], xr[..., 1]
    c = cos[:T][None, :, None, :]
    s = sin[:T][None, :, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).view(B, T, nh, hd)


class Attention(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.nh, self.kvh, self.hd = a["n_heads"], a["n_kv_heads"], a["dim"] // a["n_heads"]
        C = a["dim"]
        self.q_proj = nn.Linear(C, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(C, self.kvh * self.hd, bias=False)
        self.v_proj = nn.Linear(C, self.kvh * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q = apply_rope(self.q_proj(x).view(B, T, self.nh, self.hd), cos, sin)
        k = apply_rope(self.k_proj(x).view(B, T, self.kvh, self.hd), cos, sin)
        v = self.v_proj(x).view(B, T, self.kvh, self.hd)
        g = self.nh // self.kvh
        k = k.repeat_interleave(g, dim=2)
        v = v.repeat_interleave(g, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))           # (B, nh, T, hd)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, a):
        super().__init__()
        C, H = a["dim"], a["hidden_dim"]
        self.gate_proj = nn.Linear(C, H, bias=False)
        self.up_proj = nn.Linear(C, H, bias=False)
        self.down_proj = nn.Linear(H, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.input_layernorm = RMSNorm(a["dim"], a["norm_eps"])
        self.self_attn = Attention(a)
        self.post_attention_layernorm = RMSNorm(a["dim"], a["norm_eps"])
        self.mlp = MLP(a)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed_tokens = nn.Embedding(a["vocab_size"], a["dim"])
        self.layers = nn.ModuleList([Layer(a) for _ in range(a["n_layers"])])
        self.norm = RMSNorm(a["dim"], a["norm_eps"])


class NanoLM(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.model = Inner(a)
        self.tied = bool(a.get("tied", False))
        if not self.tied:
            self.lm_head = nn.Linear(a["dim"], a["vocab_size"], bias=False)
        cos, sin = rope_tables(a["seq_len"], a["dim"] // a["n_heads"], a["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx, targets=None):
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, self.cos, self.sin)
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        logits = x @ w.t()
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def make_optimizer(model, lr, wd, betas=(0.9, 0.95), eps=1e-8):
    """AdamW with weight decay on 2-D weights only (nanolm's train/ semantics)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas, eps=eps)
