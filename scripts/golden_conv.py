#!/usr/bin/python3
"""Golden data for Ember's convolution and pooling, forward and backward, from PyTorch.

Run:  /usr/bin/python3 scripts/golden_conv.py [out]   (default tests/data/golden_conv.bin)
Needs torch; the output is deterministic and committed, so tests never need PyTorch.
tests/test_conv_golden.c replays every case on every device (float32 and float64, the CPU
through oneDNN and through the portable im2col path).

References are computed in float64 from inputs that are exactly representable in float32
(so a float32 run starts from the same numbers). File format (little-endian):
  header : b"EMCONV01", u32 number of cases
  case   : u16 name length, name, u8 kind (0 conv2d, 1 max_pool2d, 2 avg_pool2d,
           3 adaptive_avg_pool2d), i64 params[12], u8 transposed (1: x is stored with its
           last two dims swapped; the test builds it so and calls em_transpose(x, -1, -2)),
           then u8 count and that many tensors:
             conv2d     : x, w, [b,] gy, y, gx, gw, [gb]   (b, gb when params[7] == 1)
             max_pool2d : x, gy, y, indices, gx
             avg / adaptive : x, gy, y, gx
  tensor : u8 ndim, i64 shape[ndim] (logical), f64 data (row-major over the stored layout)
params: conv2d     stride h w, padding h w, dilation h w, groups, bias
        max_pool2d kernel h w, stride h w, padding h w, dilation h w, ceil_mode
        avg_pool2d kernel h w, stride h w, padding h w, ceil_mode, count_include_pad, divisor
        adaptive   output h w
"""
import struct
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(1234)
cases = []


def rnd(*shape):
    return torch.randn(*shape, dtype=torch.float32).double()


def tensor_bytes(t, transposed=False):
    t = t.detach().double()
    if transposed:
        shape = list(t.shape)
        data = t.transpose(-1, -2).contiguous()
    else:
        shape = list(t.shape)
        data = t.contiguous()
    out = struct.pack("<B", len(shape)) + struct.pack("<%dq" % len(shape), *shape)
    return out + data.numpy().astype("<f8").tobytes()


def add(name, kind, params, transposed, tensors):
    params = list(params) + [0] * (12 - len(params))
    cases.append((name, kind, params, transposed, tensors))


