"""The cost of ``ddpdoctor run``'s watches for silent bugs (issue 24) against their 1% budget.

CPU time per step inside one process (``time.process_time``: every thread of it; wall time on a shared
machine is too noisy for 1%), the watches on and off in the same script, blocks of steps alternating
off / on / off again (the second "off" is the noise floor), on two loops:

* ``readme``: the README's training loop ("Training pitfalls": a Linear-BatchNorm-ReLU-Linear model
  in DDP, a DistributedSampler with ``set_epoch``, a DataLoader of batch 16 over 103 samples, SGD),
  without the library calls: the user's loop as ``run`` watches it;
* ``resnet18``: a ResNet-18-sized convolutional net (BasicBlock x [2, 2, 2, 2], 11.2 M parameters,
  defined here: torchvision is not a dependency) at batch 32 on 32x32 images, over a DataLoader.

"on" is the rank-side watches as ``run`` injects them (:mod:`ddpdoctor.postmortem.inject._ddpdoctor_watches`):
the DataLoader and ``set_epoch`` wrappers, the optimizer step pre-hook, and bn-drift's wrappers of
BatchNorm's and DDP's ``forward``; "off" restores torch's own. bn-drift's wrappers are also timed
directly (per call, against torch's own forward on the same input, the minimum of repeated runs), and
its record of the running statistics is timed on each model: once per evaluation pass that bypasses a
broadcasting DDP forward (and once at the end), never in default DDP's training or evaluation through
the wrapper, so it is reported per evaluation, not per step.
The desync fingerprint runs once per window (60 s by default), not per step: its time is measured
here on each model and spread over the steps of one window; so is the heartbeat thread's share (one
``beat()`` a second). A world of one rank (gloo, a file store in a temporary folder) so DDP is real.

Usage: python benchmarks/bench_watches.py [--loop readme|resnet18|both] [--blocks 6] [--block 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _load_watches():
    sys.path.insert(0, os.path.join(ROOT, "ddpdoctor", "postmortem", "inject"))
    import _ddpdoctor_watches

    import ddpdoctor.diagnostics.fingerprint as fingerprint

    sys.modules["_ddpdoctor_fingerprint"] = fingerprint
    sys.path.pop(0)
    return _ddpdoctor_watches


def resnet18(num_classes=10):
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
            return (out + (x if self.down is None else self.down(x))).relu()

    layers = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def build(loop):
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    torch.manual_seed(0)
    if loop == "readme":
        model = DistributedDataParallel(torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
        dataset = TensorDataset(torch.randn(103, 8), torch.randint(0, 2, (103,)))
        batch = 16
    else:
        model = DistributedDataParallel(resnet18())
        dataset = TensorDataset(torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,)))
        batch = 32
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, sampler, loader, optimizer


def steps(model, sampler, loader, optimizer, count, epoch):
    """``count`` steps of the README's loop (epochs restart as the loader runs out); the next epoch."""
    import torch

    done = 0
    while done < count:
        sampler.set_epoch(epoch)
        epoch += 1
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            done += 1
            if done == count:
                break
    return epoch


class Switch:
    """Turns the injected watches on and off in this process (their patches and their hook)."""

    def __init__(self, watches, run_dir):
        import torch.optim.optimizer as optim
        from torch.nn.modules.batchnorm import _BatchNorm
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler

        self.off = (DataLoader.__iter__, DistributedSampler.set_epoch, _BatchNorm.forward,
                    DistributedDataParallel.forward)
        self.state = watches._Rank(run_dir, {"rank": 0})
        assert self.state.install() and self.state.bn is not None
        self.on = (DataLoader.__iter__, DistributedSampler.set_epoch, _BatchNorm.forward,
                   DistributedDataParallel.forward)
        self.hooks = optim._global_optimizer_pre_hooks
        self.hook_items = dict(self.hooks)
        assert self.on != self.off and self.hook_items

    def set(self, on):
        from torch.nn.modules.batchnorm import _BatchNorm
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler

        (DataLoader.__iter__, DistributedSampler.set_epoch, _BatchNorm.forward,
         DistributedDataParallel.forward) = self.on if on else self.off
        self.hooks.clear()
        if on:
            self.hooks.update(self.hook_items)


