"""Time `ddpdoctor check` (env, port, process-group; CPU, gloo) against a floor in the same run.

The floor (floor_world.py) imports torch once, forks N ranks, initializes gloo, does one all_reduce
and exits: the least any tool that checks a real world can do. Each command runs REPEAT times,
interleaved, and the medians are compared. Targets: <= 1.5x the floor at 2 ranks, <= 2x at 8 ranks.

Usage: python benchmarks/bench_check.py [--repeat 7] [--ranks 2 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from timing import timed

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKS = "env,port,process-group"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 8])
    args = ap.parse_args()
    targets = {2: 1.5, 8: 2.0}
    print(f"{'ranks':>5}  {'floor s':>8}  {'check s':>8}  {'ratio':>6}  target")
    worst_ok = True
    for n in args.ranks:
        floor_cmd = [sys.executable, os.path.join(HERE, "floor_world.py"), str(n)]
        check_cmd = [sys.executable, "-m", "ddpdoctor", "check", "--backend", "gloo", "--nproc", str(n),
                     "--only", CHECKS]  # the floor is a gloo world on CPU: compare like with like, on any machine
        floors, checks = [], []
        timed(floor_cmd), timed(check_cmd)  # warm the page cache
        for _ in range(args.repeat):
            floors.append(timed(floor_cmd))
            checks.append(timed(check_cmd))
        f, c = statistics.median(floors), statistics.median(checks)
        target = targets.get(n)
        ok = target is None or c / f <= target
        worst_ok &= ok
        print(f"{n:>5}  {f:>8.3f}  {c:>8.3f}  {c / f:>6.2f}  {'<= %.1fx' % target if target else '-'}"
              f"{'' if ok else '  MISSED'}")
    sys.exit(0 if worst_ok else 1)


if __name__ == "__main__":
    main()