def conv(name, x_shape, o, k, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, bias=True,
         transposed=False):
    c = x_shape[-3]
    x = rnd(*x_shape).requires_grad_()
    w = (rnd(o, c // groups, *k) * 0.5).requires_grad_()
    b = rnd(o).requires_grad_() if bias else None
    y = F.conv2d(x, w, b, stride, padding, dilation, groups)
    gy = rnd(*y.shape)
    y.backward(gy)
    ts = [(x, transposed), (w, False)] + ([(b, False)] if bias else []) + [(gy, False), (y, False),
                                                                         (x.grad, False), (w.grad, False)]
    if bias:
        ts.append((b.grad, False))
    add(name, 0, [*stride, *padding, *dilation, groups, int(bias)], transposed, ts)


def max_pool(name, x_shape, k, stride=None, padding=(0, 0), dilation=(1, 1), ceil_mode=False, transposed=False):
    x = rnd(*x_shape).requires_grad_()
    y, idx = F.max_pool2d(x, k, stride, padding, dilation, ceil_mode, return_indices=True)
    gy = rnd(*y.shape)
    y.backward(gy)
    s = stride if stride is not None else (0, 0)
    add(name, 1, [*k, *s, *padding, *dilation, int(ceil_mode)], transposed,
        [(x, transposed), (gy, False), (y, False), (idx.double(), False), (x.grad, False)])


def avg_pool(name, x_shape, k, stride=None, padding=(0, 0), ceil_mode=False, count_include_pad=True,
             divisor=None, transposed=False):
    x = rnd(*x_shape).requires_grad_()
    y = F.avg_pool2d(x, k, stride, padding, ceil_mode, count_include_pad, divisor)
    gy = rnd(*y.shape)
    y.backward(gy)
    s = stride if stride is not None else (0, 0)
    add(name, 2, [*k, *s, *padding, int(ceil_mode), int(count_include_pad), divisor or 0], transposed,
        [(x, transposed), (gy, False), (y, False), (x.grad, False)])


def adaptive(name, x_shape, out, transposed=False):
    x = rnd(*x_shape).requires_grad_()
    y = F.adaptive_avg_pool2d(x, out)
    gy = rnd(*y.shape)
    y.backward(gy)
    add(name, 3, list(out), transposed, [(x, transposed), (gy, False), (y, False), (x.grad, False)])


conv("conv_basic", (2, 3, 7, 9), 4, (3, 3))
conv("conv_lenet1_batch1", (1, 1, 28, 28), 6, (5, 5), padding=(2, 2))
conv("conv_lenet2", (2, 6, 14, 14), 16, (5, 5))
conv("conv_stride_pad_groups2", (3, 4, 11, 10), 6, (3, 2), stride=(2, 3), padding=(1, 0), groups=2)
conv("conv_dilation_groups3_nobias", (2, 6, 9, 9), 6, (3, 3), padding=(2, 2), dilation=(2, 2), groups=3,
     bias=False)
conv("conv_1x1_stride2_groups4", (1, 4, 8, 7), 8, (1, 1), stride=(2, 2), groups=4)
conv("conv_mixed_noncontig", (2, 3, 5, 6), 2, (3, 3), stride=(1, 2), padding=(1, 1), dilation=(2, 1),
     transposed=True)
conv("conv_unbatched", (2, 6, 6), 3, (3, 3), padding=(1, 1))
conv("conv_depthwise_noncontig", (2, 4, 10, 12), 4, (3, 3), stride=(2, 2), padding=(1, 1), groups=4,
     transposed=True)
conv("conv_stride_past_kernel", (1, 2, 9, 10), 2, (2, 2), stride=(3, 3))
conv("conv_kernel_equals_input", (2, 2, 4, 5), 3, (4, 5))

max_pool("max_k2", (2, 3, 8, 8), (2, 2))
max_pool("max_k3_s2_p1", (1, 2, 7, 9), (3, 3), (2, 2), (1, 1))
max_pool("max_dilation_ceil", (2, 2, 10, 9), (3, 3), (2, 2), (1, 1), (2, 2), ceil_mode=True)
max_pool("max_ceil_drop", (1, 1, 5, 5), (2, 2), (2, 2), ceil_mode=True)
max_pool("max_noncontig", (2, 2, 7, 8), (2, 3), (1, 2), transposed=True)
max_pool("max_unbatched", (3, 6, 6), (2, 2))

avg_pool("avg_k2", (2, 3, 8, 8), (2, 2))
avg_pool("avg_k3_s2_p1", (1, 2, 7, 9), (3, 3), (2, 2), (1, 1))
avg_pool("avg_no_pad_count_ceil", (2, 2, 8, 7), (3, 3), (2, 2), (1, 1), ceil_mode=True, count_include_pad=False)
avg_pool("avg_divisor", (1, 3, 6, 7), (3, 2), (2, 1), (1, 1), divisor=5)
avg_pool("avg_ceil_pad", (1, 2, 7, 7), (3, 3), (2, 2), (1, 1), ceil_mode=True)
avg_pool("avg_noncontig", (2, 2, 6, 9), (2, 2), transposed=True)

adaptive("adaptive_7x9_to_3x4", (2, 3, 7, 9), (3, 4))
adaptive("adaptive_even", (1, 2, 8, 8), (4, 4))
adaptive("adaptive_global", (2, 4, 5, 7), (1, 1))
adaptive("adaptive_upsample", (1, 1, 4, 4), (6, 5))
adaptive("adaptive_noncontig", (2, 2, 9, 6), (4, 3), transposed=True)

out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden_conv.bin"
with open(out, "wb") as f:
    f.write(b"EMCONV01" + struct.pack("<I", len(cases)))
    for name, kind, params, transposed, tensors in cases:
        nb = name.encode()
        f.write(struct.pack("<H", len(nb)) + nb + struct.pack("<B", kind))
        f.write(struct.pack("<12q", *params) + struct.pack("<BB", int(transposed), len(tensors)))
        for t, tr in tensors:
            f.write(tensor_bytes(t, tr))
print("wrote %d cases to %s" % (len(cases), out))
