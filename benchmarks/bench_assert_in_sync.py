"""Benchmark: assert_in_sync on a ~100M-parameter model, 2 CPU ranks over gloo.

Prints two figures:

* time ratio: one ``assert_in_sync(model)`` over one local pass over the parameters (summing them
  all), both measured on every rank at the same time, best of ``--repeat`` interleaved runs, one
  thread per rank (target: at most 3x);
* bytes exchanged per rank by ``assert_in_sync``, for this model and for a model with the same
  tensors but ~50x fewer parameters (target: proportional to the number of tensors).

Run: ``PYTHONPATH=. python benchmarks/bench_assert_in_sync.py [--layers 8 --width 1024]``.
Needs about 1 GB of memory per rank.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import pickle
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from ddpdoctor.diagnostics.desync import _fingerprint_tensor, assert_in_sync


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


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def rank_main(rank: int, world: int, store_path: str, big: torch.nn.Module, small: torch.nn.Module,
              repeat: int) -> dict:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    params = list(big.parameters())
    assert_in_sync(big)  # warm-up: weight tables, gloo connections
    tensors = params + list(big.buffers())
    local = check = hashing = float("inf")
    for _ in range(repeat):  # interleaved, so that all three see the same machine load
        local = min(local, best_of(lambda: [p.detach().sum() for p in params], 1))
        check = min(check, best_of(lambda: assert_in_sync(big), 1))
        hashing = min(hashing, best_of(lambda: [_fingerprint_tensor(t) for t in tensors], 1))
    with Tally() as tally_big:
        assert_in_sync(big)
    with Tally() as tally_small:
        assert_in_sync(small)
    dist.destroy_process_group()
    return {"local": local, "check": check, "hashing": hashing, "bytes_big": tally_big.bytes, "calls_big": tally_big.calls,
            "bytes_small": tally_small.bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    world = 2
    big, small = build(args.layers, args.width), build(args.layers, 128)
    n_params = sum(p.numel() for p in big.parameters())
    n_small = sum(p.numel() for p in small.parameters())
    n_tensors = sum(1 for _ in big.parameters()) + sum(1 for _ in big.buffers())
    store_path = os.path.join(tempfile.mkdtemp(prefix="ddpdoctor-bench-"), "store")
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
    shutil.rmtree(os.path.dirname(store_path), ignore_errors=True)  # nothing left in /tmp
    for rank, res in enumerate(results):
        if "error" in res:
            sys.exit(f"rank {rank} failed: {res['error']}")
    local = max(r["local"] for r in results)
    check = max(r["check"] for r in results)
    hashing = max(r["hashing"] for r in results)
    r0 = results[0]
    print(f"model: {n_params / 1e6:.1f}M parameters in {n_tensors} tensors "
          f"({n_params * 4 / 1e6:.0f} MB fp32 per rank), {world} CPU ranks, gloo")
    print(f"local pass (sum of every parameter): {local * 1e3:.1f} ms")
    print(f"assert_in_sync(model):               {check * 1e3:.1f} ms")
    print(f"  of which fingerprinting (no communication): {hashing * 1e3:.1f} ms "
          f"({hashing / local:.2f}x the local pass)")
    print(f"time ratio: {check / local:.2f}x (target <= 3x)")
    print(f"bytes sent per rank: {r0['bytes_big']} in {r0['calls_big']} collectives "
          f"({r0['bytes_big'] / n_tensors:.1f} bytes per tensor; parameters are {n_params * 4} bytes)")
    print(f"same tensors, {n_small / 1e6:.1f}M parameters: {r0['bytes_small']} bytes "
          f"(proportional to tensors, not parameters: {r0['bytes_small'] == r0['bytes_big']})")


if __name__ == "__main__":
    main()
