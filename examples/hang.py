"""A 2-rank gloo job that hangs at its third step: rank 1 is stuck reading its batch while rank 0
waits for it in all_reduce. The README's example for `ddpdoctor run` and `ddpdoctor stacks`:

    ddpdoctor run --hang-timeout 10 -- torchrun --nproc-per-node 2 examples/hang.py
"""

import time

import torch
import torch.distributed as dist


def read_batch(rank: int, step: int) -> torch.Tensor:
    if rank == 1 and step == 2:
        time.sleep(3600)  # a read that never returns: a dead network mount, a stuck lock
    return torch.ones(4)


def train() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(3):
        batch = read_batch(rank, step)
        dist.all_reduce(batch)
        print(f"rank {rank}: step {step} done\n", end="", flush=True)  # one write: lines never interleave
    dist.destroy_process_group()


if __name__ == "__main__":
    train()