def bn_costs(model, switch):
    """bn-drift's wrappers, per call: BatchNorm's forward (as in a training forward through a DDP model
    that broadcasts its buffers: the layer known, nothing recorded) and DDP's, each against torch's own
    on the same input (the minimum of repeated runs); the model's BatchNorm layers."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    drift = switch.state.bn
    layers = [m for m in model.module.modules() if isinstance(m, _BatchNorm)]
    probe = torch.nn.BatchNorm1d(16)
    x = torch.randn(4, 16)
    times = {}
    drift.covered += 1
    try:
        for on in (False, True) * 4:
            switch.set(on)
            t0 = time.process_time()
            for _ in range(2000):
                probe(x)
            times.setdefault(("bn", on), []).append((time.process_time() - t0) / 2000)
    finally:
        drift.covered -= 1
    tiny = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    y = torch.randn(2, 4)
    with torch.no_grad():
        for on in (False, True) * 4:
            switch.set(on)
            t0 = time.process_time()
            for _ in range(500):
                tiny(y)
            times.setdefault(("ddp", on), []).append((time.process_time() - t0) / 500)
    switch.set(True)
    bn_call = max(0.0, min(times[("bn", True)]) - min(times[("bn", False)]))
    ddp_call = max(0.0, min(times[("ddp", True)]) - min(times[("ddp", False)]))
    return bn_call, ddp_call, layers


def measure(loop, blocks, block, switch):
    import torch

    model, sampler, loader, optimizer = build(loop)
    epoch = steps(model, sampler, loader, optimizer, 5, 0)  # warm up, with the watches on (first step: start)
    cpu = {"off": [], "on": [], "off again": []}
    for _ in range(blocks):
        for mode in ("off", "on", "off again"):
            switch.set(mode == "on")
            c0 = time.process_time()
            epoch = steps(model, sampler, loader, optimizer, block, epoch)
            cpu[mode].append((time.process_time() - c0) / block)
    switch.set(True)
    frame = sys._getframe()
    f0 = time.process_time()
    for _ in range(3):
        switch.state.fingerprint("window", frame)
    fp = (time.process_time() - f0) / 3
    r0 = time.process_time()
    with torch.no_grad():
        for _ in range(3):
            for q in model.parameters():
                q.sum()  # one read of the bytes, for scale
    read = (time.process_time() - r0) / 3
    b0 = time.process_time()
    for _ in range(200):
        switch.state.beat()
    beat = (time.process_time() - b0) / 200
    # the watches' own work, timed directly: the step pre-hook, and per pass the wrapped set_epoch and iter()
    hook0 = time.process_time()
    for _ in range(2000):
        switch.state.pre_step(optimizer, (), {})
    hook = (time.process_time() - hook0) / 2000
    per_pass = {}
    for on in (False, True, False, True):
        switch.set(on)
        p0 = time.process_time()
        for i in range(100):
            sampler.set_epoch(epoch + i)
            it = iter(loader)
            del it
        per_pass.setdefault(on, []).append((time.process_time() - p0) / 100)
    switch.set(True)
    pass_cost = max(0.0, min(per_pass[True]) - min(per_pass[False]))
    bn_call, ddp_call, layers = bn_costs(model, switch)
    bn_step = bn_call * len(layers) + ddp_call  # one forward per step: each BatchNorm layer once, DDP once
    direct = hook + pass_cost / len(loader) + bn_step
    drift = switch.state.bn
    s0 = time.process_time()
    for _ in range(3):  # every layer, as at an evaluation through model.module
        drift.snapshot("eval", [drift.info[id(bn)] for bn in layers], frame, "")
    snap = (time.process_time() - s0) / 3
    paired = [(on - (off + again) / 2) / ((off + again) / 2)
              for off, on, again in zip(cpu["off"], cpu["on"], cpu["off again"])]
    params = sum(p.numel() for p in model.parameters())
    step_off = statistics.median(cpu["off"])
    step_on = statistics.median(cpu["on"])
    floor = statistics.median(cpu["off again"])
    per_window = 60.0 / step_off  # steps in a 60 s window (CPU time per step as the step's duration)
    amortized = (fp + beat * 60) / per_window
    print(f"{loop}: {params / 1e6:.2f} M parameters, batch {loader.batch_size}, {blocks} x {block} steps per mode, "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(f"  CPU per step: off {step_off * 1e3:.3f} ms, on {step_on * 1e3:.3f} ms, off again {floor * 1e3:.3f} ms")
    print(f"  on vs off: {(step_on - step_off) / step_off * 100:+.2f}% of the median step; paired per block "
          f"(on against its two off neighbours): median {statistics.median(paired) * 100:+.2f}% (noise floor, off "
          f"again vs off: {(floor - step_off) / step_off * 100:+.2f}%)")
    print(f"  the watches' own work per step, timed directly: step hook {hook * 1e6:.2f} us + the pass's wrapped "
          f"set_epoch and iter() {pass_cost * 1e6:.1f} us over {len(loader)} steps + bn-drift's forward "
          f"wrappers {bn_call * 1e6:.2f} us x {len(layers)} BatchNorm layer(s) + {ddp_call * 1e6:.2f} us (DDP) "
          f"= {direct * 1e6:.2f} us "
          f"= {direct / step_off * 100:.3f}% of the step")
    print(f"  fingerprint once per window: {fp * 1e3:.2f} ms ({params * 4 / 1e6:.1f} MB; one read of the bytes, "
          f"a sum per tensor: {read * 1e3:.2f} ms, x{fp / max(read, 1e-9):.1f}); heartbeat beat(): "
          f"{beat * 1e6:.1f} us a second; spread over a 60 s window: {amortized * 1e6:.2f} us per step "
          f"= {amortized / step_off * 100:.4f}% of the step")
    print(f"  bn-drift's record of {len(layers)} BatchNorm layer(s), once per evaluation that bypasses a "
          f"broadcasting DDP forward (and at the end; never for default DDP through the wrapper): "
          f"{snap * 1e3:.2f} ms = {snap / step_off * 100:.2f}% of one step")
    return statistics.median(paired), (direct + amortized) / step_off


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=("readme", "resnet18", "both"), default="both")
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--block", type=int, default=40)
    parser.add_argument("--resnet-block", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="bench-watches-") as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            switch = Switch(_load_watches(), tmp)  # the patches are made once per process, as in a rank
            for loop in (("readme", "resnet18") if args.loop == "both" else (args.loop,)):
                measure(loop, args.blocks, args.block if loop == "readme" else args.resnet_block, switch)
        finally:
            dist.destroy_process_group()
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
