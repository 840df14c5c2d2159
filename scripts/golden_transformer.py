#!/usr/bin/python3
"""Golden data for Ember's norms, embedding, attention and index_add/scatter_add, from PyTorch.

Run:  /usr/bin/python3 scripts/golden_transformer.py [out]
      (default tests/data/golden_transformer.safetensors; needs torch, Debian's 1.13 works)
The output is deterministic and committed; tests/test_transformer_golden.c replays every
case on every available device (CPU, PoCL), forward and backward.

Format: a safetensors file (written here, no safetensors package needed). Case c has
tensors "c/<name>": its inputs (float32 or int64), "c/gy" (the gradient fed to backward),
"c/y" (the expected output) and "c/d<input>" (the expected gradient of each float input).
The "__metadata__" entry "c" holds the case's op and parameters as "key=value" words, e.g.
"op=layer_norm nshape=1 eps=1e-05 affine=1 nc=1"; nc=1 asks the replay to feed x as a
non-contiguous tensor (same values, transposed strides). References are computed in
float64 from the float32 inputs, then stored as float32.
"""
import json
import struct
import sys

import torch

torch.manual_seed(1234)
cases = {}      # name -> (meta string, {tensor name: tensor})


def f32(*shape):
    return torch.randn(*shape).float()


def run(name, meta, inputs, fn, diff):
    """inputs: dict name -> tensor (float32 / int64); fn(**float64 inputs) -> output;
    diff: names of inputs whose gradient is expected."""
    ins = {}
    for k, v in inputs.items():
        if v.dtype == torch.float32:
            t = v.double().clone().requires_grad_(k in diff)
        else:
            t = v.clone()
        ins[k] = t
    y = fn(**ins)
    gy = torch.randn(y.shape).float()
    tensors = dict(inputs)
    tensors["y"] = y.detach().float()
    tensors["gy"] = gy
    if diff:
        y.backward(gy.double())
        for k in diff:
            tensors["d" + k] = ins[k].grad.float()
    cases[name] = (meta, tensors)


# ---- LayerNorm ----
for i, (shape, nshape, affine, nc) in enumerate([
        ((1, 5), (5,), True, False), ((3, 7), (7,), True, False), ((2, 3, 8), (8,), True, False),
        ((2, 3, 4), (3, 4), True, False), ((4, 6), (6,), False, False), ((5, 6), (6,), True, True),
        ((2, 1, 9), (9,), True, False)]):
    n = len(nshape)
    inputs = {"x": f32(*shape)}
    if affine:
        inputs["w"] = f32(*nshape)
        inputs["b"] = f32(*nshape)
    def fn(x, w=None, b=None, nshape=nshape):
        return torch.nn.functional.layer_norm(x, nshape, w, b, 1e-5)
    run("layer_norm_%d" % i, "op=layer_norm nshape=%d eps=1e-05 affine=%d nc=%d" % (n, affine, nc), inputs, fn,
        ["x", "w", "b"] if affine else ["x"])

# ---- BatchNorm (functional, training: output, gradients and updated running stats) ----
for i, (shape, nc) in enumerate([((4, 3), False), ((2, 3, 5), False), ((2, 3, 4, 5), False), ((1, 3, 4, 4), False),
                                  ((5, 4), True), ((3, 2, 3, 3), False)]):
    c = shape[1]
    inputs = {"x": f32(*shape), "w": f32(c), "b": f32(c), "rm": f32(c), "rv": torch.rand(c).float() + 0.5}
    out = {}
    def fn(x, w, b, rm, rv, out=out):
        rm, rv = rm.clone(), rv.clone()
        y = torch.nn.functional.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5)
        out["rm"], out["rv"] = rm, rv
        return y
    run("batch_norm_%d" % i, "op=batch_norm train=1 momentum=0.1 eps=1e-05 nc=%d" % nc, inputs, fn, ["x", "w", "b"])
    cases["batch_norm_%d" % i][1]["rm_after"] = out["rm"].float()
    cases["batch_norm_%d" % i][1]["rv_after"] = out["rv"].float()
