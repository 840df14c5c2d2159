#!/usr/bin/python3
"""PyTorch side of the mixed-precision benchmark (bench/run_amp.sh; Ember's side is
bench/amp_matmul.c, whose modes and output lines this mirrors):

  amp_torch.py matmul THREADS SIZE...
      square matmul GFLOP/s in float32 and bfloat16 (torch.matmul, best of several runs)
  amp_torch.py mlp THREADS f32|bf16 BATCH STEPS D0,D1,...,Dn
      a training step of Linear(D0,D1), ReLU, ..., Linear(Dn-1,Dn), cross-entropy, Adam
      (lr 1e-3) on one fixed random batch; bf16 runs the forward and the loss under
      torch.autocast('cpu', dtype=torch.bfloat16) (float32 master weights, as Ember's bf16 step
      casts them by hand). Median step time in ms after two warm-up steps, and the median
      and least CPU time of a step (all threads), as bench_amp_matmul prints them.
"""
import sys
import time

import torch
import torch.nn.functional as F


def matmul(threads, sizes):
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    for n in sizes:
        for dt, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
            a = torch.randn(n, n).to(dt)
            b = torch.randn(n, n).to(dt)
            reps = 3 if n >= 4096 else 5 if n >= 2048 else 10
            best = 0.0
            for r in range(reps + 1):
                t0 = time.perf_counter()
                c = torch.matmul(a, b)
                t = time.perf_counter() - t0
                del c
                if r > 0:
                    best = max(best, 2.0 * n ** 3 / t / 1e9)
            print(f"matmul dtype={name} n={n} threads={threads} gflops={best:.1f}")


def mlp(threads, dtype, batch, steps, dims):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(batch, dims[0])
    y = torch.randint(0, dims[-1], (batch,))
    times = []
    cpu = []
    loss = None
    for s in range(steps + 2):
        t0 = time.perf_counter()
        c0 = time.process_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if s >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
    times.sort()
    cpu.sort()
    print(f"mlp dims={'-'.join(map(str, dims))} batch={batch} dtype={dtype} threads={threads} "
          f"step_ms={times[steps // 2]:.2f} loss={loss.item():.4f} cpu_ms={cpu[steps // 2]:.2f} "
          f"min_cpu_ms={cpu[0]:.2f}")


def main():
    a = sys.argv[1:]
    if len(a) >= 3 and a[0] == "matmul":
        matmul(int(a[1]), [int(v) for v in a[2:]])
    elif len(a) == 6 and a[0] == "mlp" and a[2] in ("f32", "bf16"):
        mlp(int(a[1]), a[2], int(a[3]), int(a[4]), [int(v) for v in a[5].split(",")])
    else:
        sys.exit("usage: amp_torch.py matmul THREADS SIZE... | mlp THREADS f32|bf16 BATCH STEPS D0,D1,...")


if __name__ == "__main__":
    main()
