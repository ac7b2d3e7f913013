"""Training programs with silent bugs (and their clean twins) for ``ddpdoctor run``'s watches (issue 24).

Tests write them into tmp_path and run them unchanged under ``ddpdoctor run``; the ``# MARK:<name>``
comments give the lines the findings must name (:func:`jobscripts.mark_line`).
"""

from __future__ import annotations

# The program of ../shared/seeds/001_06ace5d1ddaa1264.txt (a Chinese DDP tutorial's mnist_train.py, "adapted
# from the official imagenet example"), as its user wrote it: mp.spawn, DDP, DistributedSampler, and no
# set_epoch. Changed only to run here: a small in-memory dataset instead of the MNIST download, and on CPU
# (gloo, no device_ids, the process count from --nprocs as there is no GPU to count).
SEED = r'''
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.utils.data
import torch.utils.data.distributed

parser = argparse.ArgumentParser(description="PyTorch MNIST Training")
parser.add_argument("-j", "--workers", default=4, type=int)
parser.add_argument("--epochs", default=3, type=int)
parser.add_argument("--start-epoch", default=0, type=int)
parser.add_argument("-b", "--batch-size", default=32, type=int)
parser.add_argument("--lr", "--learning-rate", default=0.01, type=float)
parser.add_argument("--momentum", default=0.9, type=float)
parser.add_argument("--world-size", default=1, type=int)
parser.add_argument("--rank", default=0, type=int)
parser.add_argument("--dist-url", default="tcp://127.0.0.1:23456", type=str)
parser.add_argument("--dist-backend", default="gloo", type=str)
parser.add_argument("--nprocs", default=2, type=int)
parser.add_argument("--set-epoch", action="store_true", help="the fixed program (the clean twin)")


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 8, 5)
        self.conv2 = nn.Conv2d(8, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def main():
    args = parser.parse_args()
    args.distributed = args.world_size > 1 or args.nprocs > 1
    ngpus_per_node = args.nprocs
    args.world_size = ngpus_per_node * args.world_size
    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))


def main_worker(gpu, ngpus_per_node, args):
    args.gpu = gpu
    args.rank = args.rank * ngpus_per_node + gpu
    dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                            world_size=args.world_size, rank=args.rank)
    model = Net()
    model = torch.nn.parallel.DistributedDataParallel(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum)

    # train_dataset = datasets.MNIST('data', train=True, download=True, transform=transforms.Compose([...]))
    g = torch.Generator().manual_seed(0)
    train_dataset = torch.utils.data.TensorDataset(torch.randn(256, 1, 28, 28, generator=g),
                                                   torch.randint(0, 10, (256,), generator=g))
    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
    else:
        train_sampler = None

    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, pin_memory=False, sampler=train_sampler)

    for epoch in range(args.start_epoch, args.epochs):
        if args.set_epoch:
            train_sampler.set_epoch(epoch)
        train(train_loader, model, criterion, optimizer, epoch, args)


def train(train_loader, model, criterion, optimizer, epoch, args):
    model.train()
    for batch_idx, (imgs, ids) in enumerate(train_loader):  # MARK:seed_loop
        feature = model(imgs)
        loss = criterion(feature, ids)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if args.rank == 0:
        print(f"epoch {epoch} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
'''

