#!/usr/bin/python3
"""Golden test data for Ember's core ops, computed with PyTorch.

Run:  /usr/bin/python3 scripts/golden_ops.py [out]   (default tests/data/golden_ops.bin)
Needs torch and numpy; the output is deterministic and committed, so CI needs neither.
tests/test_golden_ops.c replays every case through Ember on every available device.

File format (all little-endian):
  header  : magic b"EMGOLD01", u32 version (= 1), u32 number of cases
  case    : str name, str op, u8 nparams, f64 params[nparams],
            u8 ninputs, tensor inputs[ninputs],
            u8 expect: 0 = a tensor follows (the expected output),
                       1 = an error: u8 em_status code (the op must fail with it)
  str     : u16 length, bytes (ASCII, no terminator)
  tensor  : u8 dtype, u8 layout, u8 ndim, i64 shape[ndim] (the logical shape), data
  dtype   : Ember's em_dtype: 0 f32, 1 f64, 2 f16, 3 bf16, 4 i64, 5 i32, 6 u8, 7 bool (1 byte)
  layout  : how an input is laid out in memory, to test non-contiguous inputs:
            0 contiguous: data is row-major over shape
            1 transposed: data is row-major over shape with its last two dims swapped;
              the replay makes that tensor and calls em_transpose(t, -1, -2)
            2 strided: data is row-major over shape with the last dim doubled, the
              elements at odd positions being padding (garbage a kernel must not read);
              the replay calls em_slice(t, -1, 0, 2n, 2)
            Expected outputs are always contiguous (layout 0).

Ops and their params (dims may be negative):
  binary (a, b): add sub mul div pow maximum minimum eq ne lt le gt ge
  scalar (a; params [s]): add_scalar sub_scalar mul_scalar div_scalar pow_scalar
  clamp (a; [lo, hi], +-inf for an open side)
  unary (a): neg abs exp log sqrt tanh sigmoid relu gelu
  where (cond, a, b)
  sum mean max min (a; [keepdim, dims...]); no dims means every dim
  argmax argmin (a; [dim, keepdim])
  matmul (a, b);  softmax log_softmax (a; [dim])
  index_select gather (a, index; [dim]);  cat stack (tensors...; [dim])
  one_hot (index; [num_classes]);  to (a): cast to the expected dtype (checked bit-exact)
  contiguous (a): a contiguous copy of a (non-contiguous) input
  promote_types (no inputs; [dtype_a, dtype_b]): expected is a 0-d tensor of the
      promoted dtype (its value is 0 and unused)

Reference values: float32/float64 cases use PyTorch's CPU kernels directly. For float16
and bfloat16 the reference is computed in float32 from the same 16-bit inputs and rounded
once to the output dtype (what a GPU's opmath does; PyTorch 1.13 lacks most half kernels
on the CPU). Integral Python scalars on integer tensors are left out on purpose: Ember's
scalar argument is a double, so 2 and 2.0 cannot be told apart.
"""
import struct
import sys

import numpy as np
import torch

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int64, torch.int32, torch.uint8, torch.bool]
CODE = {dt: i for i, dt in enumerate(DTYPES)}
LOW = (torch.float16, torch.bfloat16)
# em_status codes (include/ember/error.h)
EM_ERR_ARGUMENT, EM_ERR_SHAPE, EM_ERR_DTYPE = 1, 2, 3

cases = []


def raw(t):
    """Bytes of a contiguous tensor in Ember's element encoding."""
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    if t.dtype == torch.bool:
        return t.to(torch.uint8).numpy().tobytes()
    return t.numpy().tobytes()


def padding_like(t):
    """Values that must never show up in a result (kernels must skip padding)."""
    if t.dtype.is_floating_point:
        return torch.full_like(t, 12345.0)
    if t.dtype == torch.bool:
        return torch.ones_like(t)
    return torch.full_like(t, 77)


def enc_tensor(t, layout=0):
    if layout == 1:
        assert t.dim() >= 2
        data = raw(t.transpose(-1, -2))
    elif layout == 2:
        assert t.dim() >= 1
        stored = torch.stack([t, padding_like(t)], dim=-1).reshape(*t.shape[:-1], 2 * t.shape[-1])
        data = raw(stored)
    else:
        data = raw(t)
    out = struct.pack("<BBB", CODE[t.dtype], layout, t.dim())
    out += b"".join(struct.pack("<q", s) for s in t.shape)
    return out + data


