#!/usr/bin/python3
"""The GPT of `ember train --model gpt` in PyTorch, for bench/run_gpt.sh: the same layers
(token + position embeddings, pre-norm blocks of LayerNorm, causal nn.MultiheadAttention
(batch_first), LayerNorm, Linear-GELU-Linear, a final LayerNorm and a linear head), AdamW
(lr 3e-3, weight decay 0.01), gradient clipping at 1.0, random windows of the same size.
Prints the mean milliseconds per step over --steps steps after --warmup.
"""
import argparse
import time

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=1)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--context", type=int, default=64)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--d-model", type=int, default=128)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--vocab", type=int, default=114)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(a.vocab, a.d_model)
        self.pos_emb = nn.Embedding(a.context, a.d_model)
        self.blocks = nn.ModuleList([Block(a.d_model, a.heads) for _ in range(a.layers)])
        self.ln_f = nn.LayerNorm(a.d_model)
        self.head = nn.Linear(a.d_model, a.vocab)

    def forward(self, idx):
        T = idx.shape[1]
        mask = torch.triu(torch.full((T, T), float("-inf")), 1)
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln_f(x))


model = GPT()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
text = torch.randint(0, a.vocab, (200000,))


def step():
    at = torch.randint(0, len(text) - a.context - 1, (a.batch,))
    w = torch.stack([text[i:i + a.context + 1] for i in at.tolist()])
    x, y = w[:, :-1], w[:, 1:]
    loss = nn.functional.cross_entropy(model(x).reshape(-1, a.vocab), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


for _ in range(a.warmup):
    step()
t0, c0 = time.perf_counter(), time.process_time()
for _ in range(a.steps):
    step()
print("ms_per_step %.3f" % (1000 * (time.perf_counter() - t0) / a.steps))
# CPU time of all the process's threads: on a shared machine it does not count waiting for a core
print("cpu_ms_per_step %.3f" % (1000 * (time.process_time() - c0) / a.steps))
print("params %d" % sum(p.numel() for p in model.parameters()))
