"""Standard output and error that may be closed, or encode strictly: what a command writes to.

A command started with ``>&-`` or ``2>&-`` has no file descriptor 1 or 2, and Python sets
``sys.stdout``/``sys.stderr`` to ``None``: the first ``print`` raises. Worse, the next file the
command opens takes the free number, so a later write "to stdout" lands in that file (a log, a pipe
to a child). The report, the JSON and the job matter more than a stream nobody reads, so a closed
stream becomes ``/dev/null``, opened onto its own descriptor number (the hole is plugged), and a
stream that encodes strictly (``PYTHONIOENCODING=utf-8:strict``) escapes what it cannot encode
(``errors="backslashreplace"``) instead of raising.
"""

from __future__ import annotations

import io
import os
import sys
from typing import TextIO

__all__ = ["safe_stdout", "safe_stderr"]


def safe_stdout() -> TextIO:
    """``sys.stdout``, made safe to write (see the module's docstring); also installed as ``sys.stdout``."""
    sys.stdout = _safe(sys.stdout, 1)
    return sys.stdout


def safe_stderr() -> TextIO:
    """``sys.stderr``, made safe to write (see the module's docstring); also installed as ``sys.stderr``."""
    sys.stderr = _safe(sys.stderr, 2)
    return sys.stderr


def _safe(stream: object, fd: int) -> TextIO:
    if stream is not None and _open_fd(fd):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", "") == "strict":
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a stream that cannot change (already written to): left as it is
                pass
        return stream  # type: ignore[return-value]
    null = os.open(os.devnull, os.O_WRONLY)
    if stream is None and _open_fd(fd):
        fd = null  # the number went to a file opened since: never write into it
    elif null != fd:
        os.dup2(null, fd)  # plug the hole: nothing opened later takes this number
        os.close(null)
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                            line_buffering=True)


def _open_fd(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