def enc_str(s):
    b = s.encode("ascii")
    return struct.pack("<H", len(b)) + b


def add(name, op, inputs, expected=None, params=(), error=None):
    """inputs: tensors or (tensor, layout) pairs; expected: a tensor, or error: a status code."""
    ins = [i if isinstance(i, tuple) else (i, 0) for i in inputs]
    rec = enc_str(name) + enc_str(op)
    rec += struct.pack("<B", len(params)) + b"".join(struct.pack("<d", float(p)) for p in params)
    rec += struct.pack("<B", len(ins)) + b"".join(enc_tensor(t, l) for t, l in ins)
    if error is not None:
        rec += struct.pack("<BB", 1, error)
    else:
        assert expected is not None
        rec += struct.pack("<B", 0) + enc_tensor(expected.contiguous())
    assert name not in {c[0] for c in cases}, name
    cases.append((name, rec))


def up(t):
    return t.float() if t.dtype in LOW else t


def lowref(fn, out_dtype, *ts):
    """fn computed in float32 from 16-bit inputs, rounded once to out_dtype."""
    return fn(*[up(t) for t in ts]).to(out_dtype)


def randn(*shape, dtype=torch.float32):
    return torch.randn(shape).to(dtype)


def randint(lo, hi, *shape, dtype=torch.int32):
    return torch.randint(lo, hi, shape).to(dtype)


BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
          "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum}
COMPARE = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
           "ge": torch.ge}
UNARY = {"neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log,
         "sqrt": torch.sqrt, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
         "gelu": torch.nn.functional.gelu}


def binary(name, op, a, b):
    fn = {**BINARY, **COMPARE}[op]
    ta, tb = (a[0] if isinstance(a, tuple) else a), (b[0] if isinstance(b, tuple) else b)
    out_dtype = torch.bool if op in COMPARE else torch.result_type(ta, tb)
    if op == "div" and not out_dtype.is_floating_point:
        out_dtype = torch.get_default_dtype()  # true division
    if ta.dtype in LOW or tb.dtype in LOW:
        exp = lowref(fn, out_dtype, ta, tb)
    else:
        exp = fn(ta, tb)
    assert exp.dtype == out_dtype
    add(name, op, [a, b], exp)


