#!/usr/bin/env python3
"""Golden data for Ember's losses, from PyTorch.

Run:  python scripts/golden_losses.py [out]   (default tests/data/golden_losses.safetensors)
      needs torch and safetensors, e.g. /work/venv-lm/bin/python (torch 2.15)
The output is deterministic and committed; tests/test_loss_golden.c replays every case.

Each case "c" has its options in the metadata entry "c" ("op=cross_entropy reduction=mean
ignore_index=2 label_smoothing=0.1 weight=1"; ignore_index=none means PyTorch's default) and
the tensors "c/x" (float32 input), "c/target" (int64 class indices, or float32
probabilities), "c/weight" (float32 [C], when weight=1), "c/gy" (the upstream gradient of the
loss: [] for mean and sum, the target's shape for none), "c/loss" and "c/dx" (the loss and
the gradient of sum(loss * gy) with respect to x, both computed in float64 from the float32
inputs). Ops: cross_entropy, nll_loss (x is then log-probabilities: log_softmax of random
logits) and mse_loss (target float32 of x's shape).
"""
import itertools
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(31)
tensors, meta = {}, {}


def put(case, m, **ts):
    assert case not in meta, case
    meta[case] = m
    for k, v in ts.items():
        tensors[case + "/" + k] = v.detach().contiguous().clone()


def run(case, op, x, target, reduction, weight=None, ignore_index=None, smoothing=0.0):
    x64 = x.double().requires_grad_()
    kw = {"reduction": reduction}
    if weight is not None:
        kw["weight"] = weight.double()
    if ignore_index is not None:
        kw["ignore_index"] = ignore_index
    t = target.double() if target.is_floating_point() else target
    if op == "cross_entropy":
        loss = F.cross_entropy(x64, t, label_smoothing=smoothing, **kw)
    elif op == "nll_loss":
        loss = F.nll_loss(x64, t, **kw)
    else:
        loss = F.mse_loss(x64, t, reduction=reduction)
    gy = torch.randn(loss.shape, dtype=torch.float32) if reduction == "none" else torch.tensor(1.5)
    (loss * gy.double()).sum().backward()
    m = "op=%s reduction=%s ignore_index=%s label_smoothing=%r weight=%d" % (
        op, reduction, "none" if ignore_index is None else ignore_index, smoothing, weight is not None)
    ts = dict(x=x, target=target, gy=gy, loss=loss.detach(), dx=x64.grad)
    if weight is not None:
        ts["weight"] = weight
    put(case, m, **ts)


REDUCTIONS = ("none", "sum", "mean")

# ---- cross_entropy with class indices: [N, C], [C] and [N, C, d1, d2] ----
N, C = 7, 5
x2 = torch.randn(N, C) * 2
t2 = torch.tensor([0, 4, -100, 2, 2, 1, 3])           # one default-ignored target
t2_ign2 = torch.tensor([0, 4, 1, 2, 2, 1, 3])          # for ignore_index=2
w = torch.rand(C) + 0.25
x1 = torch.randn(C)
t1 = torch.tensor(3)
x4 = torch.randn(3, C, 2, 2)
t4 = torch.randint(0, C, (3, 2, 2))
t4[1, 0, 1] = -100
for red, use_w, s in itertools.product(REDUCTIONS, (False, True), (0.0, 0.15)):
    tag = "%s_w%d_s%d" % (red, use_w, s > 0)
    wt = w if use_w else None
    run("ce2_" + tag, "cross_entropy", x2, t2, red, wt, None, s)
    run("ce2ign_" + tag, "cross_entropy", x2, t2_ign2, red, wt, 2, s)
    run("ce1_" + tag, "cross_entropy", x1, t1, red, wt, None, s)
    run("ce4_" + tag, "cross_entropy", x4, t4, red, wt, None, s)
    # every target ignored: mean is 0 / 0 = NaN, sum 0, gradients 0
    run("ceall_" + tag, "cross_entropy", x2, torch.full((N,), 4), red, wt, 4, s)

# ---- cross_entropy with class probabilities ----
p2 = torch.softmax(torch.randn(N, C), 1)
p4 = torch.softmax(torch.randn(3, C, 2, 2), 1)
for red, use_w, s in itertools.product(REDUCTIONS, (False, True), (0.0, 0.15)):
    tag = "%s_w%d_s%d" % (red, use_w, s > 0)
    run("ceprob2_" + tag, "cross_entropy", x2, p2, red, w if use_w else None, None, s)
    run("ceprob4_" + tag, "cross_entropy", x4, p4, red, w if use_w else None, None, s)

# ---- nll_loss on log-probabilities ----
lp2 = torch.log_softmax(torch.randn(N, C), 1)
lp4 = torch.log_softmax(torch.randn(3, C, 2, 2), 1)
for red, use_w in itertools.product(REDUCTIONS, (False, True)):
    tag = "%s_w%d" % (red, use_w)
    wt = w if use_w else None
    run("nll2_" + tag, "nll_loss", lp2, t2, red, wt)
    run("nll2ign_" + tag, "nll_loss", lp2, t2_ign2, red, wt, 2)
    run("nll4_" + tag, "nll_loss", lp4, t4, red, wt)

# ---- mse_loss ----
xm = torch.randn(4, 3)
ym = torch.randn(4, 3)
for red in REDUCTIONS:
    run("mse_" + red, "mse_loss", xm, ym, red)

out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden_losses.safetensors"
save_file(tensors, out, metadata=meta)
print("%d cases, %d tensors -> %s (torch %s)" % (len(meta), len(tensors), out, torch.__version__))
