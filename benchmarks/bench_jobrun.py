"""Overhead of `ddpdoctor run` on a small CPU DDP loop, and the time from a hang to the printed verdict.

1. Overhead: a 2-rank x 200-step DDP training loop (gloo, CPU) under torchrun, with and without
   `ddpdoctor run`, interleaved REPEAT times; medians of the whole command's wall time and of the
   training loop alone (timed inside rank 0), and the median of each back-to-back pair's ratio
   (steadier when the machine's load drifts). Target: at most 2% wall time.
   Then the wrapper's fixed cost apart: `ddpdoctor run -- python -c pass` against the bare command.
2. Hang to verdict: rank 1 stops before an all_reduce and writes the time it did; the verdict line
   `ddpdoctor run: hung` is timestamped as it arrives; reported against --hang-timeout.

Usage: python benchmarks/bench_jobrun.py [--repeat 5] [--hang-timeout 5]
The numbers are noisy on a shared machine: read the spread, not only the median.
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
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
hang = sys.argv[1] == "hang"
t0 = time.perf_counter()
for step in range(200):
    if hang and rank == 1 and step == 50:
        with open(sys.argv[2], "w") as f:
            f.write(repr(time.time()))
        time.sleep(3600)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
if rank == 0:
    print(f"LOOP {time.perf_counter() - t0:.4f}", flush=True)
dist.barrier()  # no rank tears gloo down while its peer still talks to it (that aborts the peer)
dist.destroy_process_group()
'''


def torchrun(script: str, *args: str) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", script, *args]


def timed(cmd: list, env: dict) -> tuple:
    wall, out = timed_output(cmd, env)
    loop = next(float(line.split()[1]) for line in out.splitlines() if line.startswith("LOOP "))
    return wall, loop


def _wall(cmd: list, env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def hang_to_verdict(script: str, tmp: str, hang_timeout: float, env: dict) -> float:
    stamp = os.path.join(tmp, "hang-started")
    cmd = [sys.executable, "-m", "ddpdoctor", "run", "--hang-timeout", str(hang_timeout), "--dir",
           os.path.join(tmp, f"run-hang-{time.time_ns()}"), "--", *torchrun(script, "hang", stamp)]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = None
    for line in p.stderr:
        if line.startswith("ddpdoctor run: hung") and seen is None:
            seen = time.time()
    p.wait()
    if seen is None:
        raise SystemExit("no hang verdict was printed")
    with open(stamp) as f:
        return seen - float(f.read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hang-timeout", type=float, default=5.0)
    args = ap.parse_args()
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "loop.py")
        with open(script, "w") as f:
            f.write(LOOP)
        plain = torchrun(script, "train")
        wrapped = [sys.executable, "-m", "ddpdoctor", "run", "--dir", os.path.join(tmp, "run"), "--", *plain]
        timed(plain, env), timed(wrapped, env)  # warm the page cache
        rows = {"plain": [], "ddpdoctor run": []}
        for i in range(args.repeat):
            pair = [("plain", plain), ("ddpdoctor run", wrapped)]
            for name, cmd in (pair if i % 2 == 0 else pair[::-1]):
                if name == "ddpdoctor run":
                    cmd = cmd[:5] + [os.path.join(tmp, f"run{i}")] + cmd[6:]
                rows[name].append(timed(cmd, env))
        print(f"{'command':<14} {'wall s (median)':>16} {'min..max':>14} {'loop s (median)':>16}")
        for name, vals in rows.items():
            walls, loops = [w for w, _ in vals], [lo for _, lo in vals]
            print(f"{name:<14} {statistics.median(walls):>16.3f} {min(walls):>6.2f}..{max(walls):<6.2f} "
                  f"{statistics.median(loops):>16.3f}")
        w0 = statistics.median([w for w, _ in rows["plain"]])
        w1 = statistics.median([w for w, _ in rows["ddpdoctor run"]])
        l0 = statistics.median([lo for _, lo in rows["plain"]])
        l1 = statistics.median([lo for _, lo in rows["ddpdoctor run"]])
        print(f"overhead: wall {100 * (w1 / w0 - 1):+.1f}%, training loop {100 * (l1 / l0 - 1):+.1f}% "
              f"(target <= 2%)")
        # Each pair ran back to back: on a machine whose load drifts, the median of the pairs' ratios
        # is steadier than the ratio of the medians.
        paired = statistics.median(b[0] / a[0] for a, b in zip(rows["plain"], rows["ddpdoctor run"]))
        print(f"paired: median of the {args.repeat} pairs' wall ratios {100 * (paired - 1):+.1f}%")
        # The wrapper's own fixed cost (its start before the launcher, its end after): around a
        # command that does nothing but start Python.
        bare = [sys.executable, "-c", "pass"]
        fixed = []
        for i in range(args.repeat):
            a = _wall(bare, env)
            b = _wall([sys.executable, "-m", "ddpdoctor", "run", "--dir", os.path.join(tmp, f"bare{i}"), "--",
                       *bare], env)
            fixed.append(b - a)
        print(f"the wrapper's fixed cost around `python -c pass`: median {statistics.median(fixed) * 1000:.0f} ms "
              f"(min {min(fixed) * 1000:.0f} ms) over {args.repeat} pairs")
        lat = [hang_to_verdict(script, tmp, args.hang_timeout, env) for _ in range(3)]
        print(f"hang to verdict: {', '.join(f'{x:.2f}' for x in lat)} s with --hang-timeout {args.hang_timeout:g} "
              f"(detection beyond the timeout: median {statistics.median(lat) - args.hang_timeout:.2f} s)")


if __name__ == "__main__":
    main()
