"""Reading Python stack dumps (faulthandler format): where a process's main thread is blocked, and who called."""

from __future__ import annotations

import os
import re
from typing import Optional

__all__ = ["where_hung", "main_thread_first", "shown_path", "shown_where", "is_ours", "is_user", "user_place"]

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD_HEAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)(.*)$", re.M)


_OURS = ("/threading.py", "/.inject/sitecustomize.py")  # a thread's bootstrap; run's hook (timing wrappers)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this installation's ddpdoctor/
_INSTALLED = ("/site-packages/ddpdoctor/", "/dist-packages/ddpdoctor/")  # a dump from another installation


_LIBRARY = ("/torch/", "/site-packages/", "/dist-packages/", "/lib/python3")


def is_ours(path: str) -> bool:
    """Whether a frame's file is ddpdoctor's own (its package, or the hook ``run`` injects from a
    ``.inject`` folder): such a frame never stands in for the user's line."""
    p = path.replace("\\", "/")
    return (p.endswith(_OURS) or "/.inject/" in p or p.startswith(_PACKAGE + "/")
            or any(i in p for i in _INSTALLED))


def is_user(path: str) -> bool:
    """Whether a frame's file is the user's: neither a library (torch, site-packages, the standard
    library) nor ddpdoctor's own."""
    return not any(p in path for p in _LIBRARY) and not is_ours(path)


def user_place(frames) -> str:
    """``train (proj/train.py:22)``: the innermost of ``frames`` (``(file, line, func)``, innermost
    first) that is the user's, as :func:`shown_path` shows it; "" when none is."""
    for file, line, func in frames:
        if isinstance(file, str) and is_user(file):
            return f"{func} ({shown_path(file)}:{line})"
    return ""


def shown_path(path: str) -> str:
    """A library file by its last two parts; the user's own file as they gave it, relative to the
    current directory when it lies under it (``work/buggy.py``, ``../other/train.py`` stays absolute)."""
    if any(p in path for p in _LIBRARY):
        return "/".join(path.split("/")[-2:])
    if os.path.isabs(path):
        try:
            cwd = os.getcwd()
        except OSError:
            return path
        rel = os.path.relpath(path, cwd)
        if not rel.startswith(".." + os.sep) and rel != "..":
            return rel
    return path


def shown_where(text: str) -> str:
    """``train (/home/me/proj/train.py:22)`` with each ``(path:line)`` shown as :func:`shown_path` does."""
    return re.sub(r"\(([^()\s]+):(\d+)\)", lambda m: f"({shown_path(m.group(1))}:{m.group(2)})", text)


def main_thread_first(dump: str, ident: Optional[int]) -> str:
    """A faulthandler dump with the main thread's block (``ident``) first and marked "Current thread": the
    signal may have been handled on any thread that does not block it (a busy thread of the program's),
    and :func:`where_hung` reads the current one."""
    if ident is None or not dump.strip():
        return dump
    blocks = re.split(r"\n(?=Thread 0x|Current thread 0x)", dump.strip())
    main = [b for b in blocks if (m := _THREAD_HEAD.match(b)) and int(m.group(2), 16) == ident]
    if not main:
        return dump
    rest = [_THREAD_HEAD.sub(r"Thread \2\3", b, count=1) for b in blocks if b is not main[0]]
    first = _THREAD_HEAD.sub(r"Current thread \2\3", main[0], count=1)
    return "\n\n".join([first] + rest) + "\n"


def where_hung(stack: str) -> str:
    """Where a faulthandler dump's main thread is: ``all_reduce, called from run (pkg/train.py:88)``.

    The innermost frame names the call that blocks (often torch's); the innermost frame outside
    torch and the standard library names the code that made it.
    """
    blocks = re.split(r"\n(?=Thread 0x|Current thread 0x)", stack.strip())
    main = next((b for b in blocks if b.startswith("Current thread")), blocks[0] if blocks else "")
    frames = [m for m in _FRAME.finditer(main) if not is_ours(m.group("file"))]  # innermost first
    if not frames:
        return "an unknown place (no Python stack)"
    inner = frames[0]
    caller = next((m for m in frames if is_user(m.group("file"))), None)
    if caller is None or caller is inner:
        m = caller or inner
        return f"{m.group('func')} ({shown_path(m.group('file'))}:{m.group('line')})"
    return f"{inner.group('func')}, called from {caller.group('func')} ({shown_path(caller.group('file'))}:{caller.group('line')})"