# eval mode: the running statistics normalize
for i, shape in enumerate([(4, 3), (2, 3, 4, 5)]):
    c = shape[1]
    inputs = {"x": f32(*shape), "w": f32(c), "b": f32(c), "rm": f32(c), "rv": torch.rand(c).float() + 0.5}
    def fn(x, w, b, rm, rv):
        return torch.nn.functional.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5)
    run("batch_norm_eval_%d" % i, "op=batch_norm train=0 momentum=0.1 eps=1e-05 nc=0", inputs, fn, ["x", "w", "b"])

# BatchNorm2d module over several train steps, then eval: its buffers after each step
bn = torch.nn.BatchNorm2d(3).double()
with torch.no_grad():
    bn.weight.copy_(torch.randn(3))
    bn.bias.copy_(torch.randn(3))
steps = {"w": bn.weight.detach().float().clone(), "b": bn.bias.detach().float().clone()}
for s in range(3):
    x = f32(2, 3, 4, 4)
    steps["x%d" % s] = x
    y = bn(x.double())
    steps["y%d" % s] = y.detach().float()
    steps["rm%d" % s] = bn.running_mean.float().clone()
    steps["rv%d" % s] = bn.running_var.float().clone()
bn.eval()
x = f32(2, 3, 4, 4)
steps["xe"] = x
steps["ye"] = bn(x.double()).detach().float()
steps["nbt"] = bn.num_batches_tracked.clone()
cases["bn_module"] = ("op=bn_module steps=3", steps)

# ---- Embedding ----
for i, (rows, dim, idx, pad) in enumerate([
        (10, 4, torch.tensor([[1, 2, 1], [9, 0, 2]]), None), (10, 4, torch.tensor([[1, 0, 1], [0, 3, 2]]), 0),
        (7, 5, torch.tensor([3, 3, 6, 0]), -1), (1, 3, torch.tensor([0]), None), (6, 2, torch.tensor(4), None)]):
    inputs = {"idx": idx.long(), "w": f32(rows, dim)}
    def fn(idx, w, pad=pad):
        return torch.nn.functional.embedding(idx, w, padding_idx=pad)
    run("embedding_%d" % i, "op=embedding padding_idx=%s" % ("none" if pad is None else pad), inputs, fn, ["w"])


# ---- scaled_dot_product_attention (PyTorch 2's definition, written out for 1.13) ----
def sdpa(q, k, v, mask=None, causal=False):
    s = q @ k.transpose(-2, -1) / (q.shape[-1] ** 0.5)
    if causal:
        L, S = q.shape[-2], k.shape[-2]
        keep = torch.ones(L, S, dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    elif mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    return torch.softmax(s, -1) @ v


for i, (qs, ks, vs, mask, causal, nc) in enumerate([
        ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 7), None, False, False),
        ((2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4), None, True, False),
        ((1, 1, 3), (1, 4, 3), (1, 4, 2), "bool", False, False),
        ((2, 5, 8), (2, 6, 8), (2, 6, 3), "float", False, False),
        ((3, 7, 4), (3, 7, 4), (3, 7, 4), None, True, True),
        ((1, 1, 1, 5), (1, 1, 1, 5), (1, 1, 1, 5), None, False, False)]):
    inputs = {"q": f32(*qs), "k": f32(*ks), "v": f32(*vs)}
    L, S = qs[-2], ks[-2]
    if mask == "bool":
        m = torch.rand(L, S) > 0.3
        m[:, 0] = True       # every row attends somewhere
        inputs["mask"] = m
    elif mask == "float":
        inputs["mask"] = f32(L, S)
    def fn(q, k, v, mask=None, causal=causal):
        return sdpa(q, k, v, mask, causal)
    run("sdpa_%d" % i, "op=sdpa causal=%d nc=%d" % (causal, nc), inputs, fn, ["q", "k", "v"])

