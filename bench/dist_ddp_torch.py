"""PyTorch DDP on the CPU (gloo, 2 processes): the step time of the MLP bench/dist.c times
(784-HIDDEN...-10, ReLU, Adam lr 1e-3, cross-entropy, batch 64 per rank of random data),
median of 200 steps after 20 warm-up steps, one thread per process.
Usage: python3 bench/dist_ddp_torch.py WORLD HIDDEN...   (prints one "torch_ddp ..." line)"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def mlp(hidden):
    layers, width = [], 784
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


def worker(rank, world, hidden, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = mlp(hidden)
    if world > 1:
        model = DDP(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.rand(64, 784, generator=g)
    y = torch.randint(0, 10, (64,), generator=g)
    times = []
    for step in range(220):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if step >= 20:
            times.append(time.perf_counter() - t0)
    times.sort()
    if rank == 0:
        print("torch_ddp world %d hidden %s step_ms %.3f torch %s" %
              (world, ",".join(map(str, hidden)), 1e3 * times[len(times) // 2], torch.__version__), flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    world = int(sys.argv[1])
    hidden = [int(h) for h in sys.argv[2:]]
    port = 29500 + os.getpid() % 1000
    if world == 1:
        worker(0, 1, hidden, port)
    else:
        mp.spawn(worker, args=(world, hidden, port), nprocs=world, join=True)
