"""Benchmark: ``explain_text`` with the grown catalogue and its evidence pass.

Prints three ratios (best of ``--repeat`` runs each):

* corpus: the whole catalogue over the 151 corpus logs, against the 14 causes the catalogue had
  before issue 17 (same matcher, same logs) (target: at most 4x);
* doubling: a generated job log of N lines against one of 2N lines (target: about 2x: linear);
* long lines: 200 lines of 4 KB against 200 lines of 8 KB, made of the pieces the patterns look for
  (``[0]``, ``NET/Socket : Using``, ``sm_``) without the endings that would match (target: about 2x).

Run: ``PYTHONPATH=. python benchmarks/bench_explain.py [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import glob
import os
import time

from ddpdoctor.causes.catalogue import CAUSES
from ddpdoctor.causes.matcher import explain_text

ORIGINAL = ("no-default-process-group", "port-in-use", "gloo-connect-full-mesh", "rendezvous-unreachable",
            "nccl-watchdog-timeout", "nccl-system-error", "duplicate-gpu", "ddp-unused-parameters",
            "ddp-model-mismatch", "collective-mismatch", "syncbn-cpu", "cuda-oom-gpu0", "peer-closed",
            "killed-by-signal")
HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, os.pardir, "tests", "explain_corpus", "cases")


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def job_log(lines: int) -> str:
    body = ["[rank{}]: Epoch 3 | step {} | loss 0.4127 | lr 3.0e-04 | 812 samples/s",
            "gpu-a-017:41230:41247 [0] NCCL INFO Channel 00/0 : 0[1a000] -> 1[1b000] via P2P/IPC",
            "  File \"/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py\", line 1532, in _wrapped_call_impl",
            "Running tokenizer on dataset:  61%|██████    | 1220000/2000000 [12:58<09:10, 678.12 examples/s]"]
    return "\n".join(body[i % 4].format(i % 8, i) for i in range(lines))


def hostile(width: int) -> str:
    pieces = ("[0]", "NET/Socket : Using ", "with CUDA capability sm_", "network addresses of (", "--nproc_per_node=",
              "CUDA_VISIBLE_DEVICES=0,", "find_unused_parameters", "SIG", "MEMBER: ", "Timeout(ms)=")
    out = []
    for i in range(200):
        line, k = [], 0
        while sum(len(p) for p in line) < width:
            line.append(pieces[(i + k) % len(pieces)])
            k += 1
        out.append("".join(line)[:width])
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    logs = []
    for path in sorted(glob.glob(os.path.join(CASES, "*.log"))):
        with open(path, encoding="utf-8") as f:
            logs.append(f.read())
    original = [c for c in CAUSES if c.id in ORIGINAL]
    t_new = best(lambda: [explain_text(t) for t in logs], args.repeat)
    t_old = best(lambda: [explain_text(t, original) for t in logs], args.repeat)
    print(f"corpus ({len(logs)} logs): {t_new * 1000:.1f} ms with {len(CAUSES)} causes, {t_old * 1000:.1f} ms with "
          f"the {len(original)} original ones: ratio {t_new / t_old:.2f}x (target <= 4x)")
    small, large = job_log(20_000), job_log(40_000)
    t1, t2 = best(lambda: explain_text(small), args.repeat), best(lambda: explain_text(large), args.repeat)
    print(f"doubling: 20000 lines {t1 * 1000:.0f} ms, 40000 lines {t2 * 1000:.0f} ms: ratio {t2 / t1:.2f}x (target ~2x)")
    h1, h2 = hostile(4096), hostile(8192)
    t1, t2 = best(lambda: explain_text(h1), args.repeat), best(lambda: explain_text(h2), args.repeat)
    print(f"long lines: 200 x 4 KB {t1 * 1000:.1f} ms, 200 x 8 KB {t2 * 1000:.1f} ms: ratio {t2 / t1:.2f}x (target ~2x)")


if __name__ == "__main__":
    main()
