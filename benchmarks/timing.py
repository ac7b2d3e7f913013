"""Shared by the benchmark scripts: time a whole command, stopping the benchmark if it fails."""

from __future__ import annotations

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