def gen_binary():
    shapes = [((5, 7), (5, 7)), ((3, 1, 4), (2, 4)), ((37,), ()), ((4, 1), (1, 6))]
    for op in BINARY:
        for i, (sa, sb) in enumerate(shapes):
            a, b = randn(*sa), randn(*sb)
            if op == "pow":
                a = a.abs() + 0.5
            if op == "div":
                b = b.sign() * (b.abs() + 0.25)
            binary(f"{op}_f32_bcast{i}", op, a, b)
        a, b = randn(5, 7), randn(5, 7)
        if op == "pow":
            a = a.abs() + 0.5
        binary(f"{op}_f32_transposed", op, a, (b, 1))
        binary(f"{op}_f32_strided", op, (a, 2), b)
    for op in ("add", "sub", "mul", "div", "maximum"):
        binary(f"{op}_f64", op, randn(3, 4, dtype=torch.float64), randn(4, dtype=torch.float64))
        binary(f"{op}_f16", op, randn(3, 4, dtype=torch.float16), randn(3, 1, dtype=torch.float16) + 3)
        binary(f"{op}_bf16", op, randn(3, 4, dtype=torch.bfloat16), randn(4, dtype=torch.bfloat16) + 3)
    for op in ("add", "sub", "mul", "maximum", "minimum"):
        binary(f"{op}_i32", op, randint(-50, 50, 4, 5), randint(-50, 50, 5))
        binary(f"{op}_i64", op, randint(-50, 50, 4, 5, dtype=torch.int64), randint(-50, 50, 4, 1, dtype=torch.int64))
    binary("add_u8", "add", randint(0, 100, 3, 4, dtype=torch.uint8), randint(0, 100, 4, dtype=torch.uint8))
    binary("div_i32_true_division", "div", randint(-20, 20, 3, 4), randint(1, 7, 3, 4))
    binary("div_i32_by_zero", "div", torch.tensor([3, -4, 0, 5], dtype=torch.int32),
           torch.tensor([0, 0, 0, 2], dtype=torch.int32))
    binary("pow_i32", "pow", randint(-4, 5, 3, 4), randint(0, 4, 3, 4))
    binary("pow_f32_negative_base", "pow", torch.tensor([-2.0, -3.0, -1.5, 4.0]), torch.tensor([3.0, 2.0, 0.5, -0.5]))
    nan = float("nan")
    binary("maximum_nan_propagates", "maximum", torch.tensor([1.0, nan, 3.0, nan]), torch.tensor([2.0, 0.0, nan, nan]))
    binary("minimum_nan_propagates", "minimum", torch.tensor([1.0, nan, 3.0, -1.0]), torch.tensor([2.0, 0.0, nan, -2.0]))
    # comparisons: ties are made likely by drawing small integers
    for op in COMPARE:
        a = randint(-3, 3, 5, 7).float()
        binary(f"{op}_f32", op, a, randint(-3, 3, 7).float())
        binary(f"{op}_f32_transposed", op, (a, 1), randint(-3, 3, 5, 7).float().t().contiguous().t())
        binary(f"{op}_i32_vs_f32", op, randint(-3, 3, 4, 3), randint(-3, 3, 3).float() + 0.5 * (op == "lt"))
        binary(f"{op}_nan", op, torch.tensor([nan, 1.0, nan, 2.0]), torch.tensor([nan, nan, 1.0, 2.0]))
        binary(f"{op}_f16", op, randint(-2, 2, 6, dtype=torch.float16), randint(-2, 2, 6, dtype=torch.float16))


def gen_promotion():
    pairs = [(torch.int32, torch.float32), (torch.int64, torch.float64), (torch.uint8, torch.int32),
             (torch.bool, torch.float16), (torch.int32, torch.float16), (torch.float16, torch.bfloat16),
             (torch.int64, torch.bfloat16), (torch.uint8, torch.bool), (torch.float16, torch.float32),
             (torch.bfloat16, torch.float32), (torch.bool, torch.int64), (torch.int32, torch.int64),
             (torch.float32, torch.float64), (torch.uint8, torch.float32)]
    for da, db in pairs:
        a = randint(0, 6, 2, 3, dtype=da)
        b = randint(0, 6, 3, dtype=db)
        binary(f"promote_add_{da}_{db}".replace("torch.", ""), "add", a, b)
    # a 0-d tensor does not widen a dimensioned tensor of its category...
    zd = [(torch.float16, torch.float32), (torch.int32, torch.int64), (torch.uint8, torch.int64),
          (torch.bfloat16, torch.float64),
          # ...but one of a higher category decides the dtype (int tensor + 0-d float64 -> float64)
          (torch.int32, torch.float64), (torch.bool, torch.int32),
          ]
    for da, db in zd:
        binary(f"promote_0d_{da}_{db}".replace("torch.", ""), "add",
               randint(0, 6, 2, 3, dtype=da), torch.tensor(2, dtype=db))
    binary("promote_0d_both", "add", torch.tensor(1.5, dtype=torch.float64), torch.tensor(2.5))
    # int tensor with a float scalar gives the default float dtype
    a = randint(-5, 5, 2, 3)
    add("scalar_i32_add_float", "add_scalar", [a], a + 2.5, params=[2.5])
    a = randint(-5, 5, 4, dtype=torch.int64)
    add("scalar_i64_mul_float", "mul_scalar", [a], a * 0.5, params=[0.5])
    a = randint(0, 9, 4, dtype=torch.uint8)
    add("scalar_u8_div_float", "div_scalar", [a], a / 4.0, params=[4.0])
    # promote_types for every pair
    for da in DTYPES:
        for db in DTYPES:
            r = torch.promote_types(da, db)
            add(f"promote_types_{CODE[da]}_{CODE[db]}", "promote_types", [], torch.zeros((), dtype=r),
                params=[CODE[da], CODE[db]])


