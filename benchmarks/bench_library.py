"""Happy-path cost of the agreement step: gather, reduce_dict and gather_for_metrics against torch.distributed.

Forked CPU ranks (gloo over a FileStore in a temporary directory: no ports), at 2, 4 and 8 ranks.
Each helper is timed interleaved with what training code writes with torch.distributed directly in
the same script:

* ``gather(x)`` vs ``dist.all_gather(list, x)`` + ``torch.cat`` (equal shards, so the plain form works);
* ``reduce_dict(d)`` (4 float32 tensors) vs ``torch.cat`` + one ``dist.all_reduce`` + split + divide;
* ``gather_for_metrics(values, sampler)`` vs ``dist.all_gather`` + ``torch.cat`` + cut to the dataset
  length (what that baseline returns is in rank-interleaved order, not dataset order), for an
  evaluation sampler (``shuffle=False``) and, marked ``*``, a shuffled one.

Sizes: small is 1 KiB per rank; large is 64 MiB per rank for ``reduce_dict`` and 64 MiB gathered in
all for the gathers (64 MiB / ranks per rank), so that 8 ranks fit in memory next to the baseline.
Prints medians of wall time and ratios, and the CPU time per call of each (on a loaded machine the
wall time of a 1 KiB call is mostly waiting for a core; the CPU time is the work done); the target is one extra small round trip for small inputs (the
difference in ms is printed) and at most 1.3x for large ones (exit 3 when a large ratio is over).

Usage: python benchmarks/bench_library.py [--ranks 2 4 8] [--repeat 15] [--sizes "1 KiB" "64 MiB"]
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
from torch.utils.data import DistributedSampler, TensorDataset  # noqa: E402

from ddpdoctor.training import gather, gather_for_metrics, reduce_dict  # noqa: E402

LIMIT = 1.3
SMALL, LARGE = 1024, 64 << 20


def _cases(rank: int, world: int, nbytes: int, large: bool) -> dict:
    per_rank = nbytes // world if large else nbytes  # gathers: the gathered whole is 64 MiB
    x = torch.randn(per_rank // 4 // 16, 16)
    parts = [torch.empty_like(x) for _ in range(world)]

    def plain_gather():
        dist.all_gather(parts, x)
        return torch.cat(parts)

    numel = (nbytes if large else SMALL) // 4 // 4
    d = {f"k{i}": torch.randn(numel) for i in range(4)}

    def plain_reduce():
        flat = torch.cat([v.reshape(-1) for v in d.values()])
        dist.all_reduce(flat)
        flat /= world
        return dict(zip(d, flat.split([v.numel() for v in d.values()])))

    n = world * x.shape[0] - 1  # the sampler pads one sample
    dataset = TensorDataset(torch.zeros(n))
    in_order = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    shuffled = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True)
    values = torch.randn(len(in_order), 16)
    vparts = [torch.empty_like(values) for _ in range(world)]

    def plain_metrics():
        dist.all_gather(vparts, values)
        return torch.cat(vparts)[:n]

    return {
        "gather": (lambda: gather(x), plain_gather),
        "reduce_dict": (lambda: reduce_dict(d), plain_reduce),
        "gather_for_metrics": (lambda: gather_for_metrics(values, in_order), plain_metrics),
        # shuffled: ours also recomputes the sampler's permutation and puts the rows in dataset order,
        # which the baseline does not (its rows stay in rank-interleaved shuffled order)
        "gather_for_metrics*": (lambda: gather_for_metrics(values, shuffled), plain_metrics),
    }


def _rank_main(rank: int, world: int, store_path: str, wfd: int, repeat: int, sizes: list) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    lines = []
    for label, nbytes, large in [c for c in (("1 KiB", SMALL, False), ("64 MiB", LARGE, True)) if c[0] in sizes]:
        reps = repeat if not large else max(3, repeat // 3)
        inner = 20 if not large else 1
        for name, (ours, plain) in _cases(rank, world, nbytes, large).items():
            for fn in (ours, plain, ours, plain):  # warm up
                fn()
            times: dict = {"ours": [], "plain": [], "ours_cpu": [], "plain_cpu": []}
            for _ in range(reps):  # interleaved, so drift and neighbours' load hit both alike
                for key, fn in (("ours", ours), ("plain", plain)):
                    dist.barrier()
                    t0, c0 = time.perf_counter(), time.process_time()
                    for _ in range(inner):
                        fn()
                    times[key].append((time.perf_counter() - t0) / inner)
                    times[key + "_cpu"].append((time.process_time() - c0) / inner)
            # every rank's median, the slowest rank's figure counts
            med = torch.tensor([statistics.median(times[k]) for k in ("ours", "plain", "ours_cpu", "plain_cpu")],
                               dtype=torch.float64)
            dist.all_reduce(med, op=dist.ReduceOp.MAX)
            ours_s, plain_s, ours_cpu, plain_cpu = med.tolist()
            ratio = ours_s / plain_s
            verdict = "" if not large or name.endswith("*") else f" ({'OK' if ratio <= LIMIT else 'OVER'} at {LIMIT}x)"
            lines.append(f"{world} ranks  {label:>6}  {name:<19} ours {ours_s * 1e3:9.3f} ms  torch {plain_s * 1e3:9.3f} ms"
                         f"  ratio {ratio:5.2f}x  diff {(ours_s - plain_s) * 1e3:+8.3f} ms  cpu/call ours "
                         f"{ours_cpu * 1e3:.3f} torch {plain_cpu * 1e3:.3f} ms{verdict}")
    dist.destroy_process_group()
    if rank == 0:
        os.write(wfd, ("\n".join(lines) + "\n").encode())


def _run(world: int, repeat: int, sizes: list) -> str:
    report, codes = fork_world(world, _rank_main, repeat, sizes)
    if any(codes):
        raise SystemExit(f"{world} ranks: exited with {codes}")
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--sizes", nargs="+", choices=["1 KiB", "64 MiB"], default=["1 KiB", "64 MiB"])
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, gloo; medians of {args.repeat} interleaved runs "
          f"(large: {max(3, args.repeat // 3)}), slowest rank")
    report = ""
    for world in args.ranks:
        text = _run(world, args.repeat, args.sizes)
        print(text, end="", flush=True)
        report += text
    return 3 if "OVER" in report else 0


if __name__ == "__main__":
    sys.exit(main())
