"""PyTorch's side of bench/core_ops.c: the same ops, the same "key value" lines.
Run with /usr/bin/python3 (torch 1.13). Best of several repeats; threads as given by --threads."""
import sys
import time

import torch

REPEATS = 5


def best_of(fn, n):
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def main():
    threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
    torch.set_num_threads(threads)
    a, b = torch.ones(1), torch.ones(1)

    def tiny(n):
        for _ in range(n):
            torch.add(a, b)

    print(f"tiny_add_ns_t{threads} {best_of(tiny, 100000) * 1e9:.1f}")

    torch.manual_seed(0)
    x, w, bias = torch.randn(16, 16), torch.randn(16, 16), torch.randn(16)

    def linear(n):
        for _ in range(n):
            torch.matmul(x, w) + bias

    print(f"linear16_ns_t{threads} {best_of(linear, 50000) * 1e9:.1f}")

    big = 64 << 20
    a, b, c = torch.zeros(big), torch.ones(big), torch.ones(big)
    t_in = best_of(lambda n: [a.add_(b) for _ in range(n)], 1)
    t_out = best_of(lambda n: [torch.add(b, c) for _ in range(n)], 1)
    print(f"add_inplace_gbs_t{threads} {12 * big / t_in / 1e9:.2f}")
    print(f"add_gbs_t{threads} {12 * big / t_out / 1e9:.2f}")


if __name__ == "__main__":
    main()