def gen_scalar():
    x = randn(5, 7) * 2
    ops = [("add_scalar", 1.5, lambda t, s: t + s), ("sub_scalar", -2.25, lambda t, s: t - s),
           ("mul_scalar", 3.0, lambda t, s: t * s), ("div_scalar", 7.0, lambda t, s: t / s)]
    for op, s, fn in ops:
        add(f"{op}_f32", op, [x], fn(x, s), params=[s])
        add(f"{op}_f32_transposed", op, [(x, 1)], fn(x, s), params=[s])
        h = randn(3, 5, dtype=torch.float16)
        add(f"{op}_f16", op, [h], lowref(lambda t: fn(t, s), torch.float16, h), params=[s])
        b = randn(3, 5, dtype=torch.bfloat16)
        add(f"{op}_bf16", op, [b], lowref(lambda t: fn(t, s), torch.bfloat16, b), params=[s])
        d = randn(4, dtype=torch.float64)
        add(f"{op}_f64", op, [d], fn(d, s), params=[s])
    pos = torch.rand(5, 7) + 0.1
    for e in (2.0, 0.5, -1.0, 3.0, 0.0):
        add(f"pow_scalar_{e}", "pow_scalar", [pos], torch.pow(pos, e), params=[e])
    neg = torch.tensor([-2.0, -1.5, 0.0, 1.5, 2.0])
    add("pow_scalar_negative_base_int_exp", "pow_scalar", [neg], torch.pow(neg, 3.0), params=[3.0])
    add("pow_scalar_negative_base_frac_exp", "pow_scalar", [neg], torch.pow(neg, 0.5), params=[0.5])
    inf = float("inf")
    for i, (lo, hi) in enumerate([(-0.5, 0.5), (-inf, 0.2), (0.0, inf)]):
        add(f"clamp_{i}", "clamp", [x], torch.clamp(x, lo, hi), params=[lo, hi])
    add("clamp_strided", "clamp", [(x, 2)], torch.clamp(x, -1, 1), params=[-1, 1])
    add("clamp_nan", "clamp", [torch.tensor([float("nan"), 2.0, -2.0])],
        torch.clamp(torch.tensor([float("nan"), 2.0, -2.0]), -1, 1), params=[-1, 1])
    h = randn(2, 3, dtype=torch.float16) * 3
    add("clamp_f16", "clamp", [h], torch.clamp(h.float(), -1, 1).half(), params=[-1, 1])
    i = randint(-9, 9, 2, 5)
    add("clamp_i32", "clamp", [i], torch.clamp(i, -3, 4), params=[-3, 4])


def gen_unary():
    special = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, -1.0, 1e-40,
                            88.0, -88.0, 100.0, -100.0, 0.5])
    for op, fn in UNARY.items():
        x = randn(5, 7) * 2
        if op in ("log", "sqrt"):
            x = torch.rand(5, 7) * 10 + 1e-3
        add(f"{op}_f32", op, [x], fn(x))
        add(f"{op}_f32_transposed", op, [(x, 1)], fn(x))
        add(f"{op}_f32_strided", op, [(x, 2)], fn(x))
        add(f"{op}_f32_special", op, [special], fn(special))
        odd = randn(37) if op not in ("log", "sqrt") else torch.rand(37) + 0.01
        add(f"{op}_f32_odd_size", op, [odd], fn(odd))
        d = randn(3, 4, dtype=torch.float64)
        if op in ("log", "sqrt"):
            d = d.abs() + 0.01
        add(f"{op}_f64", op, [d], fn(d))
        for dt in LOW:
            h = randn(4, 6, dtype=dt) * 2
            if op in ("log", "sqrt"):
                h = (h.abs() + 0.01).to(dt)
            add(f"{op}_{str(dt)[6:]}", op, [h], lowref(fn, dt, h))
    for op in ("neg", "abs", "relu"):
        i = randint(-50, 50, 3, 4)
        add(f"{op}_i32", op, [i], UNARY[op](i))
        l = randint(-50, 50, 5, dtype=torch.int64)
        add(f"{op}_i64", op, [l], UNARY[op](l))


