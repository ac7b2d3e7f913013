"""Part B's cost: the per-collective timing ``ddpdoctor run`` injects (straggler scores) against `run`'s 2% budget.

The same short CPU training loop (2 ranks, gloo, DDP over a small MLP, ``--steps`` steps) runs three
ways, interleaved ``--repeat`` times:

* ``plain``: ``torchrun --standalone --nproc-per-node 2 loop.py``;
* ``run``: under ``ddpdoctor run`` with the straggler timing on (the default): every blocking
  collective wrapped, DDP's backward and gradient all-reduce timed through autograd (a hook on the
  output's gradient, two end-of-backward callbacks);
* ``run, timing off``: under ``ddpdoctor run`` with ``DDPDOCTOR_STRAGGLER=0`` (heartbeat, stack
  handler and exit records only).

Rank 0 times every step; the first ``--warmup`` steps (DDP's first iterations, the hook's
installation, within the first heartbeat) are left out, and the steady state is the median step and the mean step of the rest.
Start-up (the whole command's wall time minus the loop) is printed separately: it is a different
concern (Python, torch, the injected hook's start, torchrun), measured here, not judged.

With ``--ab``, instead: one job under ``ddpdoctor run`` builds the same model twice, one that calls
DDP's forward directly (no timing) and one that goes through the injected timing, and alternates
blocks of steps between them (with a third, A's twin, for the noise floor), so all see the same load; wall and
CPU time per step, and each block against the A block beside it (see ``AB``).

With ``--micro``: the timing's own CPU cost per step in this process (one rank, no peer: no waiting
to blur it), the same two models alternating.

Usage: python benchmarks/bench_straggler.py [--repeat 7] [--steps 400] [--warmup 50]
       python benchmarks/bench_straggler.py --micro [--blocks 20] [--block 50]
       python benchmarks/bench_straggler.py --ab [--ab-repeat 5] [--blocks 20] [--block 50]
The machine's load average is printed before and after: on a shared machine read the spread too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from timing import timed_output  # benchmarks/ is the script's folder

LOOP = r'''
import os, statistics, sys, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
steps, warmup = int(sys.argv[1]), int(sys.argv[2])
took = []
t_loop = time.perf_counter()
for step in range(steps):
    if step == warmup:
        c0 = time.process_time()  # this rank's CPU, every thread (gloo's included), from here on
    t0 = time.perf_counter()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    took.append(time.perf_counter() - t0)
loop = time.perf_counter() - t_loop
cpu = (time.process_time() - c0) / (steps - warmup)
steady = took[warmup:]
if rank == 0:
    print(f"STEPS {statistics.median(steady) * 1e6:.2f} {sum(steady) / len(steady) * 1e6:.2f} {loop:.4f} "
          f"{cpu * 1e6:.2f}", flush=True)
dist.barrier()  # no rank tears gloo down while its peer still talks to it
dist.destroy_process_group()
'''

# The same job, both ways in one process and under the same load: model A calls DDP's forward itself
# (the injected wrapper bypassed: no timing), model B goes through the injected timing (the forward
# wrapper, the hook on the output's gradient, the two end-of-backward callbacks); blocks of steps
# alternate between them.
AB = r'''
import os, statistics, sys, time, types
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
deadline = time.monotonic() + 30
while not getattr(DDP.forward, "_ddpdoctor_timed", False):  # the heartbeat installs it within a beat
    if time.monotonic() > deadline:
        print("AB False", flush=True)
        sys.exit(0)
    time.sleep(0.05)
def make():
    torch.manual_seed(0)
    return DDP(torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
a, b, c = make(), make(), make()
a.forward = types.MethodType(DDP.forward.__wrapped__, a)
c.forward = types.MethodType(DDP.forward.__wrapped__, c)  # A's twin: the noise floor
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
blocks, block = int(sys.argv[1]), int(sys.argv[2])
wall = {"a": [], "b": [], "c": []}
cpu = {"a": [], "b": [], "c": []}
orders = [(("a", a), ("b", b), ("c", c)), (("c", c), ("b", b), ("a", a)), (("b", b), ("a", a), ("c", c)),
          (("c", c), ("a", a), ("b", b)), (("a", a), ("c", c), ("b", b)), (("b", b), ("c", c), ("a", a))]
for i in range(blocks + 2):
    for name, model in orders[i % 6]:
        took = []
        c0 = time.process_time()
        for _ in range(block):
            t0 = time.perf_counter()
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            took.append(time.perf_counter() - t0)
        if i >= 2:  # the first two blocks: warm-up
            wall[name].append(statistics.median(took))
            cpu[name].append((time.process_time() - c0) / block)
if rank == 0:
    # each B block against the A block next to it (the load drifts slowly): the median of those ratios
    pair = lambda d, k: statistics.median(v / u for u, v in zip(d["a"], d[k]))  # noqa: E731
    print("AB True", *(f"{statistics.median(wall[k]) * 1e6:.2f} {statistics.median(cpu[k]) * 1e6:.2f}" for k in "ab"),
          *(f"{pair(d, k):.5f}" for k in "bc" for d in (wall, cpu)), flush=True)
dist.barrier()
dist.destroy_process_group()
'''

VARIANTS = ("plain", "run", "run, timing off")


def run_once(cmd: list, env: dict) -> tuple:
    """(median step us, mean step us, loop s, wall s, CPU us per step) of one whole command."""
    wall, out = timed_output(cmd, env)
    line = next(ln for ln in out.splitlines() if ln.startswith("STEPS "))
    med, mean, loop, cpu = (float(v) for v in line.split()[1:])
    return med, mean, loop, wall, cpu


def micro(blocks: int, block: int) -> None:
    """The timing's own CPU cost per step, in this process: one rank (gloo, world of 1), no network and
    no peer, so what is left is the Python work per step (the forward wrapper, the hook on the output's
    gradient, the two end-of-backward callbacks); the same model with DDP's forward called directly
    alternates with it."""
    import collections
    import importlib.util
    import types

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(os.path.dirname(here), "ddpdoctor", "postmortem", "inject", "sitecustomize.py")
    spec = importlib.util.spec_from_file_location("_ddpdoctor_inject_bench", path)
    inject = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inject)  # without DDPDOCTOR_RUN_DIR it only defines its functions
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        events: collections.deque = collections.deque()
        if not inject._ddpdoctor_time_collectives(events, [None]):
            raise SystemExit("the injected timing did not install")

        def make() -> DDP:
            torch.manual_seed(0)
            return DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                           torch.nn.ReLU(), torch.nn.Linear(256, 10)))
        a, b = make(), make()
        a.forward = types.MethodType(DDP.forward.__wrapped__, a)
        x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
        cpu: dict = {"a": [], "b": []}
        for i in range(blocks + 2):
            for name, model in (("a", a), ("b", b)) if i % 2 else (("b", b), ("a", a)):
                c0 = time.thread_time()
                for _ in range(block):
                    model.zero_grad()
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                if i >= 2:
                    cpu[name].append((time.thread_time() - c0) / block)
                events.clear()
        ca, cb = statistics.median(cpu["a"]), statistics.median(cpu["b"])
        paired = statistics.median(v - u for u, v in zip(cpu["a"], cpu["b"]))
        print(f"# one rank, no peer: {blocks} alternating blocks of {block} steps; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(f"CPU per step (main thread): {ca * 1e6:.1f} us without the timing, {cb * 1e6:.1f} us with it; "
              f"the timing's cost {paired * 1e6:+.1f} us per step (paired blocks)")
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--ab", action="store_true", help="only the A/B comparison inside one job (see AB)")
    ap.add_argument("--ab-repeat", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--block", type=int, default=50)
    ap.add_argument("--micro", action="store_true", help="only the timing's CPU cost per step, in this process")
    args = ap.parse_args()
    if args.micro:
        micro(args.blocks * 5, args.block)
        return
    if args.ab:
        ab(args.ab_repeat, args.blocks, args.block)
        return
    load0 = os.getloadavg()[0]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DDPDOCTOR_", "RANK", "WORLD_SIZE", "LOCAL_",
                                                                     "MASTER_", "TORCHELASTIC_"))}
    base["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-bench-straggler-") as tmp:
        script = os.path.join(tmp, "loop.py")
        with open(script, "w") as f:
            f.write(LOOP)
        plain = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", script,
                 str(args.steps), str(args.warmup)]

        def command(variant: str, i: int) -> tuple:
            if variant == "plain":
                return plain, base
            env = dict(base, DDPDOCTOR_STRAGGLER="0") if variant == "run, timing off" else base
            return [sys.executable, "-m", "ddpdoctor", "run", "--dir", os.path.join(tmp, f"run-{i}-{len(variant)}"),
                    "--", *plain], env

        for v in VARIANTS:  # warm the page cache
            run_once(*command(v, -1))
        rows: dict = {v: [] for v in VARIANTS}
        for i in range(args.repeat):
            order = VARIANTS[i % 3:] + VARIANTS[:i % 3]  # each variant first, middle and last in turn
            for v in order:
                rows[v].append(run_once(*command(v, i)))
    load1 = os.getloadavg()[0]
    print(f"# {args.repeat} interleaved runs of each, {args.steps} steps of which the first {args.warmup} are left out; "
          f"2 ranks, gloo, CPU; load average {load0:.1f} before, {load1:.1f} after, on {os.cpu_count()} CPUs")
    print("| variant | median step us | mean step us (min..max of runs) | rank 0's CPU us per step "
          "| start-up + teardown s | median step vs plain | mean step vs plain | CPU per step vs plain |")
    print("|---|---|---|---|---|---|---|---|")
    ref_cpu = statistics.median(r[4] for r in rows["plain"])
    ref_med = statistics.median(r[0] for r in rows["plain"])
    ref_mean = statistics.median(r[1] for r in rows["plain"])
    for v in VARIANTS:
        med = statistics.median(r[0] for r in rows[v])
        means = [r[1] for r in rows[v]]
        mean = statistics.median(means)
        startup = statistics.median(r[3] - r[2] for r in rows[v])
        cpu = statistics.median(r[4] for r in rows[v])
        print(f"| {v} | {med:.1f} | {mean:.1f} ({min(means):.0f}..{max(means):.0f}) | {cpu:.1f} | {startup:.2f} "
              f"| {100 * (med / ref_med - 1):+.1f}% | {100 * (mean / ref_mean - 1):+.1f}% "
              f"| {100 * (cpu / ref_cpu - 1):+.1f}% |")
    on = statistics.median(r[0] for r in rows["run"])
    off = statistics.median(r[0] for r in rows["run, timing off"])
    print(f"steady-state per-step cost of the timing (run vs run, timing off, median steps): {on - off:+.1f} us "
          f"({100 * (on / off - 1):+.1f}%; budget 2%)")
    son = statistics.median(r[4] for r in rows["run"])
    soff = statistics.median(r[4] for r in rows["run, timing off"])
    print(f"the same in rank 0's CPU per step: {son - soff:+.1f} us ({100 * (son / soff - 1):+.1f}%)")


def ab(repeat: int, blocks: int, block: int) -> None:
    """Model A (DDP's own all-reduce) against model B (through the injected hook) in one job under run."""
    load0 = os.getloadavg()[0]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DDPDOCTOR_", "RANK", "WORLD_SIZE", "LOCAL_",
                                                                     "MASTER_", "TORCHELASTIC_"))}
    base["OMP_NUM_THREADS"] = "1"
    out = []
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-bench-straggler-") as tmp:
        script = os.path.join(tmp, "ab.py")
        with open(script, "w") as f:
            f.write(AB)
        for i in range(repeat):
            cmd = [sys.executable, "-m", "ddpdoctor", "run", "--dir", os.path.join(tmp, f"ab-{i}"), "--",
                   sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", script,
                   str(blocks), str(block)]
            p = subprocess.run(cmd, env=base, capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"the A/B job failed ({p.returncode}): {p.stderr[-1500:]}")
            words = next(ln for ln in p.stdout.splitlines() if ln.startswith("AB ")).split()
            if words[1] != "True":
                raise SystemExit("the injected timing was not active in the A/B job")
            out.append([float(v) for v in words[2:]])
    load1 = os.getloadavg()[0]
    wa, ca, wb, cb, ratio, cratio, twin, ctwin = (statistics.median(r[k] for r in out) for k in range(8))
    print(f"# A/B in one job under ddpdoctor run, {repeat} jobs x {blocks} alternating blocks of {block} steps per model; "
          f"load average {load0:.1f} before, {load1:.1f} after, on {os.cpu_count()} CPUs")
    print("| model | median step us (wall) | CPU us per step (process) |")
    print("|---|---|---|")
    print(f"| A: DDP's forward called directly (no timing) | {wa:.1f} | {ca:.1f} |")
    print(f"| B: through the injected timing | {wb:.1f} | {cb:.1f} |")
    print(f"per-step cost of the timing: wall {wb - wa:+.1f} us ({100 * (wb / wa - 1):+.1f}%), "
          f"CPU {cb - ca:+.1f} us ({100 * (cb / ca - 1):+.1f}%); budget 2%")
    print(f"paired blocks (B over the A block beside it, median over blocks, then over jobs): wall "
          f"{100 * (ratio - 1):+.1f}%, CPU {100 * (cratio - 1):+.1f}% (per job: "
          f"{', '.join(f'{100 * (r[4] - 1):+.1f}%' for r in out)})")
    print(f"noise floor, A's twin (no timing either) over A the same way: wall {100 * (twin - 1):+.1f}%, "
          f"CPU {100 * (ctwin - 1):+.1f}% (per job: {', '.join(f'{100 * (r[6] - 1):+.1f}%' for r in out)})")


if __name__ == "__main__":
    main()
