"""The Flight Recorder's cost per collective, and whether it could time collectives for the straggler score.

Issue 26 asks for a measured decision: should ``run``'s straggler timeline take DDP's and C++
collectives from the Flight Recorder instead of the injected autograd hooks? Two measurements:

* cost: the same 2-rank gloo job (``mp.spawn``, DDP over a small MLP plus one ``all_reduce`` per step)
  runs with the recorder on (``TORCH_FR_BUFFER_SIZE=2000``, what ``run`` sets) and off (``0``),
  interleaved ``--repeat`` times; each rank reports its CPU seconds (``time.process_time``: every
  thread of the rank) over the steps after ``--warmup``, and how many collectives a step issues (from
  ``pg_status``). The cost per collective is (on - off) / collectives, from the medians;
* exactness: in the recorder-on job, rank 0 dumps its recorder at the end and reports whether the
  entries carry the times a straggler score needs (when each collective started and completed).

Usage: python benchmarks/bench_recorder.py [--repeat 5] [--steps 300] [--warmup 50]
The load average is printed before and after: on a shared machine read the spread too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

JOB = r'''
import json, os, pickle, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def work(rank, store, steps, warmup, out):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    x, t = torch.randn(16, 32), torch.ones(4)
    for step in range(steps):
        if step == warmup:
            cpu0, n0 = time.process_time(), enqueued()
        model(x).sum().backward()
        dist.all_reduce(t)
    cpu, n = time.process_time() - cpu0, enqueued() - n0
    result = {"rank": rank, "cpu_per_step": cpu / (steps - warmup), "collectives_per_step": n / (steps - warmup)}
    if rank == 0 and os.environ.get("TORCH_FR_BUFFER_SIZE") != "0":
        from torch._C._distributed_c10d import _dump_fr_trace
        entries = pickle.loads(_dump_fr_trace(True, False, False))["entries"]
        last = entries[-1]
        result["entry_states"] = sorted({e.get("state") for e in entries})
        result["timing_keys"] = {k: last.get(k) for k in ("time_created_ns", "time_discovered_started_ns",
                                                             "time_discovered_completed_ns", "duration_ms")}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    os._exit(0)  # skips gloo's teardown, which aborted a rank now and then (torch 2.13)


def enqueued():
    from torch._C._distributed_c10d import _dump_fr_trace
    if os.environ.get("TORCH_FR_BUFFER_SIZE") == "0":
        return float("nan")
    doc = pickle.loads(_dump_fr_trace(False, False, False))
    return sum(int(s["last_enqueued_collective"]) for s in doc["pg_status"].values())


if __name__ == "__main__":
    steps, warmup, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    mp.spawn(work, args=(os.path.join(out, "store"), steps, warmup, out), nprocs=2)
'''


def one(size: str, steps: int, warmup: int) -> list:
    with tempfile.TemporaryDirectory(prefix="bench-recorder-") as out:
        script = os.path.join(out, "job.py")
        with open(script, "w") as f:
            f.write(JOB)
        env = {**os.environ, "TORCH_FR_BUFFER_SIZE": size}
        p = subprocess.run([sys.executable, script, str(steps), str(warmup), out], env=env, capture_output=True,
                           text=True, timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"the job failed ({p.returncode}): {p.stderr[-1500:]}")
        results = []
        for r in range(2):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                results.append(json.load(f))
        return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=50)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    cpu: dict = {"on": [], "off": []}
    per_step = None
    exact = None
    for _ in range(args.repeat):
        for label, size in (("on", "2000"), ("off", "0")):
            results = one(size, args.steps, args.warmup)
            cpu[label].append(statistics.mean(r["cpu_per_step"] for r in results))
            if label == "on":
                per_step = results[0]["collectives_per_step"]
                exact = {k: results[0][k] for k in ("entry_states", "timing_keys")}
    on, off = statistics.median(cpu["on"]), statistics.median(cpu["off"])
    print(f"CPU per step per rank, median of {args.repeat}: recorder on {on * 1e6:.0f} us, off {off * 1e6:.0f} us "
          f"(on: {', '.join(f'{c * 1e6:.0f}' for c in cpu['on'])}; off: {', '.join(f'{c * 1e6:.0f}' for c in cpu['off'])})")
    print(f"collectives per step: {per_step:g}; recorder cost per collective: {(on - off) / per_step * 1e6:.1f} us "
          f"({(on - off) / off * 100:+.1f}% of a step)")
    print(f"gloo entries' states: {exact['entry_states']}; the last entry's times: {exact['timing_keys']}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