def gen_where():
    c = torch.rand(5, 7) > 0.5
    a, b = randn(5, 7), randn(5, 7)
    add("where_f32", "where", [c, a, b], torch.where(c, a, b))
    c1, a1, b0 = torch.rand(5, 1) > 0.5, randn(1, 7), torch.tensor(-1.0)
    add("where_broadcast", "where", [c1, a1, b0], torch.where(c1, a1, b0))
    add("where_transposed", "where", [(c, 1), (a, 1), (b, 2)], torch.where(c, a, b))
    ai = randint(-9, 9, 5, 7)
    add("where_promotes_i32_f32", "where", [c, ai, b], torch.where(c, ai, b))
    h = randn(5, 7, dtype=torch.float16)
    add("where_f16", "where", [c, h, torch.zeros(5, 7, dtype=torch.float16)],
        torch.where(c, h, torch.zeros(5, 7, dtype=torch.float16)))


def red(name, op, x, dims, keepdim, layout=0):
    fn = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}[op]
    if dims:
        ref = lambda t: fn(t, dim=tuple(dims), keepdim=keepdim)
    else:
        ref = lambda t: {"sum": torch.sum, "mean": torch.mean, "max": torch.max, "min": torch.min}[op](t)
        assert not keepdim
    if x.dtype in LOW and op in ("sum", "mean"):
        exp = lowref(ref, x.dtype, x)
    else:
        exp = ref(x)
    add(name, op, [(x, layout)], exp, params=[int(keepdim)] + list(dims))


def gen_reductions():
    x = randn(3, 4, 5)
    for op in ("sum", "mean", "max", "min"):
        red(f"{op}_all", op, x, [], False)
        red(f"{op}_dim1", op, x, [1], False)
        red(f"{op}_dims02_keepdim", op, x, [0, 2], True)
        red(f"{op}_dim_neg1_keepdim", op, x, [-1], True)
        red(f"{op}_transposed", op, x, [1], False, layout=1)
        red(f"{op}_strided_all", op, x, [], False, layout=2)
        red(f"{op}_f64", op, randn(4, 6, dtype=torch.float64), [0], False)
        red(f"{op}_f16", op, randn(4, 6, dtype=torch.float16), [1], False)
        red(f"{op}_bf16", op, randn(4, 6, dtype=torch.bfloat16), [], False)
    red("sum_long_row", "sum", randn(3, 1000), [1], False)
    red("mean_long_col", "mean", randn(1000, 3), [0], True)
    red("sum_i32_to_i64", "sum", randint(-100, 100, 4, 5), [1], False)
    red("sum_u8_to_i64", "sum", randint(0, 255, 300, dtype=torch.uint8), [], False)
    red("sum_bool_to_i64", "sum", torch.rand(4, 5) > 0.3, [0], False)
    red("max_i32", "max", randint(-100, 100, 4, 5), [1], True)
    red("min_i64", "min", randint(-100, 100, 4, 5, dtype=torch.int64), [], False)
    red("sum_empty_dim", "sum", torch.zeros(3, 0), [1], False)
    nan = float("nan")
    red("max_nan", "max", torch.tensor([[1.0, nan, 3.0], [4.0, 5.0, 6.0]]), [1], False)
    red("min_nan_all", "min", torch.tensor([1.0, nan, -3.0]), [], False)
    for op, fn in (("argmax", torch.argmax), ("argmin", torch.argmin)):
        t = randint(-3, 3, 4, 6).float()  # ties: the first index wins
        for dim, keep in ((0, False), (1, True), (-1, False)):
            add(f"{op}_dim{dim}_{int(keep)}", op, [t], fn(t, dim=dim, keepdim=keep), params=[dim, int(keep)])
        add(f"{op}_transposed", op, [(t, 1)], fn(t, dim=1), params=[1, 0])
        i = randint(-9, 9, 3, 5)
        add(f"{op}_i32", op, [i], fn(i, dim=1), params=[1, 0])
        n = torch.tensor([[1.0, nan, 3.0], [2.0, 7.0, -1.0]])
        add(f"{op}_nan", op, [n], fn(n, dim=1), params=[1, 0])


