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


def timed_output(cmd: list, env: dict) -> tuple[float, str]:
    """(wall seconds, stdout) of ``cmd`` run with ``env``; exits the benchmark with its stderr if it fails."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-1500:]}")
    return wall, p.stdout


def timed_cpu(cmd: list) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the command and every process it waited for).

    On a machine busy with other work, wall time follows the load; the CPU seconds do not.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = timed(cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def fork_world(world: int, rank_main, *args) -> tuple:
    """Fork ``world`` ranks running ``rank_main(rank, world, store_path, write_fd, *args)`` over a FileStore
    in a temporary folder (removed after); returns (what the ranks wrote to the pipe, their exit codes)."""
    import os
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix="ddpdoctor-bench-")
    try:
        r, w = os.pipe()
        pids = []
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    os.close(r)
                    rank_main(rank, world, os.path.join(tmp, "store"), w, *args)
                except BaseException:  # noqa: BLE001 - the rank's traceback, then its exit code
                    import traceback
                    traceback.print_exc()
                    code = 1
                finally:
                    os._exit(code)
            pids.append(pid)
        os.close(w)
        report = b""
        while chunk := os.read(r, 1 << 16):
            report += chunk
        os.close(r)
        return report.decode(), [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing left in /tmp
