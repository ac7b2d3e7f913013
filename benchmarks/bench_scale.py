"""The control plane and every default check at scale: 2, 8, 32, 128 ranks on one machine.

For each world size it prints the wall time (median of REPEAT runs), the time each rank beyond the
first 2 adds, and the control-store messages: each rank's writes and reads (hello, directives,
results: the same at every size), its waits (one per second it waits for a directive: they follow
the time, not the world) and the supervisor's (its polling: one counter or roll per tick, never one key per
rank, so per rank it falls as the world grows). The counts come from runner/channel.py's COUNTS,
written per process through DDPDOCTOR_CHANNEL_COUNTS. The floor (floor_world.py) at the same size
is timed alongside. ``--default`` also runs every default check at each size (once, after the
control-plane runs) and prints its wall time, its ratio to the same size's floor, the time per rank
added, each rank's store messages, the memory each rank holds (proportional set size: the pages
shared with the other ranks after the fork count in part; sampled every second, the largest mean),
how far the runner scaled the per-check deadline for the world, and whether it passed: the checks
adapt their work to the world, and the default check must never time out on a healthy one.

Not counted: gloo's own rendezvous through the store (every rank reads every peer's address: a
full mesh is O(N) per rank by design) and the collectives check's progress key (one write per
operation per rank).

Usage: python benchmarks/bench_scale.py [--ranks 2 8 32 128] [--repeat 3] [--default]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import re
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(cmd: list, env: dict, timeout: float, sample_memory: bool = False) -> tuple[float, int, str, float]:
    """(wall seconds, exit code, output, largest mean PSS per child process in MiB, 0 unless sampled)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    peak = [0.0]
    stop = threading.Event()
    if sample_memory:
        threading.Thread(target=_sample_pss, args=(p.pid, stop, peak), daemon=True).start()
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    stop.set()
    return time.perf_counter() - t0, p.returncode, out, peak[0]


def _sample_pss(pid: int, stop: threading.Event, peak: list) -> None:
    """Every second: the mean proportional set size of ``pid``'s children (the ranks), in MiB."""
    import psutil

    try:
        parent = psutil.Process(pid)
    except psutil.Error:
        return
    while not stop.wait(1.0):
        sizes = []
        try:
            children = parent.children(recursive=True)
        except psutil.Error:
            return
        for c in children:
            try:
                sizes.append(c.memory_full_info().pss)
            except (psutil.Error, AttributeError):
                continue
        if len(sizes) >= 2:
            peak[0] = max(peak[0], statistics.mean(sizes) / (1 << 20))