def gen_matmul():
    shapes = [((5, 7), (7, 3)), ((7,), (7,)), ((7,), (7, 3)), ((5, 7), (7,)), ((2, 5, 7), (7, 3)),
              ((2, 1, 5, 7), (3, 7, 4)), ((2, 5, 7), (2, 7, 3)), ((7,), (2, 7, 3)), ((64, 100), (100, 33)),
              ((1, 1), (1, 1))]
    for i, (sa, sb) in enumerate(shapes):
        a, b = randn(*sa), randn(*sb)
        add(f"matmul_{i}", "matmul", [a, b], torch.matmul(a, b))
    a, b = randn(6, 5), randn(5, 4)
    add("matmul_a_transposed", "matmul", [(a, 1), b], a @ b)
    add("matmul_b_transposed", "matmul", [a, (b, 1)], a @ b)
    add("matmul_both_transposed", "matmul", [(a, 1), (b, 1)], a @ b)
    add("matmul_strided", "matmul", [(a, 2), b], a @ b)
    ab, bb = randn(3, 4, 5), randn(3, 5, 2)
    add("matmul_batched_transposed", "matmul", [(ab, 1), bb], ab @ bb)
    d1, d2 = randn(4, 6, dtype=torch.float64), randn(6, 3, dtype=torch.float64)
    add("matmul_f64", "matmul", [d1, d2], d1 @ d2)
    for dt in LOW:
        h1, h2 = randn(8, 16, dtype=dt), randn(16, 5, dtype=dt)
        add(f"matmul_{str(dt)[6:]}", "matmul", [h1, h2], lowref(torch.matmul, dt, h1, h2))
    add("matmul_shape_error", "matmul", [randn(5, 7), randn(6, 3)], error=EM_ERR_SHAPE)


def gen_softmax():
    for op, fn in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
        x = randn(5, 7)
        add(f"{op}_last", op, [x], fn(x, -1), params=[-1])
        add(f"{op}_dim0", op, [x], fn(x, 0), params=[0])
        y = randn(2, 3, 4)
        add(f"{op}_3d_dim1", op, [y], fn(y, 1), params=[1])
        big = randn(4, 9) * 100
        add(f"{op}_large_values", op, [big], fn(big, 1), params=[1])
        add(f"{op}_transposed", op, [(x, 1)], fn(x, 1), params=[1])
        m = randn(3, 5)
        m[0, 1] = m[2, 0] = m[2, 4] = float("-inf")
        add(f"{op}_masked", op, [m], fn(m, 1), params=[1])
        d = randn(3, 4, dtype=torch.float64)
        add(f"{op}_f64", op, [d], fn(d, 1), params=[1])
        for dt in LOW:
            h = randn(3, 8, dtype=dt)
            add(f"{op}_{str(dt)[6:]}", op, [h], lowref(lambda t: fn(t, 1), dt, h), params=[1])
        add(f"{op}_dim_error", op, [x], error=EM_ERR_ARGUMENT, params=[2])


def gen_indexing():
    x = randn(5, 7)
    idx = torch.tensor([4, 0, 2, 2])
    add("index_select_dim0", "index_select", [x, idx], x.index_select(0, idx), params=[0])
    idx32 = torch.tensor([6, 1, 1], dtype=torch.int32)
    add("index_select_dim1_i32_index", "index_select", [x, idx32], x.index_select(1, idx32.long()), params=[1])
    add("index_select_transposed", "index_select", [(x, 1), idx], x.index_select(0, idx), params=[0])
    y = randn(2, 4, 3)
    add("index_select_3d", "index_select", [y, torch.tensor([3, 1])], y.index_select(1, torch.tensor([3, 1])), params=[1])
    iy = randint(-9, 9, 4, 3, dtype=torch.int64)
    add("index_select_i64_data", "index_select", [iy, torch.tensor([0, 3])], iy.index_select(0, torch.tensor([0, 3])), params=[0])
    a = randn(3, 4)
    g1 = torch.tensor([[0, 3], [1, 1], [2, 0]])
    add("gather_dim1", "gather", [a, g1], a.gather(1, g1), params=[1])
    g0 = torch.tensor([[2, 0, 1, 1], [0, 0, 2, 1]])
    add("gather_dim0", "gather", [a, g0], a.gather(0, g0), params=[0])
    add("gather_transposed", "gather", [(a, 1), g1], a.gather(1, g1), params=[1])
    b = randn(2, 3, 4)
    g3 = torch.randint(0, 3, (2, 2, 4))
    add("gather_3d", "gather", [b, g3], b.gather(1, g3), params=[1])
    labels = torch.tensor([[1], [0], [3]])  # the cross-entropy pattern: pick one class per row
    add("gather_labels", "gather", [a, labels], a.gather(1, labels), params=[1])


