"""Time `ddpdoctor check` (CPU, gloo) against a floor in the same run.

The floor (floor_world.py) imports torch once, forks N ranks, initializes gloo, does one all_reduce
and exits: the least any tool that checks a real world can do. Subjects: `ddpdoctor check` with
every default check (targets: <= 1.3x the floor at 2 ranks, <= 1.5x at 8 ranks) and with
`--only env,port,process-group` (the control plane; <= 1.5x, <= 2x). The floor and the subjects run
interleaved, REPEAT times each, and the medians are compared. The load average is printed with the
numbers: on a busy machine the wall-time ratios are noisy, re-measure them on a quiet one; the CPU
seconds (user + system of every process of the command) are printed beside them, as a ratio that
the load does not move (it is not the target: on a quiet machine ranks run in parallel).

Usage: python benchmarks/bench_check.py [--repeat 5] [--ranks 2 8] [--subjects default control]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from timing import timed, timed_cpu

HERE = os.path.dirname(os.path.abspath(__file__))
SUBJECTS = {
    "default": ([], {2: 1.3, 8: 1.5}),
    "control": (["--only", "env,port,process-group"], {2: 1.5, 8: 2.0}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--subjects", nargs="+", default=list(SUBJECTS), choices=list(SUBJECTS))
    args = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"{'subject':<8} {'ranks':>5}  {'floor s':>8}  {'check s':>8}  {'ratio':>6}  target   "
          f"{'floor cpu':>9}  {'check cpu':>9}  {'cpu ratio':>9}")
    worst_ok = True
    for n in args.ranks:
        floor_cmd = [sys.executable, os.path.join(HERE, "floor_world.py"), str(n)]
        cmds = {s: [sys.executable, "-m", "ddpdoctor", "check", "--backend", "gloo", "--nproc", str(n),
                    *SUBJECTS[s][0]]  # the floor is gloo on CPU: like with like, on any machine
                for s in args.subjects}
        floors: list[tuple[float, float]] = []
        times: dict[str, list[tuple[float, float]]] = {s: [] for s in args.subjects}
        timed(floor_cmd)  # warm the page cache
        for cmd in cmds.values():
            timed(cmd)
        for _ in range(args.repeat):
            floors.append(timed_cpu(floor_cmd))
            for s, cmd in cmds.items():
                times[s].append(timed_cpu(cmd))
        f = statistics.median(w for w, _ in floors)
        f_cpu = statistics.median(c for _, c in floors)
        for s in args.subjects:
            c = statistics.median(w for w, _ in times[s])
            c_cpu = statistics.median(cpu for _, cpu in times[s])
            target = SUBJECTS[s][1].get(n)
            ok = target is None or c / f <= target
            worst_ok &= ok
            print(f"{s:<8} {n:>5}  {f:>8.3f}  {c:>8.3f}  {c / f:>6.2f}  {'<= %.1fx' % target if target else '-':<7}  "
                  f"{f_cpu:>9.2f}  {c_cpu:>9.2f}  {c_cpu / f_cpu:>9.2f}{'' if ok else '  MISSED'}", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sys.exit(0 if worst_ok else 1)


if __name__ == "__main__":
    main()
