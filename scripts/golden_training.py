#!/usr/bin/python3
"""Reference training runs made with PyTorch, replayed by tests/test_optim_golden.c.

A small MLP (16 -> 32 -> ReLU -> 32 -> GELU -> 4) starts from fixed weights and trains on a
fixed sequence of 100 batches three times:
  adam:  Adam(lr=1e-2), cross entropy
  sgd:   SGD(lr=0.05, momentum=0.9, weight_decay=1e-4), cross entropy
  adamw: AdamW(lr=1e-2, weight_decay=0.1), cross entropy with label_smoothing=0.1,
         clip_grad_norm_(max_norm=1.0) before every step
The loss of every step (before the update), the clipping norms and the final weights are
recorded. Run with /usr/bin/python3 (torch 1.13); writes into tests/data/.

File format (all little-endian): b"EMTD", u32 version = 1, u32 count, then count records of
  u32 name_len, name (UTF-8, no NUL), u32 dtype (Ember's em_dtype: 0 float32, 1 float64,
  4 int64), u32 ndim, i64 shape[ndim], the elements in row-major order.
"""
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPES = {torch.float32: 0, torch.float64: 1, torch.int64: 4}
STEPS, BATCH, IN, HIDDEN, OUT = 100, 16, 16, 32, 4


def write(path, tensors):
    with open(path, "wb") as f:
        f.write(b"EMTD" + struct.pack("<II", 1, len(tensors)))
        for name, t in tensors.items():
            t = t.detach().contiguous().cpu()
            raw = name.encode()
            f.write(struct.pack("<I", len(raw)) + raw)
            f.write(struct.pack("<II", DTYPES[t.dtype], t.dim()))
            f.write(struct.pack("<%dq" % t.dim(), *t.shape))
            f.write(t.numpy().tobytes())


def make_model():
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
                         nn.Linear(HIDDEN, OUT))


def train(init, xs, ys, make_opt, smoothing=0.0, clip=None):
    model = make_model()
    model.load_state_dict(init)
    opt = make_opt(model.parameters())
    losses, norms = [], []
    for x, y in zip(xs, ys):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y, label_smoothing=smoothing)
        loss.backward()
        if clip is not None:
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        losses.append(loss.item())
    return losses, norms, model.state_dict()


def main():
    torch.manual_seed(1234)
    torch.set_num_threads(1)
    init = make_model().state_dict()
    xs = torch.randn(STEPS, BATCH, IN)
    # labels that depend on the inputs, so that the loss really goes down
    proj = torch.randn(IN, OUT)
    ys = (xs @ proj + 0.5 * torch.randn(STEPS, BATCH, OUT)).argmax(-1)

    runs = {
        "adam": dict(make_opt=lambda p: torch.optim.Adam(p, lr=1e-2)),
        "sgd": dict(make_opt=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4)),
        "adamw": dict(make_opt=lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
                      smoothing=0.1, clip=1.0),
    }
    results = {}
    for name, kw in runs.items():
        losses, norms, final = train(init, xs, ys, **kw)
        results[name + ".losses"] = torch.tensor(losses, dtype=torch.float64)
        if norms:
            results[name + ".norms"] = torch.tensor(norms, dtype=torch.float64)
        for k, v in final.items():
            results[name + ".final." + k] = v
        print("%-6s loss %.4f -> %.4f" % (name, losses[0], losses[-1]))

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
    os.makedirs(out, exist_ok=True)
    write(os.path.join(out, "training_model.bin"), dict(init))
    write(os.path.join(out, "training_batches.bin"), {"x": xs, "y": ys})
    write(os.path.join(out, "training_runs.bin"), results)


if __name__ == "__main__":
    main()
