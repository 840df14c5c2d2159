#!/usr/bin/env python3
"""The GPU's measured roofline, through PyTorch, for scripts/gpu_check.sh: device-to-device
copy bandwidth (traffic: bytes read + written per second, as HBM figures count) and matmul
throughput per dtype at n x n x n, each the best of timed repeats after a warm-up, with the
device synchronized around each batch. Prints one JSON object:
  {"torch": "2.11...", "device": "NVIDIA H200", "copy_traffic_GBps": ...,
   "matmul_TFLOPs": {"bf16": ..., "f16": ..., "tf32": ..., "f32": ..., "f64": ...}, "n": 8192}
Usage: gpu_roofline_torch.py [--device cuda:0] [--n 8192] [--copy-mib 1024] [--min-time 0.5]
"""
import argparse
import json
import sys
import time

import torch


def best_seconds(fn, dev, min_time):
    fn()
    torch.cuda.synchronize(dev)
    best, spent, reps = float("inf"), 0.0, 1
    while spent < min_time:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize(dev)
        dt = time.perf_counter() - t0
        spent += dt
        best = min(best, dt / reps)
        if dt < 0.05:
            reps *= 2
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--copy-mib", type=int, default=1024)
    ap.add_argument("--min-time", type=float, default=0.5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit(f"PyTorch {torch.__version__} sees no CUDA device")
    dev = torch.device(a.device)
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(dev), "n": a.n}

    src = torch.ones(a.copy_mib << 18, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    s = best_seconds(lambda: dst.copy_(src), dev, a.min_time)
    out["copy_bytes"] = src.numel() * 4
    out["copy_traffic_GBps"] = 2 * src.numel() * 4 / s / 1e9
    del src, dst

    flops = 2.0 * a.n ** 3
    res = {}
    for name, dt, tf32 in (("bf16", torch.bfloat16, False), ("f16", torch.float16, False),
                           ("tf32", torch.float32, True), ("f32", torch.float32, False), ("f64", torch.float64, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        x = torch.randn(a.n, a.n, device=dev).to(dt)
        y = torch.randn(a.n, a.n, device=dev).to(dt)
        res[name] = flops / best_seconds(lambda: torch.mm(x, y), dev, a.min_time) / 1e12
        del x, y
    torch.backends.cuda.matmul.allow_tf32 = False
    out["matmul_TFLOPs"] = res
    print(json.dumps(out))


if __name__ == "__main__":
    main()
