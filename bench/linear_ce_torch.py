#!/usr/bin/env python3
"""PyTorch's side of bench/run_linear_ce.sh: one training step of
F.cross_entropy(F.linear(h, w, b).float(), target) (forward and backward, h, w, b requiring
grad) on the CPU, the median wall time of its rounds and the largest growth of the process's
resident memory during a step (VmHWM after, VmRSS before, the high-water mark reset through
/proc/self/clear_refs): PyTorch's CPU allocator keeps no statistics of its own.
Usage: linear_ce_torch.py N H V rounds threads [f32|bf16]; prints "key value" lines."""
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def main():
    n, h_dim, v, rounds, threads = (int(a) for a in sys.argv[1:6])
    dt = torch.bfloat16 if len(sys.argv) > 6 and sys.argv[6] == "bf16" else torch.float32
    torch.set_num_threads(threads)
    torch.manual_seed(5)
    h = torch.randn(n, h_dim).to(dt).requires_grad_()
    w = (torch.randn(v, h_dim) * 0.02).to(dt).requires_grad_()
    b = torch.zeros(v, dtype=dt).requires_grad_()
    t = torch.randint(0, v, (n,))
    times, peak = [], 0
    for r in range(rounds + 1):  # the first is a warm-up
        h.grad = w.grad = b.grad = None
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = status_kib("VmRSS")
        t0 = time.perf_counter()
        loss = F.cross_entropy(F.linear(h, w, b).float(), t)
        loss.backward()
        el = time.perf_counter() - t0
        grown = status_kib("VmHWM") - base
        del loss
        if r:
            times.append(el)
            peak = max(peak, grown)
    print(f"torch_version {torch.__version__}")
    print(f"torch_ms {1e3 * statistics.median(times):.1f}")
    print(f"torch_peak_rss_mib {peak / 1024:.1f}")


main()
