#!/usr/bin/python3
"""PyTorch side of the CNN benchmark (bench/run_cnn.sh): the network of `ember train --model cnn`
(tools/ember/model_cnn.c: the input standardized with mean 0.2860 and std 0.3530, Conv2d(1, 16, 5,
padding=2), ReLU, MaxPool2d(2), Conv2d(16, 32, 5), ReLU, MaxPool2d(2), Flatten, Linear(800, 128),
ReLU, Linear(128, 10)), cross-entropy, Adam(lr=1e-3) on Fashion-MNIST, fed
exactly the batches `ember train --model cnn --seed S --batch-size B` trains on (Ember's loader
order, from train_mlp_torch.py). The loop and the timing are train_mlp_torch.py's: the whole
dataset as one tensor, each batch gathered by indexing, only the training loop timed.

Prints one line per epoch and a summary line:
  result device=cpu batch=B threads=T epochs=N s_per_epoch=... best_s_per_epoch=... samples_per_s=...
         accuracy=... epoch_s=s1,s2,... version=V
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_mlp_torch import check_order, ember_order, load  # noqa: E402


class Standardize(nn.Module):
    """Ember's first layer: rows of 784 pixels as 1x28x28 images, standardized."""

    def forward(self, x):
        return (x.view(-1, 1, 28, 28) - 0.2860) / 0.3530


def cnn():
    return nn.Sequential(Standardize(), nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(800, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda:N (scripts/gpu_check.sh)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-samples", type=int, default=0, help="the first N training samples only (0: all)")
    ap.add_argument("--data", default=os.environ.get("EMBER_DATA_DIR", "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--check-order", metavar="BIN", help="bench_loader_order binary: verify the batch order")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr, ytr = load(a.data, True)
    xte, yte = load(a.data, False)
    if a.train_samples:
        xtr, ytr = xtr[:a.train_samples].clone(), ytr[:a.train_samples].clone()
    n = len(xtr)
    if a.check_order:
        check_order(a.check_order, n, a.seed, range(min(a.epochs, 2)))
    dev = torch.device(a.device)
    xtr, ytr, xte, yte = xtr.to(dev), ytr.to(dev), xte.to(dev), yte.to(dev)
    model = cnn().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    print(f"pytorch {torch.__version__} on {dev}, {torch.get_num_threads()} thread(s), batch {a.batch_size}, "
          f"{a.epochs} epochs, mkldnn {torch.backends.mkldnn.is_available()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    times, acc = [], 0.0
    for epoch in range(a.epochs):
        order = torch.tensor(ember_order(n, a.seed, epoch), dtype=torch.int64, device=dev)
        model.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
        nb = 0
        t0 = time.perf_counter()
        for start in range(0, n, a.batch_size):
            idx = order[start:start + a.batch_size]
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach()
            nb += 1
        train_loss = loss_sum.item() / nb
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
    print(f"result device={dev} batch={a.batch_size} threads={a.threads} epochs={a.epochs} s_per_epoch={mean:.4f} "
          f"best_s_per_epoch={min(times):.4f} samples_per_s={n / mean:.0f} accuracy={acc:.2f} "
          f"epoch_s={','.join(f'{t:.3f}' for t in times)} version={torch.__version__}")


if __name__ == "__main__":
    main()
