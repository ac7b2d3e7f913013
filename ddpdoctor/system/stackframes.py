"""Reading Python stack dumps (faulthandler format): where a process's main thread is blocked, and who called."""

from __future__ import annotations

import os
import re

__all__ = ["where_hung", "shown_path", "shown_where"]

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


_OURS = ("/threading.py", "/ddpdoctor/runner/worker.py", "/ddpdoctor/runner/channel.py",
         "/ddpdoctor/runner/supervisor.py", "/ddpdoctor/runner/local.py", "/ddpdoctor/runner/joined.py",
         "/ddpdoctor/cli.py", "/ddpdoctor/__main__.py",
         "/.inject/sitecustomize.py", "/ddpdoctor/postmortem/inject/sitecustomize.py")  # run's timing wrappers


_LIBRARY = ("/torch/", "/site-packages/", "/dist-packages/", "/lib/python3")


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


def where_hung(stack: str) -> str:
    """Where a faulthandler dump's main thread is: ``all_reduce, called from run (pkg/train.py:88)``.

    The innermost frame names the call that blocks (often torch's); the innermost frame outside
    torch and the standard library names the code that made it.
    """
    blocks = re.split(r"\n(?=Thread 0x|Current thread 0x)", stack.strip())
    main = next((b for b in blocks if b.startswith("Current thread")), blocks[0] if blocks else "")
    frames = [m for m in _FRAME.finditer(main) if not m.group("file").endswith(_OURS)]  # innermost first
    if not frames:
        return "an unknown place (no Python stack)"
    inner = frames[0]
    caller = next((m for m in frames if not any(p in m.group("file") for p in _LIBRARY)), None)
    if caller is None or caller is inner:
        m = caller or inner
        return f"{m.group('func')} ({shown_path(m.group('file'))}:{m.group('line')})"
    return f"{inner.group('func')}, called from {caller.group('func')} ({shown_path(caller.group('file'))}:{caller.group('line')})"
