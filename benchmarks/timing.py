"""Shared by the benchmark scripts: time a whole command, stopping the benchmark if it fails."""

from __future__ import annotations

import resource
import subprocess
import time


def timed(cmd: list) -> float:
    """Wall seconds of ``cmd`` (output discarded); exits the benchmark with its stderr if it fails."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-500:]}")
    return elapsed


def timed_cpu(cmd: list) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the command and every process it waited for).

    On a machine busy with other work, wall time follows the load; the CPU seconds do not.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = timed(cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