def gen_join():
    p, q = randn(2, 3), randn(4, 3)
    add("cat_dim0", "cat", [p, q], torch.cat([p, q], 0), params=[0])
    r, s = randn(2, 3), randn(2, 5)
    add("cat_dim1", "cat", [r, s], torch.cat([r, s], 1), params=[1])
    t1, t2, t3 = randn(2, 2, 1), randn(2, 2, 3), randn(2, 2, 2)
    add("cat_three_last", "cat", [t1, t2, t3], torch.cat([t1, t2, t3], -1), params=[-1])
    add("cat_transposed", "cat", [(p, 1), q], torch.cat([p, q], 0), params=[0])
    e = torch.zeros(0, 3)
    add("cat_empty_piece", "cat", [p, e, q], torch.cat([p, e, q], 0), params=[0])
    i1, i2 = randint(-9, 9, 3, dtype=torch.int64), randint(-9, 9, 2, dtype=torch.int64)
    add("cat_i64", "cat", [i1, i2], torch.cat([i1, i2]), params=[0])
    h1, h2 = randn(2, 2, dtype=torch.float16), randn(1, 2, dtype=torch.float16)
    add("cat_f16", "cat", [h1, h2], torch.cat([h1, h2]), params=[0])
    add("cat_shape_error", "cat", [randn(2, 3), randn(2, 4)], error=EM_ERR_SHAPE, params=[0])
    u, v, w = randn(2, 3), randn(2, 3), randn(2, 3)
    for d in (0, 1, 2, -1):
        add(f"stack_dim{d}", "stack", [u, v, w], torch.stack([u, v, w], d), params=[d])
    add("stack_transposed", "stack", [(u, 1), v], torch.stack([u, v]), params=[0])
    bs = torch.rand(3) > 0.5, torch.rand(3) > 0.5
    add("stack_bool", "stack", list(bs), torch.stack(bs), params=[0])
    add("stack_shape_error", "stack", [randn(2, 3), randn(3, 2)], error=EM_ERR_SHAPE, params=[0])
    F = torch.nn.functional
    oh = torch.tensor([0, 2, 1, 3])
    add("one_hot_1d", "one_hot", [oh], F.one_hot(oh, 4), params=[4])
    oh2 = torch.tensor([[0, 2, 1], [4, 1, 0]])
    add("one_hot_2d", "one_hot", [oh2], F.one_hot(oh2, 5), params=[5])
    add("one_hot_more_classes", "one_hot", [oh], F.one_hot(oh, 7), params=[7])


