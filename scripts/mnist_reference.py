#!/usr/bin/env python3
"""pytorch/examples' mnist/main.py on Fashion-MNIST for one epoch: the accuracy that
examples/mnist.c (the same program in C) must reach within 0.5 points.

Run:  python scripts/mnist_reference.py [data-dir [seed...]]   (default /usr/share/datasets/fashion-mnist, seed 1)
      needs torch and numpy, e.g. /work/venv-lm/bin/python (torch 2.15); no torchvision: the
      IDX files are read here, scaled to [0, 1] and normalized with main.py's (0.1307, 0.3081).
main.py's defaults: batch 64, test batch 1000, Adadelta lr 1.0, StepLR(step_size=1,
gamma=0.7), seed 1, shuffled training batches. Prints the test loss and accuracy after each
seed's epoch and writes the mean accuracy (a fraction) to tests/data/mnist_reference.txt,
which examples/mnist.c reads.
"""
import gzip
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR


class Net(nn.Module):
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


def idx(path):
    with gzip.open(path) as f:
        data = f.read()
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load(folder, train):
    prefix = "train" if train else "t10k"
    x = idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz")).astype(np.float32) / 255.0
    y = idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz")).astype(np.int64)
    x = (torch.from_numpy(x).unsqueeze(1) - 0.1307) / 0.3081
    return torch.utils.data.TensorDataset(x, torch.from_numpy(y))


def run(seed, folder):
    torch.manual_seed(seed)
    train_loader = torch.utils.data.DataLoader(load(folder, True), batch_size=64, shuffle=True)
    test_loader = torch.utils.data.DataLoader(load(folder, False), batch_size=1000)
    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    model.train()
    for data, target in train_loader:
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
    scheduler.step()
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    n = len(test_loader.dataset)
    print(f"seed {seed}: test loss {test_loss / n:.4f}, accuracy {correct}/{n} ({100.0 * correct / n:.2f}%)", flush=True)
    return correct / n


folder = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/datasets/fashion-mnist"
seeds = [int(a) for a in sys.argv[2:]] or [1]
accuracies = [run(s, folder) for s in seeds]
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "mnist_reference.txt"), "w") as f:
    f.write(f"{sum(accuracies) / len(accuracies):.4f}\n")
