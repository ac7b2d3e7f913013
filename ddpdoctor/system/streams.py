"""Standard output and standard error that neither a closed descriptor nor a strict encoding can break.

A command started with standard output closed (``ddpdoctor check >&-``) starts with ``sys.stdout`` set
to None; one whose output encodes strictly (``PYTHONIOENCODING=utf-8:strict``, an ASCII terminal) stops
with UnicodeEncodeError at the first undecodable byte quoted from outside (an argument, a variable, a
host name). The report, ``--json`` and the verdict's exit code matter more than a stream nobody reads:
a closed stream behaves as ``/dev/null``, and text the stream cannot encode is written escaped
(``\\udcff``, ``\\u2192``). Installed once at start-up (:mod:`ddpdoctor.__main__`).
"""

from __future__ import annotations

import os
import sys
from typing import Optional, TextIO

__all__ = ["safe_stdout", "safe_stderr"]

ERRORS = "backslashreplace"


def safe_stdout() -> TextIO:
    """``sys.stdout``, writing what it cannot encode escaped; ``os.devnull`` when descriptor 1 is closed."""
    return _safe(1, sys.stdout)


def safe_stderr() -> TextIO:
    """``sys.stderr``, writing what it cannot encode escaped; ``os.devnull`` when descriptor 2 is closed."""
    return _safe(2, sys.stderr)


def _safe(fd: int, stream: Optional[TextIO]) -> TextIO:
    if stream is None:  # closed when the interpreter started
        return _devnull(fd)
    try:
        stream.reconfigure(errors=ERRORS)  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):  # not a TextIOWrapper (a test's capture): as it is
        pass
    return stream


def _devnull(fd: int) -> TextIO:
    """A text stream on ``os.devnull``. When ``fd`` itself is closed, ``os.devnull`` is opened onto it, so
    that the processes ddpdoctor starts (the ranks) inherit a harmless descriptor there too; when
    something else took that number since the interpreter started, it is left alone."""
    try:
        os.fstat(fd)
        taken = True
    except OSError:
        taken = False
    null = os.open(os.devnull, os.O_WRONLY)
    if not taken and null != fd:
        os.dup2(null, fd)
        os.close(null)
        null = fd
    return open(null, "w", encoding="utf-8", errors=ERRORS, closefd=null != fd)