def gen_casts():
    f16_edges = torch.tensor([1.0, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -10, 65504.0, 65519.0, 65520.0,
                              -65520.0, 2 ** -24, 2 ** -25, 3 * 2 ** -26, 2 ** -14, 1e-8, -0.0, 0.1, 1 / 3,
                              float("inf"), float("-inf"), float("nan"), 2049.0, 4097.0, 0.5 + 2 ** -12])
    add("to_f32_f16_rounding", "to", [f16_edges], f16_edges.half())
    bf_edges = torch.tensor([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -7, 3.0e38, 3.4e38, -0.0, 0.1, 1 / 3,
                             1e-39, 1e-45, float("inf"), float("nan"), 257.0, 259.0, 65535.0, 1 + 2 ** -9])
    add("to_f32_bf16_rounding", "to", [bf_edges], bf_edges.bfloat16())
    x = randn(4, 5) * 100
    add("to_f32_f16_random", "to", [x], x.half())
    add("to_f32_bf16_random", "to", [x], x.bfloat16())
    add("to_f32_f16_transposed", "to", [(x, 1)], x.half())
    t = torch.tensor([-2.7, -2.5, -0.5, 0.0, 0.5, 2.5, 2.7, 1e9, -1e9, 123456.78])
    add("to_f32_i32_truncates", "to", [t], t.to(torch.int32))
    add("to_f32_i64_truncates", "to", [t], t.to(torch.int64))
    u = torch.tensor([0.0, 0.9, 1.5, 254.99, 255.0, 17.2])
    add("to_f32_u8", "to", [u], u.to(torch.uint8))
    bz = torch.tensor([0.0, -0.0, 1e-30, -2.0, float("nan"), float("inf")])
    add("to_f32_bool", "to", [bz], bz.to(torch.bool))
    b = torch.rand(2, 5) > 0.5
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8):
        add(f"to_bool_{str(dt)[6:]}", "to", [b], b.to(dt))
    l = torch.tensor([2 ** 53 + 1, 2 ** 24 + 1, -(2 ** 31), 2 ** 40 + 3, -7, 0], dtype=torch.int64)
    add("to_i64_f32", "to", [l], l.float())
    add("to_i64_f64", "to", [l], l.double())
    add("to_i64_i32_small", "to", [l[4:]], l[4:].int())
    i = torch.tensor([2049, -4097, 70000, 3, 0], dtype=torch.int32)
    add("to_i32_f16", "to", [i], i.half())
    add("to_i32_i64", "to", [i], i.long())
    add("to_i32_bool", "to", [i], i.bool())
    d = torch.tensor([1 + 2 ** -30, 1e-50, 1e300, -1e300, 0.1, float("nan")], dtype=torch.float64)
    add("to_f64_f32", "to", [d], d.float())
    h = randn(3, 4, dtype=torch.float16)
    add("to_f16_f32", "to", [h], h.float())
    add("to_f16_bf16", "to", [h], h.bfloat16())
    add("to_f16_f64", "to", [h], h.double())
    bb = randn(3, 4, dtype=torch.bfloat16)
    add("to_bf16_f32", "to", [bb], bb.float())
    add("to_bf16_f16", "to", [bb], bb.half())
    add("to_u8_f32", "to", [torch.tensor([0, 7, 255], dtype=torch.uint8)], torch.tensor([0.0, 7.0, 255.0]))


def gen_contiguous():
    x = randn(3, 5)
    add("contiguous_f32_transposed", "contiguous", [(x, 1)], x)
    add("contiguous_f32_strided", "contiguous", [(x, 2)], x)
    y = randn(2, 3, 4)
    add("contiguous_3d_transposed", "contiguous", [(y, 1)], y)
    l = randint(-9, 9, 4, 3, dtype=torch.int64)
    add("contiguous_i64_strided", "contiguous", [(l, 2)], l)
    h = randn(4, 3, dtype=torch.float16)
    add("contiguous_f16_transposed", "contiguous", [(h, 1)], h)
    b = torch.rand(3, 4) > 0.5
    add("contiguous_bool_transposed", "contiguous", [(b, 1)], b)


def gen_errors():
    add("add_shape_error", "add", [randn(3, 4), randn(5, 4)], error=EM_ERR_SHAPE)
    add("mean_of_int_error", "mean", [randint(0, 5, 3, 4)], error=EM_ERR_DTYPE, params=[0])
    add("sum_dim_error", "sum", [randn(3, 4)], error=EM_ERR_ARGUMENT, params=[0, 2])


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden_ops.bin"
    torch.manual_seed(20261101)
    np.random.seed(0)
    for gen in (gen_binary, gen_promotion, gen_scalar, gen_unary, gen_where, gen_reductions,
                gen_matmul, gen_softmax, gen_indexing, gen_join, gen_casts, gen_contiguous, gen_errors):
        gen()
    with open(out, "wb") as f:
        f.write(b"EMGOLD01" + struct.pack("<II", 1, len(cases)))
        for _, rec in cases:
            f.write(rec)
    size = sum(len(r) for _, r in cases) + 16
    print(f"wrote {len(cases)} cases, {size} bytes, to {out}")


if __name__ == "__main__":
    main()
