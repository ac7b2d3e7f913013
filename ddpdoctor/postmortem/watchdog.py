"""The watchdog that ends a ``ddpdoctor run`` job when ``ddpdoctor run`` itself dies, even by SIGKILL.

Why a watchdog process and not the alternatives:

* ``PR_SET_PDEATHSIG`` on the launcher reaches the launcher only; its ranks (``mp.spawn`` children,
  torchrun's workers in their own sessions) stay, and a job that ignores SIGTERM ignores it anyway.
* ``PR_SET_CHILD_SUBREAPER`` on ``ddpdoctor run`` keeps orphans below it, but when ``run`` is the
  process that dies the orphans go to init, and nobody is left to stop them.
* A process group is left by anything that calls ``setsid`` (torchrun starts each worker in a new
  session).

So ``run`` starts this small script first, in its own session (a Ctrl-C or a ``kill -9 -PGID`` aimed at
``run``'s group does not reach it), holding the read end of a pipe whose only write end is in
``run``. Every process of the job carries ``DDPDOCTOR_RUN_ID=<id>`` in its environment (inherited;
``run`` sets it on the launcher). When the pipe reaches end-of-file without ``run`` having written
``done`` (``run`` died: SIGKILL, a crash), the watchdog SIGKILLs the launcher's process group and
every process of this user whose environment carries the id, until none is left, then exits. SIGKILL
because the job may ignore SIGTERM, and nobody is left to wait for a graceful end.

Run as ``python -I -S watchdog.py RUN_ID``; standard library only (it starts in milliseconds).
"""

from __future__ import annotations

import os
import signal
import sys
import time

__all__ = ["tagged_pids", "sweep", "main"]


def tagged_pids(run_id: str) -> list:
    """PIDs of this user's processes whose environment holds ``DDPDOCTOR_RUN_ID=run_id``."""
    needle = f"DDPDOCTOR_RUN_ID={run_id}".encode()
    me, uid, out = os.getpid(), os.getuid(), []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid and uid != 0:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(name))
    return out


def sweep(run_id: str, pgid: int = 0, deadline_s: float = 5.0) -> int:
    """SIGKILL the job's process group and every tagged process until none is left; how many were hit."""
    hit = 0
    end = time.monotonic() + deadline_s
    while True:
        if pgid > 1:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        pids = tagged_pids(run_id)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                hit += 1
            except OSError:
                pass
        if not pids or time.monotonic() > end:
            return hit
        time.sleep(0.05)


def main(argv: list) -> int:
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(s, signal.SIG_IGN)
    run_id, pgid, done = argv[1], 0, False
    stdin = sys.stdin.buffer
    for line in iter(stdin.readline, b""):
        word = line.split()
        if word[:1] == [b"pgid"] and len(word) == 2 and word[1].isdigit():
            pgid = int(word[1])
        elif word[:1] == [b"done"]:
            done = True
    if not done:
        sweep(run_id, pgid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
