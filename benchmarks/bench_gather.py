"""Time ddpdoctor.gather with uneven shards against a plain all_gather of the padded size.

Two CPU ranks (forked, gloo over a FileStore in a temporary directory: no ports). Rank 0 holds
``rows`` rows, rank 1 three quarters of that; the baselines all-gather ``rows`` rows from each rank
(the padded size): ``dist.all_gather`` into a list allocated per call, as training code writes it,
and ``all_gather_into_tensor`` into one preallocated buffer. Prints the median time per call and the
ratios; exits 3 when a ratio against ``dist.all_gather`` is over the limit.

Usage: python benchmarks/bench_gather.py [--repeat 30]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from timing import fork_world  # noqa: E402 - benchmarks/ is the script's folder

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ddpdoctor.training.gathering import gather  # noqa: E402

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

SIZES = {"small (256 rows x 16 float32, 16 KiB/rank)": 256, "small (1 Ki rows x 16 float32, 64 KiB/rank)": 1024,
         "large (1 Mi rows x 16 float32, 64 MiB/rank)": 1 << 20}
COLS = 16
LIMIT = 1.3


def _time(fn, repeat: int, inner: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - start) / inner)
    return out


def _rank_main(rank: int, world: int, store_path: str, wfd: int, repeat: int) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    lines = []
    for label, rows in SIZES.items():
        mine = torch.randn(rows if rank == 0 else rows - rows // 4, COLS)
        padded = torch.randn(rows, COLS)
        out = torch.empty(world * rows, COLS)
        inner = 50 if rows < 100_000 else 1
        fns = {
            # What people write: a list of outputs, allocated per call.
            "plain": lambda: dist.all_gather([torch.empty_like(padded) for _ in range(world)], padded),
            # The strictest baseline: one preallocated output buffer.
            "prealloc": lambda: _all_gather_single(out, padded),
            "ours": lambda: gather(mine),
        }
        times: dict[str, list[float]] = {k: [] for k in fns}
        for fn in list(fns.values()) * 2:  # warm up
            fn()
        for _ in range(repeat):  # interleave so drift and neighbours' load hit all alike
            for name, fn in fns.items():
                times[name] += _time(fn, 1, inner)
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = med["ours"] / med["plain"]
        lines.append(f"{label}: dist.all_gather(padded) {med['plain'] * 1e3:.3f} ms, "
                     f"into preallocated buffer {med['prealloc'] * 1e3:.3f} ms, gather(uneven) "
                     f"{med['ours'] * 1e3:.3f} ms; ratio {ratio:.2f}x vs all_gather "
                     f"({'OK' if ratio <= LIMIT else 'OVER'} at limit {LIMIT}x), "
                     f"{med['ours'] / med['prealloc']:.2f}x vs preallocated")
    dist.destroy_process_group()
    if rank == 0:
        os.write(wfd, "\n".join(lines).encode())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    world = 2
    text, codes = fork_world(world, _rank_main, args.repeat)
    report = text.encode()
    print(f"torch {torch.__version__}, 2 CPU ranks (gloo), median of {args.repeat} interleaved runs")
    print(report.decode())
    if any(codes):
        print(f"ranks exited with {codes}", file=sys.stderr)
        return 1
    return 0 if b"OVER" not in report else 3


if __name__ == "__main__":
    sys.exit(main())