# Samplers, one loader each, all in one training loop (one job): set_epoch with a constant (the bug); a
# hand-made sampler with set_epoch and no `shuffle` attribute that is never told the epoch (the bug, seen by
# its first indices); set_epoch(epoch) with an evaluation pass over the same loader in the same epoch, and
# shuffle=False without set_epoch (both fine). The model is built whole, then wrapped (the desync clean twin).
# torchrun or mp.spawn: `samplers.py <epochs> [<port> <nprocs>]`.
SAMPLERS = r'''
import os, sys
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Sampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class EpochSampler(Sampler):
    """Shuffles with the epoch as its seed; has set_epoch but no `shuffle` attribute."""

    def __init__(self, n, rank, world):
        self.n, self.rank, self.world, self.e = n, rank, world, 0

    def set_epoch(self, e):
        self.e = e

    def __iter__(self):
        g = torch.Generator().manual_seed(self.e)
        return iter(torch.randperm(self.n, generator=g)[self.rank::self.world].tolist())

    def __len__(self):
        return len(range(self.rank, self.n, self.world))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.body(x))


def step(model, opt, x, y):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def worker(rank, world, epochs):
    torch.manual_seed(rank)  # DDP's broadcast at construction makes the ranks equal
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(48, 8, generator=g), torch.randn(48, 1, generator=g))
    constant, good = DistributedSampler(ds), DistributedSampler(ds)
    plain, custom = DistributedSampler(ds, shuffle=False), EpochSampler(len(ds), rank, world)
    for epoch in range(epochs):
        constant.set_epoch(1)  # MARK:constant_set
        for x, y in DataLoader(ds, batch_size=8, sampler=constant):  # MARK:constant_loop
            step(model, opt, x, y)
        good.set_epoch(epoch)
        loader = DataLoader(ds, batch_size=8, sampler=good)
        for x, y in loader:  # MARK:good_loop
            step(model, opt, x, y)
        with torch.no_grad():
            for x, y in loader:  # MARK:good_eval
                model(x)
        for x, y in DataLoader(ds, batch_size=8, sampler=plain):  # MARK:plain_loop
            step(model, opt, x, y)
        for x, y in DataLoader(ds, batch_size=8, sampler=custom):  # MARK:custom_loop
            step(model, opt, x, y)
    print(f"rank {rank} trained", flush=True)
    dist.destroy_process_group()


def spawned(rank, world, epochs, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    worker(rank, world, epochs)


if __name__ == "__main__":
    epochs = int(sys.argv[1])
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        worker(dist.get_rank(), dist.get_world_size(), epochs)
    else:
        import torch.multiprocessing as mp

        world = int(sys.argv[3])
        mp.spawn(spawned, args=(world, epochs, int(sys.argv[2])), nprocs=world)
'''

# Parameters that drift apart: `models.py <mode> <steps> [<port> <nprocs>]`, torchrun or mp.spawn. Each
# step all-reduces the loss for logging (so the ranks keep pace, as real jobs do). Modes: `unwrapped` (the
# same seed everywhere, never wrapped in DDP: each rank steps with its own data's gradients), `attached`
# (a head attached to the model after DDP was built), `clean` (the whole model built, then wrapped), `hang`
# (clean, but rank 1 stops before its last step while rank 0 waits in the next collective), `seeded` (never
# wrapped, and seeded by rank), `nosync` (wrapped with init_sync=False, seeded by rank).
MODELS = r'''
import os, sys, time
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self, head):
        super().__init__()
        self.body = nn.Linear(8, 4)
        if head:
            self.head = nn.Linear(4, 1)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.head(h) if hasattr(self, "head") else h.sum(1, keepdim=True)


def build(mode, rank):
    if mode == "unwrapped":
        torch.manual_seed(0)
        return Net(head=True)
    torch.manual_seed(rank)
    if mode == "seeded":
        return Net(head=True)  # MARK:seeded_net
    if mode == "nosync":
        return DDP(Net(head=True), init_sync=False)  # MARK:nosync_ddp
    if mode == "attached":
        model = DDP(Net(head=False))  # MARK:attached_ddp
        model.module.head = nn.Linear(4, 1)
        return model
    return DDP(Net(head=True))


def worker(rank, mode, steps):
    model = build(mode, rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)  # each rank reads its own data
    for i in range(steps):
        if mode == "hang" and rank == 1 and i == steps - 1:
            time.sleep(3600)  # MARK:models_hang
        x = torch.randn(16, 8, generator=data)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()  # MARK:models_step
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        time.sleep(0.02)
    print(f"rank {rank} stepped {steps} times", flush=True)
    dist.destroy_process_group()


def spawned(rank, world, mode, steps, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    worker(rank, mode, steps)


if __name__ == "__main__":
    mode, steps = sys.argv[1], int(sys.argv[2])
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        worker(dist.get_rank(), mode, steps)
    else:
        import torch.multiprocessing as mp

        world = int(sys.argv[4])
        mp.spawn(spawned, args=(world, mode, steps, int(sys.argv[3])), nprocs=world)
'''

