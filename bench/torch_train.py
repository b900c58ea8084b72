"""PyTorch baseline for bench/bench_train.sh: trains the NanoLM architecture (tests/ref/nanolm_torch.py,
the same model the golden test checks) on byte tokens of a text file with AdamW, and prints the
median tokens/s over the steps after a warm-up.

usage: /usr/bin/python3 bench/torch_train.py FILE PRESET STEPS BATCH SEQ THREADS
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from nanolm_torch import NanoLM, make_optimizer  # noqa: E402

PRESETS = {  # as src/base/arch.c
    "shakespeare-char": dict(vocab_size=256, dim=128, n_layers=4, n_heads=4, n_kv_heads=4, hidden_dim=352, seq_len=64),
    "small": dict(vocab_size=256, dim=384, n_layers=6, n_heads=6, n_kv_heads=6, hidden_dim=1024, seq_len=256),
}


def main():
    path, preset, steps, B, T, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    torch.set_num_threads(threads)
    torch.manual_seed(1337)
    a = dict(PRESETS[preset], rope_theta=10000.0, norm_eps=1e-5, tied=False)
    model = NanoLM(a)
    opt = make_optimizer(model, 1e-3, 0.1)
    data = torch.tensor(list(open(path, "rb").read()[: 1 << 20]), dtype=torch.long)
    n_train = int(len(data) * 0.9)
    g = torch.Generator().manual_seed(1)
    rates = []
    for step in range(steps):
        ix = torch.randint(0, n_train - T - 1, (B,), generator=g)
        x = torch.stack([data[i:i + T] for i in ix])
        y = torch.stack([data[i + 1:i + T + 1] for i in ix])
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        rates.append(B * T / dt)
    warm = min(5, steps // 2)
    print("torch %s: %d steps, loss %.4f, median %.1f tokens/s (threads %d)" % (preset, steps, loss.item(), statistics.median(rates[warm:]), threads))


if __name__ == "__main__":
    main()
