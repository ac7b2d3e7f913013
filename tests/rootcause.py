"""The root-cause matrix, shared by tests/test_root_cause.py and benchmarks/fault_matrix.py.

A cell is one way a rank fails (FAULT_KIND, see tests/faults.py), when (before the world forms, or
while the others wait in all_reduce), which rank, how many ranks, and where the world runs (local,
torchrun). The failing rank writes the wall-clock time of its failure to FAULT_STAMP; the time to
the verdict is from then to the moment the check's line is printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Optional

from faults import FAULT_KINDS

__all__ = ["Cell", "FAULT_KINDS", "ranks_in", "verify", "run_cli", "cell_env"]

TESTS = os.path.dirname(os.path.abspath(__file__))
STATUS = {kind: ("FAIL" if kind == "fail" else "CRASH") for kind in FAULT_KINDS}
_WORDS = {
    "raise": r"raised RuntimeError: injected failure on rank {r} \(tests/faults\.py:\d+\)",
    "fail": r"failed: injected finding on rank {r}",
    "exit0": r"exited with code 0 during 'fault-matrix'",
    "exit3": r"exited with code 3 during 'fault-matrix'",
    "sysexit2": r"called sys\.exit\(2\) \(tests/faults\.py:\d+\) during 'fault-matrix'",
    "sigkill": r"was killed by SIGKILL during 'fault-matrix'",
    "sigsegv": r"died of SIGSEGV in fail_now \(tests/faults\.py:\d+\) during 'fault-matrix'",
}


@dataclass(frozen=True)
class Cell:
    kind: str
    when: str  # "before" or "during"
    nproc: int
    rank: int
    mode: str = "local"  # local, torchrun

    @property
    def name(self) -> str:
        return f"{self.mode}-{self.kind}-{self.when}-{self.nproc}r-rank{self.rank}"


def cell_env(base: dict, cell: Cell, stamp: str) -> dict:
    return {**base, "DDPDOCTOR_PLUGINS": "faults", "FAULT_KIND": cell.kind, "FAULT_WHEN": cell.when,
            "FAULT_RANK": str(cell.rank), "FAULT_STAMP": stamp, "FAULT_DELAY": "0.5", "NO_COLOR": "1",
            # a process killed outright cannot remove its work folder: keep it with the stamp
            "TMPDIR": os.path.dirname(os.path.abspath(stamp)),
            "PYTHONPATH": TESTS + os.pathsep + base.get("PYTHONPATH", "")}


def ranks_in(label: str) -> set:
    """``"ranks 0-1,3"`` -> {0, 1, 3} (the first rank label in ``label``)."""
    m = re.search(r"\branks? ([\d,\-]+)", label)
    out: set = set()
    for part in (m.group(1).strip(",").split(",") if m else []):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def verify(cell: Cell, status: str, summary: str) -> None:
    """The cause and its words lead, the status is the cause's, every other rank was left waiting,
    and no rank is said to have finished (none did: they all needed the failed one)."""
    assert status.upper() == STATUS[cell.kind], (cell, status, summary)
    lead = f"rank {cell.rank} " + _WORDS[cell.kind].format(r=cell.rank)
    assert re.match(lead, summary), (cell, summary)
    parts = summary.split("; ")[1:]
    waiting = set().union(*(ranks_in(p) for p in parts if "left waiting" in p)) if parts else set()
    assert waiting == set(range(cell.nproc)) - {cell.rank}, (cell, summary)
    assert "finished" not in summary, (cell, summary)


def run_cli(cmd: list, env: dict, timeout: float) -> tuple[int, list]:
    """Run ``cmd``; its exit code and its stdout lines, each with the wall-clock time it arrived."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        reader.join(5)
        if proc.stdout is not None:
            proc.stdout.close()
    return proc.returncode, lines


def verdict_line(lines: list, check: str = "fault-matrix") -> Optional[tuple]:
    """(time, status, summary) of the check's line in a run's output."""
    for t, line in lines:
        m = re.match(rf"\[(\w+)\]\s+{re.escape(check)}\s+(.*?)(?:  \(\d[\d.]* ?m?s\))?$", line)
        if m:
            return t, m.group(1), m.group(2)
    return None


def torchrun_cmd(cell: Cell, timeout: float = 30) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(cell.nproc),
            "-m", "ddpdoctor", "check", "--timeout", str(timeout), "--only", "fault-matrix,fault-none"]


def read_stamp(path: str) -> float:
    with open(path) as f:
        return float(f.read())
