"""How often ddpdoctor's own commands, and a training script, end in an abort at exit.

A finished gloo job could abort at interpreter exit ("terminate called without an active exception",
SIGABRT; see ddpdoctor/training/teardown.py for the cause). This counts, over N runs each:

- ``ddpdoctor check --only process-group,param-sync,bn-sync`` (gloo ranks, DDP, BatchNorm): the CLI
  and its ranks end with ``os._exit`` after their exit handlers, so they never reach the teardown;
- with ``--script PATH``: that script under ``torchrun --standalone --nproc-per-node 2`` (e.g. the
  README's in-loop example, with and without ``import ddpdoctor``).

Prints one line per command: runs, aborts (a run whose output says "terminate called" or whose exit
code means SIGABRT), other failures. Exit 1 when ddpdoctor's own command aborted at least once.

    python benchmarks/bench_exits.py --runs 50
    python benchmarks/bench_exits.py --runs 20 --script train.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile


def count(cmd: list, runs: int, env: dict) -> tuple[int, int]:
    """(aborts, other failures) of ``cmd`` over ``runs`` runs."""
    aborts = failures = 0
    for _ in range(runs):
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        out = p.stdout + p.stderr
        if "terminate called" in out or p.returncode in (-6, 134) or "exitcode: -6" in out:
            aborts += 1
        elif p.returncode != 0:
            failures += 1
    return aborts, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="runs per command (default 50)")
    parser.add_argument("--script", help="also run this training script under torchrun (2 ranks)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: pass 1 or more")
    with tempfile.TemporaryDirectory(prefix="bench-exits-") as tmp:
        env = dict(os.environ, TMPDIR=tmp, PYTHONWARNINGS="ignore")  # torchrun's own files land here, removed after
        own = [sys.executable, "-m", "ddpdoctor", "check", "--only", "process-group,param-sync,bn-sync"]
        aborts, failures = count(own, args.runs, env)
        print(f"ddpdoctor check (gloo, DDP, BatchNorm): {aborts} aborts, {failures} other failures in {args.runs} runs")
        if args.script:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", args.script]
            s_aborts, s_failures = count(cmd, args.runs, env)
            print(f"torchrun {args.script}: {s_aborts} aborts, {s_failures} other failures in {args.runs} runs")
    return 1 if aborts else 0


if __name__ == "__main__":
    sys.exit(main())
