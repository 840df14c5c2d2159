#!/usr/bin/python3
"""PyTorch side of the training benchmarks (bench/run_train.sh on the CPU, scripts/gpu_check.sh on
a GPU with --device cuda): the seed's MLP
(784-256-10, ReLU), cross-entropy, Adam(lr=1e-3) on Fashion-MNIST, fed exactly the batches
`ember train --seed S --batch-size B` trains on (Ember's loader order, reimplemented below).

The loop is the fastest fair one: the whole dataset as one tensor, each batch gathered by
plain tensor indexing (no DataLoader), zero_grad(set_to_none), the batch loss summed on the
device as ember train does. Only the training loop is timed (on a GPU, synchronized at both
ends); the test accuracy is measured after every epoch, outside the timing. On a GPU the data,
the model and each epoch's order live on the device, as in `ember train --device cuda:0`.

Prints one line per epoch and, last, a summary line:
  result device=D batch=B threads=T epochs=N s_per_epoch=... best_s_per_epoch=... samples_per_s=... accuracy=...
         epoch_s=s1,s2,... version=V
"""
import argparse
import gzip
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

MASK = (1 << 64) - 1


def splitmix64(state):
    """One splitmix64 step: (new state, output), as src/data/loader.c computes it."""
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def bounded(state, bound):
    """Uniform in [0, bound) by Lemire's method, exactly as loader.c's `bounded`."""
    state, r = splitmix64(state)
    m = r * bound
    low = m & MASK
    if low < bound:
        threshold = ((1 << 64) - bound) % bound  # -bound % bound in uint64 arithmetic
        while low < threshold:
            state, r = splitmix64(state)
            m = r * bound
            low = m & MASK
    return state, m >> 64


def ember_order(n, seed, epoch):
    """Ember's make_order: Fisher-Yates seeded with seed + epoch."""
    perm = list(range(n))
    s = (seed + epoch) & MASK
    for i in range(n - 1, 0, -1):
        s, j = bounded(s, i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def check_order(binary, n, seed, epochs):
    """Compares our order with Ember's own loader (bench_loader_order) for the given epochs."""
    for e in epochs:
        out = subprocess.run([binary, str(n), str(seed), str(e)], check=True, capture_output=True, text=True).stdout
        theirs = [int(v) for v in out.split()]
        ours = ember_order(n, seed, e)
        if theirs != ours:
            first = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b) if len(ours) == len(theirs) else -1
            sys.exit(f"batch order differs from Ember's at epoch {e}, position {first}")
    print(f"batch order: identical to Ember's loader for epochs {list(epochs)} ({n} samples, seed {seed})")


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(data_dir, stem):
    for name in (stem, stem + ".gz"):
        p = os.path.join(data_dir, name)
        if os.path.exists(p):
            return p
    sys.exit(f"{stem}[.gz] not found in {data_dir}")


def load(data_dir, train):
    prefix = "train" if train else "t10k"
    x = read_idx(find(data_dir, f"{prefix}-images-idx3-ubyte"))
    y = read_idx(find(data_dir, f"{prefix}-labels-idx1-ubyte"))
    x = torch.from_numpy(x.reshape(len(x), 784).astype(np.float32) / np.float32(255.0))
    return x, torch.from_numpy(y.astype(np.int64))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=os.environ.get("EMBER_DATA_DIR", "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--check-order", metavar="BIN", help="bench_loader_order binary: verify the batch order")
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"--device {a.device}: PyTorch {torch.__version__} sees no CUDA device")
    xtr, ytr = load(a.data, True)
    xte, yte = load(a.data, False)
    xtr, ytr, xte, yte = xtr.to(dev), ytr.to(dev), xte.to(dev), yte.to(dev)
    n = len(xtr)
    if a.check_order:
        check_order(a.check_order, n, a.seed, range(min(a.epochs, 2)))

    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"pytorch {torch.__version__} on {a.device} ({where}), {torch.get_num_threads()} thread(s), batch {a.batch_size}, "
          f"{a.epochs} epochs, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    times, acc = [], 0.0
    for epoch in range(a.epochs):
        order = torch.tensor(ember_order(n, a.seed, epoch), dtype=torch.int64, device=dev)  # made outside the timing,
        model.train()                                                           # as Ember's is cheap
        loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
        nb = 0
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for start in range(0, n, a.batch_size):
            idx = order[start:start + a.batch_size]
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach()
            nb += 1
        train_loss = loss_sum.item() / nb  # waits for the device
        seconds = time.perf_counter() - t0
        times.append(seconds)
        model.eval()
        with torch.no_grad():
            logits = model(xte)
            acc = (logits.argmax(1) == yte).double().mean().item() * 100
            test_loss = F.cross_entropy(logits, yte).item()
        print(f"epoch {epoch + 1}/{a.epochs}: train loss {train_loss:.4f}, test accuracy {acc:.2f}%, "
              f"test loss {test_loss:.4f}, {n / seconds:.0f} samples/s ({seconds:.2f} s)", flush=True)
    mean = sum(times) / len(times)
    print(f"result device={a.device} batch={a.batch_size} threads={a.threads} epochs={a.epochs} s_per_epoch={mean:.4f} "
          f"best_s_per_epoch={min(times):.4f} samples_per_s={n / mean:.0f} accuracy={acc:.2f} "
          f"epoch_s={','.join(f'{t:.3f}' for t in times)} version={torch.__version__}")


if __name__ == "__main__":
    main()
