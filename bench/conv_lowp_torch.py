"""PyTorch's side of bench/conv_lowp.c: conv2d forward, backward to the data and backward
to the weights on the CNN's shapes (batch 64), float32 against bfloat16 on the CPU, one
thread, the minimum over reps of the process's CPU time.
Usage: python bench/conv_lowp_torch.py [reps]   (/usr/bin/python3: torch 1.13, or /work/venv-torch)"""
import sys
import time

import torch

SHAPES = [("conv1 64x1x28x28 -> 16, k5 p2", 64, 1, 28, 28, 16, 5, 2),
          ("conv2 64x16x14x14 -> 32, k5", 64, 16, 14, 14, 32, 5, 0)]


def bench(shape, dtype, reps):
    name, n, c, h, w, o, k, pad = shape
    x = torch.randn(n, c, h, w).to(dtype).requires_grad_()
    wt = torch.randn(o, c, k, k).to(dtype).requires_grad_()
    b = torch.randn(o).to(dtype).requires_grad_()
    best = [1e30, 1e30, 1e30]
    for r in range(reps + 2):
        t0 = time.thread_time()
        y = torch.nn.functional.conv2d(x, wt, b, padding=pad)
        t1 = time.thread_time()
        gx, = torch.autograd.grad(y, x, y, retain_graph=True)
        t2 = time.thread_time()
        gw, = torch.autograd.grad(y, wt, y)
        t3 = time.thread_time()
        if r >= 2:
            best = [min(a, t) for a, t in zip(best, (t1 - t0, t2 - t1, t3 - t2))]
    # autograd.grad for one input: ConvolutionBackward computes only that gradient (output_mask)
    print("torch %s conv %-30s %-9s fwd %7.3f ms | bwd data %7.3f ms | bwd weights %7.3f ms | all %7.3f ms"
          % (torch.__version__, name, str(dtype).replace("torch.", ""), 1e3 * best[0], 1e3 * best[1],
             1e3 * best[2], 1e3 * sum(best)))


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    torch.set_num_threads(1)
    for s in SHAPES:
        for dt in (torch.float32, torch.bfloat16):
            bench(s, dt, reps)


if __name__ == "__main__":
    main()
