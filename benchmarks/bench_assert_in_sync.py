"""Benchmark: assert_in_sync on a ~100M-parameter model, 2 CPU ranks over gloo, fp32 and bf16.

Prints, for the model in float32 and in bfloat16:

* the floor: one ``sum`` over a flat buffer holding the same bytes in the same dtype (one read of
  the model's bytes), and the ratio to it of fingerprinting every tensor (local, no communication)
  and of one whole ``assert_in_sync(model)``; medians of ``--repeat`` interleaved runs, measured on
  every rank at the same time, one thread per rank (target: at most 3x);
* the largest single allocation made while fingerprinting, measured with PyTorch's profiler
  (``profile_memory=True``: every CPU allocation of every op), against the chunk bound
  (``CHUNK_BYTES``, 4 MiB; target: at most the chunk whatever the tensor size);
* bytes exchanged per rank by ``assert_in_sync``, for this model and for a model with the same
  tensors but ~50x fewer parameters (target: proportional to the number of tensors).

With ``--device cuda`` (a GPU machine), one process instead: the floor and the fingerprint of the same
model on the GPU, timed with CUDA events, and the largest temporary from the allocator's peak
(``--device cpu --unfused`` runs that same path on a CPU, for its own sake: not a GPU figure).

Run: ``PYTHONPATH=. python benchmarks/bench_assert_in_sync.py [--layers 8 --width 1024]``.
Needs about 1 GB of memory per rank.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import pickle
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from ddpdoctor.diagnostics.desync import assert_in_sync
from ddpdoctor.diagnostics.fingerprint import CHUNK_BYTES, fingerprint_many


def build(layers: int, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.TransformerEncoderLayer(width, nhead=16, dim_feedforward=4 * width)
                                 for _ in range(layers)])


class Tally:
    """Counts the bytes this rank sends through all_gather/all_reduce while active."""

    def __init__(self) -> None:
        self.bytes = 0
        self.calls = 0
        self._orig = {}

    def __enter__(self) -> "Tally":
        for name in ("all_gather", "all_reduce"):
            orig = getattr(dist, name)
            self._orig[name] = orig

            def counted(*args, _orig=orig, _name=name, **kwargs):
                tensor = args[1] if _name == "all_gather" else args[0]
                self.bytes += tensor.numel() * tensor.element_size()
                self.calls += 1
                return _orig(*args, **kwargs)

            setattr(dist, name, counted)
        return self

    def __exit__(self, *exc) -> None:
        for name, orig in self._orig.items():
            setattr(dist, name, orig)


def timed(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def largest_allocation(fn) -> int:
    """The largest single CPU allocation any op makes while ``fn`` runs (PyTorch's profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.cpu_memory_usage for e in prof.events()), default=0)


def measure(model: torch.nn.Module, repeat: int) -> dict:
    """Floor, fingerprinting and assert_in_sync on this rank, interleaved; medians in seconds."""
    tensors = list(model.parameters()) + list(model.buffers())
    flat = torch.cat([t.detach().reshape(-1) for t in model.parameters()])  # same bytes, same dtype
    assert_in_sync(model)  # warm-up: weight and key tables, gloo connections
    runs: dict = {"floor": [], "hashing": [], "check": []}
    for _ in range(repeat):  # interleaved, so that all three see the same machine load
        runs["floor"].append(timed(lambda: flat.sum()))
        runs["hashing"].append(timed(lambda: fingerprint_many(tensors)))
        runs["check"].append(timed(lambda: assert_in_sync(model)))
    out = {k: statistics.median(v) for k, v in runs.items()}
    out["largest"] = largest_allocation(lambda: fingerprint_many(tensors))
    out["largest_floor"] = largest_allocation(lambda: flat.sum())
    return out


def device_rows(model: torch.nn.Module, device: str, repeat: int, fused) -> None:
    """The floor and fingerprint_many of the model on one device, one process; prints the rows."""
    cuda = device.startswith("cuda")
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        model = model.to(device=device, dtype=dtype)
        tensors = list(model.parameters()) + list(model.buffers())
        flat = torch.cat([t.detach().reshape(-1) for t in model.parameters()])
        fingerprint_many(tensors, fused=fused)  # warm-up: weight, key and pack tables

        def clock(fn) -> float:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - start

        floors, hashes = [], []
        for _ in range(repeat):  # interleaved
            floors.append(clock(lambda: flat.sum()))
            hashes.append(clock(lambda: fingerprint_many(tensors, fused=fused)))
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            fingerprint_many(tensors, fused=fused)
            torch.cuda.synchronize()
            largest = f"{(torch.cuda.max_memory_allocated() - before) / 2**20:.2f} MiB at peak above the model"
        else:
            largest = f"{largest_allocation(lambda: fingerprint_many(tensors, fused=fused)) / 2**20:.2f} MiB largest"
        floor, hashing = statistics.median(floors), statistics.median(hashes)
        label = torch.cuda.get_device_name() if cuda else f"{device} (unfused path)"
        print(f"{name} on {label}: floor {floor * 1e3:.3f} ms; fingerprint_many of {len(tensors)} tensors "
              f"{hashing * 1e3:.3f} ms, {hashing / floor:.2f}x the floor (target <= 3x); {largest} "
              f"(chunk bound {CHUNK_BYTES / 2**20:.0f} MiB)")


def rank_main(rank: int, world: int, store_path: str, big: torch.nn.Module, small: torch.nn.Module,
              repeat: int) -> dict:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    result = {"fp32": measure(big, repeat)}
    result["bf16"] = measure(big.to(torch.bfloat16), repeat)
    big.float()
    with Tally() as tally_big:
        assert_in_sync(big)
    with Tally() as tally_small:
        assert_in_sync(small)
    dist.destroy_process_group()
    result.update({"bytes_big": tally_big.bytes, "calls_big": tally_big.calls, "bytes_small": tally_small.bytes})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--device", default=None, help="cuda: the one-process GPU rows (see above)")
    parser.add_argument("--unfused", action="store_true", help="with --device cpu: the GPU code path on a CPU")
    args = parser.parse_args()
    if args.device:
        device_rows(build(args.layers, args.width), args.device, args.repeat, False if args.unfused else None)
        return
    world = 2
    big, small = build(args.layers, args.width), build(args.layers, 128)
    n_params = sum(p.numel() for p in big.parameters())
    n_small = sum(p.numel() for p in small.parameters())
    n_tensors = sum(1 for _ in big.parameters()) + sum(1 for _ in big.buffers())
    store_dir = tempfile.mkdtemp(prefix="ddpdoctor-bench-")
    store_path = os.path.join(store_dir, "store")
    children = []
    for rank in range(world):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                data = pickle.dumps(rank_main(rank, world, store_path, big, small, args.repeat))
            except BaseException as exc:  # noqa: BLE001
                data = pickle.dumps({"error": repr(exc)})
                code = 1
            with os.fdopen(w, "wb") as f:
                f.write(data)
            os._exit(code)
        os.close(w)
        children.append((pid, r))
    results = []
    for pid, r in children:
        with os.fdopen(r, "rb") as f:
            results.append(pickle.loads(f.read()))
        os.waitpid(pid, 0)
    shutil.rmtree(store_dir, ignore_errors=True)
    for rank, res in enumerate(results):
        if "error" in res:
            sys.exit(f"rank {rank} failed: {res['error']}")
    r0 = results[0]
    print(f"model: {n_params / 1e6:.1f}M parameters in {n_tensors} tensors "
          f"({n_params * 4 / 1e6:.0f} MB fp32, {n_params * 2 / 1e6:.0f} MB bf16 per rank), {world} CPU ranks, "
          f"gloo, 1 thread per rank; medians of {args.repeat} interleaved runs, slowest rank")
    for dtype in ("fp32", "bf16"):
        floor = max(r[dtype]["floor"] for r in results)
        hashing = max(r[dtype]["hashing"] for r in results)
        check = max(r[dtype]["check"] for r in results)
        largest = max(r[dtype]["largest"] for r in results)
        print(f"{dtype}: floor (one sum over a flat buffer of the same bytes): {floor * 1e3:.1f} ms")
        print(f"{dtype}:   fingerprint every tensor (no communication): {hashing * 1e3:.1f} ms, "
              f"{hashing / floor:.2f}x the floor")
        print(f"{dtype}:   assert_in_sync(model): {check * 1e3:.1f} ms, {check / floor:.2f}x the floor "
              f"(target <= 3x)")
        print(f"{dtype}:   largest allocation while fingerprinting: {largest / 2**20:.2f} MiB "
              f"(chunk bound {CHUNK_BYTES / 2**20:.0f} MiB: {'met' if largest <= CHUNK_BYTES else 'NOT met'}; "
              f"the floor's own sum: {max(r[dtype]['largest_floor'] for r in results) / 2**20:.2f} MiB)")
    print(f"bytes sent per rank: {r0['bytes_big']} in {r0['calls_big']} collectives "
          f"({r0['bytes_big'] / n_tensors:.1f} bytes per tensor; parameters are {n_params * 4} bytes)")
    print(f"same tensors, {n_small / 1e6:.1f}M parameters: {r0['bytes_small']} bytes "
          f"(proportional to tensors, not parameters: {r0['bytes_small'] == r0['bytes_big']})")


if __name__ == "__main__":
    main()
