#!/work/venv-torch/bin/python
"""Mixed precision references made with PyTorch, replayed by tests/test_amp_golden.c.

  ops:    every op of autocast's categories under torch.autocast("cpu", dtype=torch.bfloat16):
          "<op>" holds the result's values (as float32) and "<op>.dtype" its dtype (Ember's
          em_dtype code: 0 float32, 3 bfloat16)
  conv:   Conv2d(3, 4, 3, padding=1) -> max_pool2d(2) under the same autocast, backward outside
          it: both outputs' dtypes and values, the float32 parameters' gradients
  mlp:    Linear(6, 8) -> ReLU -> Linear(8, 5) and cross entropy under the same autocast,
          backward outside it: the loss, the logits' dtype and every parameter's gradient
  scaler: torch.amp.GradScaler("cpu", growth_interval=3) over 12 steps of
          loss = sum(weight * c_k) with inf/NaN injected into c at steps 2, 3 and 8, once with
          SGD(lr=0.1) and once with Adam(lr=0.1): after every step the scale, the growth
          tracker, whether the step was skipped and the weight
Run with PyTorch 2.3 or later (torch.amp.GradScaler on the CPU): /work/venv-torch/bin/python.
The file format is scripts/golden_training.py's (EMTD records).
"""
import os
import struct

import torch
import torch.nn.functional as F

DTYPES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 3, torch.int64: 4}
CODES = {torch.float32: 0, torch.bfloat16: 3, torch.float16: 2}


def write(path, tensors):
    with open(path, "wb") as f:
        f.write(b"EMTD" + struct.pack("<II", 1, len(tensors)))
        for name, t in tensors.items():
            t = t.detach().contiguous().cpu()
            if t.dtype in (torch.bfloat16, torch.float16):
                t = t.float()
            raw = name.encode()
            f.write(struct.pack("<I", len(raw)) + raw)
            f.write(struct.pack("<II", DTYPES[t.dtype], t.dim()))
            f.write(struct.pack("<%dq" % t.dim(), *t.shape))
            f.write(t.numpy().tobytes())


def ops(out):
    g = torch.Generator().manual_seed(14)
    x = torch.randn(4, 6, generator=g)
    w = torch.randn(6, 5, generator=g) * 0.5
    bias = torch.randn(5, generator=g)
    y = torch.randn(4, 5, generator=g)
    t = torch.tensor([1, 0, 4, 2])
    out.update({"in.x": x, "in.w": w, "in.bias": bias, "in.y": y, "in.t": t})
    res = {}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = x @ w                                  # lower precision
        res["matmul"] = h
        res["addmm"] = torch.addmm(bias, x, w)
        res["softmax"] = torch.softmax(h, 1)       # CPU: runs in its input's dtype
        res["log_softmax"] = torch.log_softmax(h, 1)
        res["sum"] = h.sum()
        res["mean"] = h.mean()
        res["exp"] = torch.exp(h)
        res["log"] = torch.log(h.abs() + 1)
        res["pow"] = torch.pow(h, 2.0)
        res["tanh"] = torch.tanh(h)
        res["relu"] = torch.relu(h)
        res["mse_loss"] = F.mse_loss(h, y)         # float32
        res["cross_entropy"] = F.cross_entropy(h, t)
        res["nll_loss"] = F.nll_loss(torch.log_softmax(h, 1), t)
        res["add"] = h + y                         # promote to the widest
        res["mul"] = h * y
        res["cat"] = torch.cat([h, y])
        res["stack"] = torch.stack([h, y])
        res["where"] = torch.where(y > 0, h, y)
    for k, v in res.items():
        out[k] = v
        out[k + ".dtype"] = torch.tensor([CODES[v.dtype]])