def _counts(folder: str, n: int) -> tuple[float, int, float, float]:
    """(mean messages per worker, max, mean waits per worker, supervisor messages per rank).

    A message is a write or a read; a worker waiting for its next directive also sends one
    ``wait`` per second it waits (counted apart: it follows the time, not the world size).
    """
    per_rank, waits = [], []
    for r in range(n):
        path = os.path.join(folder, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                c = json.load(f)
            waits.append(c.pop("wait", 0))
            per_rank.append(sum(c.values()))
    with open(os.path.join(folder, "supervisor.json")) as f:
        sup = sum(json.load(f).values())
    return (statistics.mean(per_rank) if per_rank else float("nan"), max(per_rank, default=0),
            statistics.mean(waits) if waits else float("nan"), sup / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 8, 32, 128])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=30.0, help="ddpdoctor's per-check deadline")
    ap.add_argument("--default", action="store_true", help="also run every default check at each size")
    args = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"{'ranks':>5}  {'floor s':>8}  {'check s':>8}  {'s/rank added':>12}  {'msgs/rank':>9}  "
          f"{'max':>4}  {'waits/rank':>10}  {'supervisor msgs/rank':>20}")
    base = None
    failed = False
    rows = []
    floor_of: dict[int, float] = {}
    for n in args.ranks:
        walls, floors, counts = [], [], []
        for _ in range(args.repeat):
            folder = tempfile.mkdtemp(prefix="ddpdoctor-bench-")
            try:
                env = {**os.environ, "DDPDOCTOR_CHANNEL_COUNTS": folder}
                f_wall, f_rc, f_out, _ = _run([sys.executable, os.path.join(HERE, "floor_world.py"), str(n)], env,
                                              600)
                wall, rc, out, _ = _run([sys.executable, "-m", "ddpdoctor", "check", "--nproc", str(n), "--only",
                                         "env,port,process-group", "--timeout", str(args.timeout)], env, 900)
                if rc != 0 or f_rc != 0:
                    print(f"{n} ranks: check exit {rc}, floor exit {f_rc}:\n{out[-1500:]}{f_out[-500:]}")
                    failed = True
                    break
                walls.append(wall)
                floors.append(f_wall)
                counts.append(_counts(folder, n))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        if not walls:
            continue
        wall = statistics.median(walls)
        mean_msgs = statistics.median(c[0] for c in counts)
        top = max(c[1] for c in counts)
        waits = statistics.median(c[2] for c in counts)
        sup = statistics.median(c[3] for c in counts)
        added = "-" if base is None else f"{(wall - base[1]) / (n - base[0]):.3f}"
        base = base or (n, wall)
        rows.append((n, wall, mean_msgs))
        floor_of[n] = statistics.median(floors)
        print(f"{n:>5}  {floor_of[n]:>8.2f}  {wall:>8.2f}  {added:>12}  {mean_msgs:>9.1f}  {top:>4}  "
              f"{waits:>10.1f}  {sup:>20.1f}", flush=True)
    if len({round(r[2], 1) for r in rows}) > 1:
        print("MISSED: the messages per rank changed with the world size")
        failed = True
    if args.default:
        failed |= _default(args, floor_of)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sys.exit(1 if failed else 0)


def _default(args: argparse.Namespace, floor_of: dict) -> bool:
    """Every default check at each size: wall, ratio to the floor, s/rank added, messages, memory, verdict."""
    print(f"\n{'ranks':>5}  {'default s':>9}  {'vs floor':>8}  {'s/rank added':>12}  {'msgs/rank':>9}  "
          f"{'PSS MiB/rank':>12}  {'deadline':>8}  verdict")
    failed = False
    base = None
    for n in args.ranks:
        folder = tempfile.mkdtemp(prefix="ddpdoctor-bench-")
        try:
            report = os.path.join(folder, "report.json")
            env = {**os.environ, "DDPDOCTOR_CHANNEL_COUNTS": folder}
            wall, rc, out, pss = _run([sys.executable, "-m", "ddpdoctor", "check", "--nproc", str(n), "--timeout",
                                       str(args.timeout), "--json", report], env, 3600, sample_memory=True)
            msgs = _counts(folder, n)[0] if os.path.exists(os.path.join(folder, "supervisor.json")) else float("nan")
            scale = _deadline_scale(report)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        last = [line for line in out.splitlines() if line.strip()][-1:] or ["(no output)"]
        bad = [line.strip() for line in out.splitlines() if line.startswith(("[TIME]", "[FAIL]", "[CRASH]"))]
        added = "-" if base is None else f"{(wall - base[1]) / (n - base[0]):.3f}"
        base = base or (n, wall)
        ratio = f"{wall / floor_of[n]:.2f}x" if n in floor_of else "-"
        memory = f"{pss:.1f}" if pss else "-"  # none when the run ended before the first sample
        print(f"{n:>5}  {wall:>9.2f}  {ratio:>8}  {added:>12}  {msgs:>9.1f}  {memory:>12}  {scale:>7.1f}x  "
              f"exit {rc}: {last[0].strip()}" + "".join(f"\n       {b}" for b in bad), flush=True)
        failed |= rc != 0
    return failed


def _deadline_scale(report: str) -> float:
    """The largest factor the runner scaled the per-check deadline by (1 when it did not)."""
    try:
        with open(report) as f:
            checks = json.load(f).get("checks", [])
    except (OSError, ValueError):
        return float("nan")
    found = [float(m.group(1)) for c in checks for line in c.get("details", [])
             for m in [re.search(r"scaled ([\d.]+)x for this world", line)] if m]
    return max(found, default=1.0)


if __name__ == "__main__":
    main()
