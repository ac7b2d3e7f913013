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
