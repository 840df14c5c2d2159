#!/usr/bin/env python3
"""Golden data for em_linear_cross_entropy, from PyTorch.

Run:  /work/venv-lm/bin/python scripts/golden_linear_ce.py [out]
      (default tests/data/golden_linear_ce.safetensors; needs torch and safetensors)
The output is deterministic and committed; tests/test_linear_ce.c replays every case on
every available device with several chunk sizes.

Each case "c/<tensor>" has its options in the metadata entry "c":
  reduction=mean|sum|none smoothing=S ignore=I bias=0|1 dtype=f32|bf16
Tensors: h [N, H], w [V, H], b [V] (bias=1), target int64 [N] (some rows are ignore_index),
gy (the loss's gradient: 2 for mean, 1.5 for sum, [N] for none), loss, dh, dw, db (bias=1).
The reference is F.cross_entropy(F.linear(h, w, b).float(), target, ignore_index=I,
reduction=R, label_smoothing=S): float32 cases computed in float64 and stored in float32;
bf16 cases keep PyTorch's bf16 linear (float32 sums rounded to bf16), its float32 loss, and
its bf16 gradients (the logits' gradient rounded to bf16 by the cast's backward).
"""
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(2026)
tensors, meta = {}, {}
N, H, V = 10, 16, 37


def put(case, m, **ts):
    meta[case] = m
    for k, v in ts.items():
        tensors[case + "/" + k] = v.detach().contiguous().clone()


def case(name, reduction, smoothing, ignore, bias, dtype):
    h = torch.randn(N, H)
    w = torch.randn(V, H) * 0.5
    b = torch.randn(V) * 0.1
    target = torch.randint(0, V, (N,))
    target[2] = ignore
    target[7] = ignore
    # mean: 2 (a power of two: the gradients kept from the forward, scaled exactly); sum: 1.5 (bf16
    # runs the chunks again, as PyTorch rounds 1.5 * (p - q) once)
    gy = torch.randn(N) if reduction == "none" else torch.tensor(2.0 if reduction == "mean" else 1.5)
    if dtype == "f32":
        h0, w0, b0 = h, w, b
        h64, w64, b64 = (t.double().requires_grad_() for t in (h0, w0, b0))
        logits = F.linear(h64, w64, b64 if bias else None)
        work = (h64, w64, b64)
    else:
        h0, w0, b0 = (t.to(torch.bfloat16) for t in (h, w, b))
        hb, wb, bb = (t.clone().requires_grad_() for t in (h0, w0, b0))
        logits = F.linear(hb, wb, bb if bias else None).float()
        work = (hb, wb, bb)
    loss = F.cross_entropy(logits, target, ignore_index=ignore, reduction=reduction, label_smoothing=smoothing)
    loss.backward(gy.to(loss.dtype))
    out_dt = torch.float32 if dtype == "f32" else torch.bfloat16
    ts = {"h": h0, "w": w0, "target": target, "gy": gy, "loss": loss.float(),
          "dh": work[0].grad.to(out_dt), "dw": work[1].grad.to(out_dt)}
    if bias:
        ts["b"] = b0
        ts["db"] = work[2].grad.to(out_dt)
    put(name, f"reduction={reduction} smoothing={smoothing} ignore={ignore} bias={int(bias)} dtype={dtype}", **ts)


for dtype in ("f32", "bf16"):
    for reduction in ("mean", "sum", "none"):
        case(f"{reduction}_{dtype}", reduction, 0.0, -100, True, dtype)
        case(f"{reduction}_smooth_{dtype}", reduction, 0.1, -100, True, dtype)
    case(f"mean_nobias_ignore5_{dtype}", "mean", 0.2, 5, False, dtype)

save_file(tensors, sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden_linear_ce.safetensors", metadata=meta)
