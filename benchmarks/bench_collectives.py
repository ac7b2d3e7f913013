"""Measure the collectives check: busbw accuracy against a plain reference loop, and its cost.

Accuracy: in one local gloo world (the ranks ddpdoctor spawns), each rank alternates, ROUNDS times,
between ddpdoctor's own measurement of all_reduce (the ``collectives-bench`` code path: rank-encoded
inputs, warm-up, a barrier, the timed calls) and an independent loop written plainly with
torch.distributed and timed the same way (warm-up, barrier, perf_counter around each call, the time
averaged over ranks, busbw = size / time * 2(n-1)/n). The ratio of the medians must lie within
0.9-1.1 for each of 3 sizes.

Cost: ``ddpdoctor check`` at 2 CPU ranks with and without the ``collectives`` check, interleaved,
REPEAT times each; the difference of the medians must be at most 1 second.

Usage: python benchmarks/bench_collectives.py [--rounds 15] [--repeat 7] [--ranks 2] [--skip-cost]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = (64 << 10, 1 << 20, 8 << 20)  # bytes
ITERS, WARMUP = 50, 5
BASE = "env,port,process-group"

from ddpdoctor.checks.collectives import CollectivesBenchCheck  # noqa: E402
from timing import timed  # noqa: E402


def reference_all_reduce(count: int, iters: int, warmup: int) -> float:
    """Seconds per all_reduce of ``count`` float32 on this rank, the plain way."""
    import torch
    import torch.distributed as dist

    x = torch.ones(count, dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(x)
    dist.barrier()
    total = 0.0
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(x)
        total += time.perf_counter() - t0
    return total / iters


class BenchVsReference(CollectivesBenchCheck):
    """collectives-bench rows for all_reduce(sum), interleaved with the reference loop."""

    name = "bench-vs-reference"
    description = "benchmark only: ddpdoctor's all_reduce timing next to a plain reference loop"

    def run(self, ctx):
        from ddpdoctor.diagnostics.collective_plan import Group

        ctx.process_group()
        self._seq = self._last = 0
        rounds = int(ctx.options.get("rounds", 15))
        world = Group(tuple(range(ctx.world_size)), ctx.rank)
        found = {"checked": 0, "wrong": [], "skipped": [], "timings": [], "groups": ["world"], "reference": []}
        for _ in range(rounds):
            for size in SIZES:
                self._bench_one(ctx, world, "all_reduce(sum)", "float32", size, ITERS, WARMUP, found)
                seconds = reference_all_reduce(size // 4, ITERS, WARMUP)
                found["reference"].append({"size": size, "time_us": seconds * 1e6})
        return ctx.passed("measured", data=found)


CHECKS = [BenchVsReference]


def accuracy(ranks: int, rounds: int) -> bool:
    from ddpdoctor.checks.collectives import bench_rows
    from ddpdoctor.runner.options import RunOptions
    from ddpdoctor.runner.local import run_checks

    os.environ["DDPDOCTOR_PLUGINS"] = "bench_collectives"
    try:
        out = run_checks(RunOptions(nproc=ranks, backend="gloo", only=["bench-vs-reference"], timeout=600,
                                    options={"rounds": rounds}))
    finally:
        del os.environ["DDPDOCTOR_PLUGINS"]
    result = out.report.results[0]
    if result.status.label not in ("pass", "warn"):
        raise SystemExit(f"bench failed: {result.summary}")
    rows = bench_rows(result.outcomes, ranks)
    n = ranks
    print(f"accuracy: all_reduce busbw, ddpdoctor vs plain reference loop, {ranks} gloo ranks, {rounds} "
          "interleaved rounds; ratio = median over rounds of ddpdoctor/reference measured back to back")
    print(f"{'size':>10}  {'ddpdoctor GB/s':>14}  {'reference GB/s':>14}  {'ratio':>6}  {'min-max':>11}  target")
    ok = True
    for size in SIZES:
        ours = [r["busbw"] for r in rows if r["size"] == size]
        ref = []
        for i in range(rounds):
            # The reference: each rank's mean time, averaged over ranks; busbw written out plainly.
            times = [o.data["reference"][i * len(SIZES) + SIZES.index(size)]["time_us"] for o in result.outcomes]
            seconds = sum(times) / len(times) / 1e6
            ref.append(size / seconds / 1e9 * 2 * (n - 1) / n)
        ratios = [a / b for a, b in zip(ours, ref)]
        ratio = statistics.median(ratios)
        good = 0.9 <= ratio <= 1.1
        ok &= good
        print(f"{size:>10}  {statistics.median(ours):>14.3f}  {statistics.median(ref):>14.3f}  {ratio:>6.3f}  "
              f"{min(ratios):>5.2f}-{max(ratios):<5.2f}  0.9-1.1{'' if good else '  MISSED'}")
    return ok


def cost(ranks: int, repeat: int) -> bool:
    base = [sys.executable, "-m", "ddpdoctor", "check", "--backend", "gloo", "--nproc", str(ranks), "--only"]
    without, with_ = base + [BASE], base + [BASE + ",collectives"]
    timed(without), timed(with_)  # warm the page cache
    a, b = [], []
    for _ in range(repeat):
        a.append(timed(without))
        b.append(timed(with_))
    extra = statistics.median(b) - statistics.median(a)
    ok = extra <= 1.0
    print(f"cost: ddpdoctor check at {ranks} ranks, median of {repeat} interleaved runs")
    print(f"  without collectives {statistics.median(a):.3f} s, with {statistics.median(b):.3f} s, "
          f"added {extra:.3f} s (target <= 1.0 s){'' if ok else '  MISSED'}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--skip-cost", action="store_true")
    ap.add_argument("--skip-accuracy", action="store_true")
    args = ap.parse_args()
    ok = True
    if not args.skip_accuracy:
        ok &= accuracy(args.ranks, args.rounds)
    if not args.skip_cost:
        ok &= cost(2, args.repeat)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
