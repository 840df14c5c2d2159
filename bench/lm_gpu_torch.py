#!/usr/bin/env python3
"""PyTorch's side of the GPU check's language-model steps (scripts/gpu_check.sh), in plain
PyTorch so that it needs nothing but torch on the GPU machine (no transformers, no download):
random weights of the same shapes as the folders Ember reads there.

  gpt2-train   GPT-2 124M (12 layers, 768 wide, 12 heads, vocabulary 50257, 1024 positions,
               tied head; nanoGPT's layout): a training step of --batch x --seq tokens under bf16
               autocast with AdamW (lr 6e-4, weight decay 0.1 on matrices only, betas 0.9/0.95,
               PyTorch's default implementation), gradient clipping at 1.0. --compile runs the
               model through torch.compile. Prints tokens/s and the model FLOP utilisation
               (6 x parameters x tokens + attention's 6 x layers x seq x width x tokens, over
               --peak-tflops).
  llama-decode Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 query and 8 key/value heads,
               intermediate 8192, vocabulary 128256, tied) in bf16: a prefill of --prompt tokens,
               then --new-tokens greedy decode steps against a preallocated key/value cache, as
               transformers' static cache does, eager. Prints prefill and decode tokens/s and the
               weight bytes a decode step reads times decode tokens/s.
  sdpa         scaled_dot_product_attention alone, causal, bf16, [--batch, --heads, L, --head-dim]
               for each L of --lengths: forward and forward + backward, TFLOP/s (a causal
               forward counts 2 x 2 x B x H x L x L x E / 2 FLOPs; the backward 2.5 times that).

Each prints one `result key=value ...` line a measurement (scripts/gpu_report.py reads them).
Usage: lm_gpu_torch.py gpt2-train|llama-decode|sdpa [--device cuda:0] [options]
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def peak_mem(dev):
    return torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0


# ---- GPT-2 ----
class GptBlock(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self, vocab, positions, layers, d, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(positions, d)
        self.h = nn.ModuleList(GptBlock(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def gpt2_train(a, dev):
    torch.manual_seed(0)
    model = Gpt2(a.vocab, max(a.seq, 1024), a.layers, a.width, a.heads).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95))
    fwd = torch.compile(model) if a.compile else model
    data = torch.randint(0, a.vocab, (a.steps + a.warmup, a.batch, a.seq + 1), device=dev)
    amp = dev.type == "cuda" or a.amp_on_cpu

    def step(i):
        x, y = data[i, :, :-1], data[i, :, 1:]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    for i in range(a.warmup):
        step(i)
    sync(dev)
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(a.steps):
        loss = step(a.warmup + i)
    sync(dev)
    secs = (time.perf_counter() - t0) / a.steps
    tokens = a.batch * a.seq
    flops = 6 * nparams * tokens + 6 * a.layers * a.seq * a.width * tokens
    tps = tokens / secs
    mfu = flops / secs / (a.peak_tflops * 1e12) if a.peak_tflops else 0.0
    print(f"result run=gpt2_train impl=torch{'_compile' if a.compile else ''} device={dev} params={nparams} "
          f"batch={a.batch} seq={a.seq} step_ms={secs * 1e3:.3f} tokens_per_s={tps:.1f} mfu={mfu:.4f} "
          f"loss={loss.item():.4f} warmup_s={warm_s:.2f} peak_bytes={peak_mem(dev)}", flush=True)


# ---- Llama ----
def rms_norm(x, w, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def llama_decode(a, dev):
    torch.manual_seed(0)
    dt = torch.bfloat16
    h, L, nh, nkv, inter, vocab = a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab
    hd = h // nh
    w = lambda *s: (torch.randn(*s, device=dev, dtype=torch.float32) * 0.02).to(dt)
    embed = w(vocab, h)
    layers = [dict(n1=torch.ones(h, device=dev, dtype=dt), q=w(nh * hd, h), k=w(nkv * hd, h), v=w(nkv * hd, h),
                   o=w(h, nh * hd), n2=torch.ones(h, device=dev, dtype=dt), gate=w(inter, h), up=w(inter, h),
                   down=w(h, inter)) for _ in range(L)]
    norm = torch.ones(h, device=dev, dtype=dt)
    total = a.prompt + a.new_tokens
    inv = 1.0 / (a.rope_theta ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(total, device=dev, dtype=torch.float32), inv)
    cos_t = torch.cat((ang.cos(), ang.cos()), -1).to(dt)
    sin_t = torch.cat((ang.sin(), ang.sin()), -1).to(dt)
    kc = [torch.zeros(1, nkv, total, hd, device=dev, dtype=dt) for _ in range(L)]
    vc = [torch.zeros(1, nkv, total, hd, device=dev, dtype=dt) for _ in range(L)]

    @torch.no_grad()
    def forward(ids, pos):
        t = ids.shape[1]
        x = embed[ids]
        cos, sin = cos_t[pos:pos + t], sin_t[pos:pos + t]
        for i, p in enumerate(layers):
            y = rms_norm(x, p["n1"])
            q = F.linear(y, p["q"]).view(1, t, nh, hd).transpose(1, 2)
            k = F.linear(y, p["k"]).view(1, t, nkv, hd).transpose(1, 2)
            v = F.linear(y, p["v"]).view(1, t, nkv, hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            kc[i][:, :, pos:pos + t] = k
            vc[i][:, :, pos:pos + t] = v
            kk, vv = kc[i][:, :, :pos + t], vc[i][:, :, :pos + t]
            y = F.scaled_dot_product_attention(q, kk, vv, is_causal=t > 1, enable_gqa=True)
            x = x + F.linear(y.transpose(1, 2).reshape(1, t, nh * hd), p["o"])
            y = rms_norm(x, p["n2"])
            x = x + F.linear(F.silu(F.linear(y, p["gate"])) * F.linear(y, p["up"]), p["down"])
        return F.linear(rms_norm(x[:, -1:], norm), embed).float()

    prompt = torch.randint(0, vocab, (1, a.prompt), device=dev)
    for _ in range(a.warmup):  # kernels and the allocator warmed on the same shapes
        forward(prompt, 0)
        forward(prompt[:, :1], a.prompt)
    sync(dev)
    t0 = time.perf_counter()
    logits = forward(prompt, 0)
    sync(dev)
    prefill_s = time.perf_counter() - t0
    nxt = logits.argmax(-1)
    t0 = time.perf_counter()
    for i in range(a.new_tokens):
        nxt = forward(nxt, a.prompt + i).argmax(-1)
    nxt.item()
    decode_s = time.perf_counter() - t0
    per_layer = 2 * (2 * nh * hd * h + 2 * nkv * hd * h + 3 * inter * h)
    step_bytes = L * per_layer + 2 * h * vocab + 2 * h * (2 * L + 1)
    tps = a.new_tokens / decode_s
    print(f"result run=llama_decode impl=torch device={dev} prompt={a.prompt} new_tokens={a.new_tokens} "
          f"prefill_tokens_per_s={a.prompt / prefill_s:.1f} decode_tokens_per_s={tps:.2f} "
          f"weight_bytes_per_token={step_bytes} weight_GBps={step_bytes * tps / 1e9:.1f} "
          f"peak_bytes={peak_mem(dev)}", flush=True)


# ---- attention ----
def sdpa(a, dev):
    torch.manual_seed(0)
    for n in (int(x) for x in a.lengths.split(",")):
        q, k, v = (torch.randn(a.batch, a.heads, n, a.head_dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        g = torch.randn(a.batch, a.heads, n, a.head_dim, device=dev, dtype=torch.bfloat16)
        fwd_flops = 2 * 2 * a.batch * a.heads * n * n * a.head_dim / 2

        def run(backward):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            if backward:
                o.backward(g)

        times = {}
        for backward in (False, True):
            for _ in range(3):
                run(backward)
            sync(dev)
            reps = max(3, int(a.min_time / max(1e-6, _time_once(run, backward, dev))))
            t0 = time.perf_counter()
            for _ in range(reps):
                run(backward)
            sync(dev)
            times[backward] = (time.perf_counter() - t0) / reps
        print(f"result run=sdpa impl=torch device={dev} batch={a.batch} heads={a.heads} seq={n} head_dim={a.head_dim} "
              f"fwd_ms={times[False] * 1e3:.4f} fwd_bwd_ms={times[True] * 1e3:.4f} "
              f"fwd_tflops={fwd_flops / times[False] / 1e12:.2f} "
              f"fwd_bwd_tflops={3.5 * fwd_flops / times[True] / 1e12:.2f}", flush=True)


def _time_once(run, backward, dev):
    t0 = time.perf_counter()
    run(backward)
    sync(dev)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("gpt2-train", "llama-decode", "sdpa"))
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--amp-on-cpu", action="store_true", help="bf16 autocast on the CPU too (a check run)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="the GPU's dense bf16 peak, for the MFU")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--lengths", default="1024,2048,4096,8192")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--min-time", type=float, default=0.5, help="sdpa: seconds each timing runs for")
    a = ap.parse_args()
    dev = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.what == "gpt2-train":
        a.batch, a.layers, a.heads, a.vocab = a.batch or 8, a.layers or 12, a.heads or 12, a.vocab or 50257
        gpt2_train(a, dev)
    elif a.what == "llama-decode":
        a.layers, a.heads, a.vocab = a.layers or 16, a.heads or 32, a.vocab or 128256
        llama_decode(a, dev)
    else:
        a.batch, a.heads = a.batch or 4, a.heads or 16
        sdpa(a, dev)


if __name__ == "__main__":
    main()