# Ranks that read different data plans, two loops in one torchrun job of 2 ranks: a dataset one sample longer
# on rank 1 under a DistributedSampler (25 samples and 5 batches on rank 0, 26 and 6 on rank 1), then a
# hand-made split of 51 samples (26 on rank 1: one more batch). Rank 1's extra DDP steps pair with rank 0's
# next ones until rank 0 is done and rank 1 is left in a collective: the job ends in a failure or a hang;
# the plans are named before that.
PLANS = r'''
import sys
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(0)
full = TensorDataset(torch.randn(51, 8, generator=g), torch.randn(51, 1, generator=g))
longer = Subset(full, range(50 + rank))  # each rank its own copy of the data, one sample more on rank 1
split = Subset(full, range(world - 1 - rank, 51, world))  # a split by hand: 25 samples on rank 0, 26 on rank 1


def step(x, y):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


for epoch in range(2):
    sampler = DistributedSampler(longer)
    sampler.set_epoch(epoch)
    for x, y in DataLoader(longer, batch_size=5, sampler=sampler):  # MARK:plan_length
        step(x, y)
    for x, y in DataLoader(split, batch_size=5):  # MARK:plan_split
        step(x, y)
dist.destroy_process_group()
'''

# BatchNorm statistics, `bn.py <models> <steps> [<port> <nprocs>]` (torchrun or mp.spawn), <models> a comma list
# of: `syncoff` (DDP with broadcast_buffers=False), `noddp` (never wrapped), `moduleeval` (default DDP,
# evaluated through model.module), `clean` (default DDP, trained and evaluated through the wrapper), `fixed`
# (broadcast_buffers=False with the fix: ddpdoctor.sync_bn_stats before every evaluation and at the end). Every
# model is a Linear-BatchNorm-ReLU-Linear net from the same seed; each rank's data is shifted by its rank.
# Every 10 steps each model is evaluated on every rank; each step all-reduces a loss for logging.
BATCHNORM = r'''
import os, sys, time
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddpdoctor


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))


def train(model, opt, x):
    model.train()
    opt.zero_grad()
    loss = model(x).square().mean()  # MARK:bn_train
    loss.backward()
    opt.step()  # MARK:bn_step
    return loss.detach()


def worker(rank, which, steps):
    syncoff = DDP(net(), broadcast_buffers=False) if "syncoff" in which else None  # MARK:bn_syncoff
    noddp = net() if "noddp" in which else None
    moduleeval = DDP(net()) if "moduleeval" in which else None
    clean = DDP(net()) if "clean" in which else None
    fixed = DDP(net(), broadcast_buffers=False) if "fixed" in which else None
    models = [m for m in (syncoff, noddp, moduleeval, clean, fixed) if m is not None]
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
    data = torch.Generator().manual_seed(100 + rank)
    for i in range(steps):
        x = torch.randn(16, 6, generator=data) + rank  # each rank's own data, shifted by its rank
        logged = sum(train(m, opt, x) for m, opt in zip(models, opts))
        dist.all_reduce(logged)
        time.sleep(0.02)
        if i % 10 == 9:
            if fixed is not None:
                ddpdoctor.sync_bn_stats(fixed)
            with torch.no_grad():
                xe = torch.randn(8, 6, generator=data)
                for m in models:
                    m.eval()
                    if m is moduleeval:
                        moduleeval.module(xe)  # MARK:bn_module_eval
                    else:
                        m(xe)  # MARK:bn_eval
    if fixed is not None:
        ddpdoctor.sync_bn_stats(fixed)  # before the checkpoint a real job would save here
    print(f"rank {rank} trained {len(models)} models", flush=True)
    dist.destroy_process_group()


def spawned(rank, world, which, steps, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    worker(rank, which, steps)


if __name__ == "__main__":
    which, steps = sys.argv[1].split(","), int(sys.argv[2])
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        worker(dist.get_rank(), which, steps)
    else:
        import torch.multiprocessing as mp

        world = int(sys.argv[4])
        mp.spawn(spawned, args=(world, which, steps, int(sys.argv[3])), nprocs=world)
'''
