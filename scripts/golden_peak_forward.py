#!/usr/bin/env python3
"""PyTorch's peak memory in the forward of pytorch/examples' mnist Net, for Ember's test.

Run:  python scripts/golden_peak_forward.py [out]   (default tests/data/golden_peak_forward.txt)
      needs torch, e.g. /work/venv-lm/bin/python (torch 2.15)
The test batch of 1000 [1000, 1, 28, 28] goes through mnist/main.py's Net in eval mode under
no_grad, written as there (x = F.relu(x): each intermediate is freed when x is rebound). The
peak is counted over the tensors the ops return (a dispatch mode adds each new storage's bytes
and subtracts them when it is freed), so it is what Python's references keep alive, without
the allocator's rounding or caching: the number tests/test_nn_rebind.c holds Ember's
allocator to. The output is one line, the peak in bytes; it depends only on the shapes.
"""
import sys
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode


class Net(nn.Module):  # pytorch/examples mnist/main.py
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


class LiveBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.current = self.peak = 0
        self.live = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if key in self.live:  # a view of a tensor already counted
                continue
            self.live.add(key)
            self.current += size
            self.peak = max(self.peak, self.current)
            weakref.finalize(t, self.freed, key, size)
        return out

    def freed(self, key, size):
        self.current -= size
        self.live.discard(key)


torch.manual_seed(1)
model = Net().eval()
x = torch.rand(1000, 1, 28, 28)
counter = LiveBytes()
with torch.no_grad(), counter:
    y = model(x)
out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden_peak_forward.txt"
with open(out, "w") as f:
    f.write(f"{counter.peak}\n")
print(f"peak {counter.peak} bytes ({counter.peak / 1e6:.1f} MB) -> {out}")