def mlp(out):
    g = torch.Generator().manual_seed(15)
    l1, l2 = torch.nn.Linear(6, 8), torch.nn.Linear(8, 5)
    with torch.no_grad():
        for p in list(l1.parameters()) + list(l2.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.4)
    # ReLU's gradient depends on the sign of each pre-activation; one that rounds to about 0
    # in bf16 can take either sign depending on the order of the GEMM's roundings, so draw
    # inputs whose pre-activations are all clear of 0.
    x = torch.randn(4, 6, generator=g)
    while (l1(x).abs().min() < 0.05).item():
        x = torch.randn(4, 6, generator=g)
    t = torch.tensor([3, 1, 0, 4])
    for n, p in [("w1", l1.weight), ("b1", l1.bias), ("w2", l2.weight), ("b2", l2.bias)]:
        out["mlp.in." + n] = p.detach().clone()
    out["mlp.in.x"], out["mlp.in.t"] = x, t
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = l2(torch.relu(l1(x)))
        loss = F.cross_entropy(logits, t)
    loss.backward()
    out["mlp.logits"] = logits
    out["mlp.logits.dtype"] = torch.tensor([CODES[logits.dtype]])
    out["mlp.loss"] = loss.reshape(1)
    out["mlp.loss.dtype"] = torch.tensor([CODES[loss.dtype]])
    for n, p in [("w1", l1.weight), ("b1", l1.bias), ("w2", l2.weight), ("b2", l2.bias)]:
        out["mlp.grad." + n] = p.grad
        out["mlp.grad." + n + ".dtype"] = torch.tensor([CODES[p.grad.dtype]])


STEPS, BAD = 12, {2: float("inf"), 3: float("nan"), 8: float("-inf")}


def scaler_run(out, name, make_opt):
    g = torch.Generator().manual_seed(16)
    lin = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(1, 4, generator=g))
    cs = torch.randn(STEPS, 1, 4, generator=g)
    for k, v in BAD.items():
        cs[k, 0, 1] = v
    out[name + ".w0"] = lin.weight.detach().clone()
    out[name + ".c"] = cs
    opt = make_opt(lin.parameters())
    scaler = torch.amp.GradScaler("cpu", growth_interval=3)
    scales, trackers, skipped, ws = [], [], [], []
    for k in range(STEPS):
        opt.zero_grad()
        loss = (lin.weight * cs[k]).sum()
        scaler.scale(loss).backward()
        before = lin.weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        trackers.append(int(scaler._growth_tracker.item()))
        skipped.append(1 if torch.equal(before, lin.weight.detach()) else 0)
        ws.append(lin.weight.detach().clone())
    out[name + ".scale"] = torch.tensor(scales, dtype=torch.float64)
    out[name + ".tracker"] = torch.tensor(trackers)
    out[name + ".skipped"] = torch.tensor(skipped)
    out[name + ".w"] = torch.stack(ws)


def conv(out):
    """conv2d is on autocast's lower-precision list (the CPU's and CUDA's), max_pool2d runs
    in its input's dtype: Conv2d(3, 4, 3, padding=1) -> max_pool2d(2) under the CPU's bf16
    autocast, then sum(z.float() * gy) backward outside it: the outputs' dtypes and values,
    the float32 parameters' float32 gradients."""
    g = torch.Generator().manual_seed(17)
    layer = torch.nn.Conv2d(3, 4, 3, padding=1)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) * 0.3)
        layer.bias.copy_(torch.randn(4, generator=g) * 0.1)
    # a window whose two largest outputs are within a bf16 rounding can pick either (and send
    # the gradient there): draw inputs whose pool windows all have a clear maximum
    while True:
        x = torch.randn(2, 3, 6, 6, generator=g)
        top2 = layer(x).detach().unfold(2, 2, 2).unfold(3, 2, 2).reshape(2, 4, 3, 3, 4).topk(2, -1).values
        if ((top2[..., 0] - top2[..., 1]).min() > 0.05).item():
            break
    gy = torch.randn(2, 4, 3, 3, generator=g)
    out["conv.in.x"], out["conv.in.gy"] = x, gy
    out["conv.in.w"], out["conv.in.b"] = layer.weight.detach().clone(), layer.bias.detach().clone()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        z = F.max_pool2d(y, 2)
    (z.float() * gy).sum().backward()
    for k, v in [("conv2d", y), ("max_pool2d", z), ("conv.grad.w", layer.weight.grad),
                 ("conv.grad.b", layer.bias.grad)]:
        out[k] = v
        out[k + ".dtype"] = torch.tensor([CODES[v.dtype]])


def main():
    out = {}
    ops(out)
    mlp(out)
    scaler_run(out, "sgd", lambda p: torch.optim.SGD(p, lr=0.1))
    scaler_run(out, "adam", lambda p: torch.optim.Adam(p, lr=0.1))
    conv(out)
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "tests", "data", "golden_amp.bin")
    write(path, out)
    print("wrote %d records to %s (torch %s)" % (len(out), os.path.normpath(path), torch.__version__))


if __name__ == "__main__":
    main()
