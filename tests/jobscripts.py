"""Tiny torchrun training scripts (gloo, CPU) that fail in known ways; tests write them into tmp_path.

Each script reads its scenario from argv[1]. Line numbers matter to the tests: they look for the
``# MARK:<name>`` comments, so the lines can move without breaking them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

TRAIN = r'''
import os, sys, time, signal
import torch
import torch.distributed as dist

mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
dist.init_process_group("gloo")
rank = dist.get_rank()


def dataset_read():
    time.sleep(3600)  # MARK:dataset


def train():
    t = torch.ones(4)
    for step in range(steps):
        if mode == "hang" and rank == 1 and step == 3:
            dataset_read()
        if mode == "raise" and rank == 1 and step == 3:
            raise RuntimeError("boom on rank 1")  # MARK:raise
        if mode == "sigkill" and rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "skip" and rank == 1 and step == 3:
            continue
        dist.all_reduce(t)  # MARK:all_reduce
        time.sleep(0.01)
    if mode == "skip":
        dist.barrier()  # MARK:barrier
    print(f"rank {rank} done {t[0].item()}", flush=True)


def model_mismatch():
    m = torch.nn.Linear(4, 4, bias=(rank == 0))
    torch.nn.parallel.DistributedDataParallel(m)


def unused():
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x)

    ddp = torch.nn.parallel.DistributedDataParallel(Two())
    for _ in range(2):
        ddp(torch.ones(2, 4)).sum().backward()


def mismatch():
    if rank == 0:
        dist.all_reduce(torch.ones(4))
    else:
        dist.broadcast(torch.ones(4), 0)


def syncbn():
    m = torch.nn.SyncBatchNorm(3)
    m(torch.ones(2, 3))


{"model-mismatch": model_mismatch, "unused": unused, "mismatch": mismatch, "syncbn": syncbn}.get(mode, train)()
dist.destroy_process_group()
'''


def write_train(tmp_path) -> str:
    path = os.path.join(str(tmp_path), "train.py")
    with open(path, "w") as f:
        f.write(TRAIN)
    return path


def line_of(mark: str) -> int:
    """The line number of ``# MARK:<mark>`` in the script as written."""
    for i, line in enumerate(TRAIN.splitlines(), start=1):
        if f"# MARK:{mark}" in line:
            return i
    raise KeyError(mark)


def torchrun(script: str, *args: str, nproc: int = 2) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--monitor-interval=0.2", script, *args]


def run_job(script: str, mode: str, env: dict, timeout: float = 60, nproc: int = 2, extra_env=None):
    """Run the scenario under torchrun and return the CompletedProcess (stdout+stderr merged)."""
    e = {**env, **(extra_env or {})}
    return subprocess.run(torchrun(script, mode, nproc=nproc), env=e, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- Programs in the style of the popular DDP tutorials (issue 14), made runnable on CPU (gloo) -------

SPAWN = r'''
"""An mp.spawn DDP trainer in the style of PyTorch's "Getting Started with DDP" (gloo, CPU, synthetic data)."""
import os, sys, threading, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)  # set in code, as the tutorial does
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def evaluate(model, seconds):
    """A quiet epoch: local compute, no output, no collective, for `seconds`."""
    end = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < end:
            model.module(torch.randn(64, 10)).sum()  # MARK:spawn_evaluate


def read_slow(path):
    n = 0
    with open(path, "rb") as f:
        while f.read(1):  # MARK:spawn_slow_read
            n += 1
    return n


def demo_basic(rank, world_size, port, mode, quiet):
    setup(rank, world_size, port)
    model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(model.parameters(), lr=0.001)
    print(f"rank {rank} starts", flush=True)
    t = torch.ones(2)
    for step in range(4):
        optimizer.zero_grad()
        loss_fn(model(torch.randn(20, 10)), torch.randn(20, 5)).backward()
        optimizer.step()
        if step == 1 and mode in ("quiet", "slowio"):
            if mode == "slowio" and rank == 1:
                read_slow(os.environ["SLOW_FILE"])  # rank 1 reads a slow file; rank 0 waits below
            elif mode == "quiet":
                evaluate(model, quiet)
        if mode == "raise" and rank == 1 and step == 2:
            raise RuntimeError("boom on rank 1")  # MARK:spawn_raise
        if mode == "skip" and rank == 1 and step == 2:
            dist.barrier()  # MARK:spawn_barrier
        else:
            dist.all_reduce(t)  # MARK:spawn_all_reduce
    print(f"rank {rank} done {t[0].item():g}", flush=True)
    cleanup()


def trickle(path, seconds):
    """Feed the slow file: one byte every 0.2 s for `seconds`, then end it."""
    with open(path, "wb", buffering=0) as f:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            f.write(b"x")
            time.sleep(0.2)


if __name__ == "__main__":
    port, mode, quiet = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    world_size = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    if mode == "slowio":
        threading.Thread(target=trickle, args=(os.environ["SLOW_FILE"], quiet), daemon=True).start()
    mp.spawn(demo_basic, args=(world_size, port, mode, quiet), nprocs=world_size, join=True)
'''

LAUNCH = r'''
"""A torch.distributed.launch-era script: the local rank comes as an argument."""
import argparse, os
import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("mode")
if os.environ.get("SCRIPT_READY") == "1":
    parser.add_argument("--local-rank", "--local_rank", type=int, default=0)
else:
    parser.add_argument("--local_rank", type=int, default=0)  # MARK:launch_parser (the old spelling only)
args = parser.parse_args()
dist.init_process_group("gloo")
t = torch.ones(3)
dist.all_reduce(t)
print(f"local rank {args.local_rank} sum {t[0].item():g}", flush=True)
dist.barrier()
dist.destroy_process_group()
'''

DDP_SKIP = r'''
"""A torchrun DDP loop (BatchNorm, so DDP's forward broadcasts buffers); one rank may skip a step."""
import os, sys, time
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

mode = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def train():
    for step in range(int(sys.argv[2]) if len(sys.argv) > 2 else 6):
        if mode == "skip" and rank == 1 and step == 3:
            continue  # MARK:ddp_skip
        opt.zero_grad()
        out = model(torch.randn(16, 8))  # MARK:ddp_forward
        out.sum().backward()  # MARK:ddp_backward
        opt.step()
    if rank == 1 and mode == "skip":
        time.sleep(0.5)
    dist.barrier()  # MARK:ddp_barrier


train()
print(f"rank {rank} trained", flush=True)
dist.destroy_process_group()
'''


def write_script(tmp_path, name: str, text: str) -> str:
    path = os.path.join(str(tmp_path), name)
    with open(path, "w") as f:
        f.write(text)
    return path


def mark_line(text: str, mark: str) -> int:
    """The line number of ``# MARK:<mark>`` in ``text`` as written."""
    for i, line in enumerate(text.splitlines(), start=1):
        if f"# MARK:{mark}" in line:
            return i
    raise KeyError(mark)