# ---- MultiheadAttention (nn.MultiheadAttention, batch_first=False) ----
for i, (E, H, L, S, N, kind) in enumerate([(8, 2, 5, 5, 2, "self"), (6, 3, 4, 3, 1, "cross"), (8, 4, 6, 6, 3, "causal"),
                                            (4, 1, 3, 3, 2, "boolmask")]):
    mha = torch.nn.MultiheadAttention(E, H).double()
    with torch.no_grad():
        mha.in_proj_bias.copy_(torch.randn(3 * E) * 0.1)
        mha.out_proj.bias.copy_(torch.randn(E) * 0.1)
    inputs = {"q": f32(L, N, E)}
    if kind == "cross":
        inputs["k"] = f32(S, N, E)
        inputs["v"] = f32(S, N, E)
    for k, v in mha.state_dict().items():
        inputs["p." + k] = v.float()
    if kind == "causal":
        inputs["mask"] = torch.triu(torch.full((L, S), float("-inf")), 1)
    if kind == "boolmask":
        m = torch.rand(L, S) > 0.6
        m[:, 0] = False
        inputs["mask"] = m
    def fn(q, k=None, v=None, mask=None, mha=mha, **params):
        with torch.no_grad():
            for name, p in mha.state_dict().items():
                p.copy_(params["p_" + name.replace(".", "_")])
        k = q if k is None else k
        v = q if v is None else v
        return mha(q, k, v, attn_mask=mask, need_weights=False)[0]
    ren = {k.replace("p.", "p_").replace(".", "_") if k.startswith("p.") else k: v for k, v in inputs.items()}
    diff = ["q"] + (["k", "v"] if kind == "cross" else [])
    run("mha_%d" % i, "op=mha embed_dim=%d num_heads=%d kind=%s" % (E, H, kind), ren, fn, diff)
    # parameter gradients
    mha.zero_grad()
    ins = {k: (v.double().requires_grad_(k in diff) if v.dtype == torch.float32 else v) for k, v in ren.items()
           if not k.startswith("p_")}
    y = mha(ins["q"], ins.get("k", ins["q"]), ins.get("v", ins["q"]), attn_mask=ins.get("mask"), need_weights=False)[0]
    y.backward(cases["mha_%d" % i][1]["gy"].double())
    for name, p in mha.named_parameters():
        cases["mha_%d" % i][1]["dp." + name] = p.grad.float()
    # store the parameters with their PyTorch names
    t = cases["mha_%d" % i][1]
    for k in list(t.keys()):
        if k.startswith("p_"):
            t["p." + k[2:].replace("out_proj_", "out_proj.")] = t.pop(k)

# ---- index_add / scatter_add ----
for i, (shape, dim, idx, srcshape) in enumerate([((5, 3), 0, [0, 2, 2, 4], (4, 3)), ((2, 4, 3), 1, [3, 3, 0], (2, 3, 3)),
                                                 ((6,), 0, [5, 0, 5, 5], (4,)), ((3, 2), -1, [1], (3, 1))]):
    inputs = {"a": f32(*shape), "idx": torch.tensor(idx).long(), "src": f32(*srcshape)}
    def fn(a, idx, src, dim=dim):
        return torch.index_add(a, dim, idx, src, alpha=1.5)
    run("index_add_%d" % i, "op=index_add dim=%d alpha=1.5" % dim, inputs, fn, ["a", "src"])
for i, (shape, dim, idxshape, srcshape) in enumerate([((4, 3), 0, (5, 3), (5, 3)), ((3, 5), 1, (3, 4), (3, 4)),
                                                       ((2, 3, 4), 2, (2, 2, 6), (2, 2, 6)), ((5,), 0, (7,), (7,))]):
    idx = torch.randint(0, shape[dim], idxshape)
    inputs = {"a": f32(*shape), "idx": idx.long(), "src": f32(*srcshape)}
    def fn(a, idx, src, dim=dim):
        return torch.scatter_add(a, dim, idx, src)
    run("scatter_add_%d" % i, "op=scatter_add dim=%d" % dim, inputs, fn, ["a", "src"])


def write(path):
    dt = {torch.float32: "F32", torch.int64: "I64", torch.bool: "BOOL"}
    header, blobs, off = {}, [], 0
    items = []
    for cname, (meta, ts) in cases.items():
        for tname, t in ts.items():
            items.append((cname + "/" + tname, t.contiguous()))
    items.sort()
    for name, t in items:
        b = t.numpy().tobytes() if t.dtype != torch.bool else t.to(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": dt[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {c: m for c, (m, _) in cases.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


write(sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden_transformer.safetensors")
print("%d cases" % len(cases))
