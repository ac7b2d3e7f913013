"""The job's launcher as ``ddpdoctor run`` holds it: started by the watchdog (its parent and the job's
child subreaper, see :mod:`ddpdoctor.postmortem.watchdog`), so that ``run``'s death, even by SIGKILL,
takes every process of the job with it.

:class:`Launched` answers like :class:`subprocess.Popen` where ``run`` needs it (``pid``, ``poll``,
``wait``, ``returncode``, ``stdout``, ``stderr``): the launcher is not ``run``'s child, so its exit
code comes from the watchdog, which reaps it.
"""

from __future__ import annotations

import errno
import json
import os
import select
import subprocess
import sys
import time
from typing import Optional

__all__ = ["Launched", "launch"]


class Launched:
    """The launcher started by the watchdog, and the watchdog itself (``watchdog``: its Popen)."""

    def __init__(self, watchdog: subprocess.Popen, pid: int, stdout, stderr) -> None:
        self.watchdog = watchdog
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: Optional[int] = None
        self.lost = False  # the watchdog ended before it reported the exit: the code is unknown (1)
        self._buf = b""
        self.error: Optional[tuple] = None  # (errno, message) when the command could not be started

    def _read(self, timeout: float) -> None:
        fd = self.watchdog.stdout.fileno()  # type: ignore[union-attr]
        try:
            ready = select.select([fd], [], [], max(0.0, timeout))[0]
        except InterruptedError:  # a signal to run (forwarded to the job): look again on the next call
            return
        if not ready:
            return
        chunk = os.read(fd, 4096)
        if not chunk:
            if self.returncode is None:
                self.lost, self.returncode = True, 1
            return
        self._feed(chunk)

    def _feed(self, chunk: bytes) -> None:
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            word = line.split(maxsplit=2)
            if word[:1] == [b"exit"] and len(word) == 2:
                self.returncode = int(word[1])
            elif word[:1] == [b"started"] and len(word) == 2:
                self.pid = int(word[1])
            elif word[:1] == [b"error"] and len(word) >= 2:
                self.error = (int(word[1]) if word[1].isdigit() else 0,
                              word[2].decode(errors="replace") if len(word) > 2 else "")

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self._read(0)
        return self.returncode

    def ended(self, timeout: float) -> bool:
        """True once the launcher has exited, returning as soon as the watchdog says so."""
        end = time.monotonic() + timeout
        while self.returncode is None:
            self._read(end - time.monotonic())
            if time.monotonic() >= end:
                break
        return self.returncode is not None

    def wait(self, timeout: Optional[float] = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 3600.0 if end is None else end - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            self._read(left)
        return self.returncode

    def tell(self, line: str) -> None:
        try:
            self.watchdog.stdin.write(line.encode() + b"\n")  # type: ignore[union-attr]
            self.watchdog.stdin.flush()  # type: ignore[union-attr]
        except (OSError, ValueError):
            pass

    def done(self) -> None:
        """Normal end: the job is already stopped and reaped; let the watchdog go."""
        self.tell("done")
        try:
            self.watchdog.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.watchdog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.watchdog.kill()
            self.watchdog.wait()
        self.watchdog.stdout.close()  # type: ignore[union-attr]


def _stdin_copy() -> str:
    """A copy of run's stdin for the job (``-``: none, the job reads /dev/null)."""
    try:
        fd = os.dup(0)
    except OSError:
        return "-"
    return str(fd)


def launch(command: list, env: dict, run_id: str) -> Launched:
    """Start the watchdog, and through it ``command`` in a session of its own, its output on pipes.

    Raises:
        OSError: the command cannot be started (``errno`` and ``strerror`` say why).
    """
    script = os.path.join(os.path.dirname(__file__), "watchdog.py")
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    stdin = _stdin_copy()
    job = [int(stdin)] if stdin != "-" else []
    try:
        watchdog = subprocess.Popen([sys.executable, "-I", "-S", script, run_id, stdin, str(out_w), str(err_w)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    pass_fds=job + [out_w, err_w], start_new_session=True)
    except OSError:
        for fd in (out_r, err_r):
            os.close(fd)
        raise
    finally:
        for fd in job + [out_w, err_w]:
            os.close(fd)
    launched = Launched(watchdog, 0, os.fdopen(out_r, "rb", buffering=0), os.fdopen(err_r, "rb", buffering=0))
    launched.tell(json.dumps({"argv": list(command), "env": env}))
    deadline = time.monotonic() + 60  # the watchdog starts in milliseconds; a loaded machine gets a minute
    while not launched.pid and launched.error is None and not launched.lost and time.monotonic() < deadline:
        launched._read(deadline - time.monotonic())
    if launched.pid:
        return launched
    launched.done()
    launched.stdout.close()
    launched.stderr.close()
    code, message = launched.error or (errno.ECHILD, "the watchdog that starts the job did not answer")
    raise OSError(code, message or os.strerror(code))
