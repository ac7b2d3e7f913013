"""The kept run directories of ``ddpdoctor run``: ``run --list`` names them, ``run --prune AGE`` removes
the older ones (``--dry-run``: says what it would remove).

Only a directory directly under the runs root (:func:`~ddpdoctor.postmortem.rundir.default_runs_root`)
that carries ddpdoctor's run marker (``.ddpdoctor-run``, a regular file that reads as one) counts as a
run; anything else there is left alone and counted. No link is followed: an entry that is a link, a
marker that is a link, a link inside a run directory are never read through nor removed through.
Pruning removes what the marker lists (the rule of :mod:`~ddpdoctor.postmortem.rundir`: ddpdoctor
removes only what it made), then the directory when nothing else is left in it; a run still going (its
marker incomplete and its ``ddpdoctor run`` process alive) is never touched.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from dataclasses import dataclass
from typing import IO, Optional

from ddpdoctor.errors import UsageError
from ddpdoctor.exitcodes import ExitCode
from ddpdoctor.postmortem.rundir import MARKER, default_runs_root, remove_recorded
from ddpdoctor.system.redact import safe_text

__all__ = ["KeptRun", "parse_age", "find_runs", "runs_command"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """``7d`` -> seconds (``s``, ``m``, ``h``, ``d``, ``w``; a number alone is days).

    Raises:
        UsageError: not a positive duration, naming the value and the accepted forms.
    """
    m = re.fullmatch(r"\s*(\d{1,9}(?:\.\d{1,6})?)\s*([smhdw]?)\s*", str(text))
    seconds = float(m.group(1)) * _UNITS[m.group(2) or "d"] if m else 0.0
    if seconds <= 0:
        raise UsageError("bad-age", f"--prune {safe_text(str(text))!r} is not an age",
                         "use a number and a unit: 7d, 12h, 30m, 2w (s, m, h, d, w; a number alone is days)")
    return seconds


@dataclass(frozen=True)
class KeptRun:
    """One run directory under the root: its name, when its marker was last written, its size, whether
    its run is still going, and its verdict's headline when it has one."""

    name: str
    path: str
    written: float
    size: int
    running: bool
    headline: str


def _size(path: str) -> int:
    """Bytes of the regular files under ``path``, links not followed."""
    total = 0
    for root, dirs, files in os.walk(path):  # os.walk follows no link to a folder by default
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _read_json(path: str) -> Optional[dict]:
    """A JSON object from a regular file (never through a link); None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, encoding="utf-8") as f:
            fd = -1
            record = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    return record if isinstance(record, dict) else None


def find_runs(root: str) -> tuple:
    """(the run directories under ``root``, oldest first; how many other entries are there).

    A run directory is a real directory (not a link) directly under ``root`` whose marker is a regular
    file that reads as ddpdoctor's (a JSON object listing its files)."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return [], 0
    except OSError as exc:
        raise UsageError("runs-root", f"cannot read {safe_text(root)}: {exc.strerror or exc}",
                         "set XDG_STATE_HOME to the state folder ddpdoctor run used") from None
    runs, others = [], 0
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            others += 1
            continue
        record = _read_json(os.path.join(entry.path, MARKER))
        if record is None or not isinstance(record.get("files"), list) \
                or not all(isinstance(n, str) for n in record["files"]):
            others += 1
            continue
        written = record.get("written")
        if not isinstance(written, (int, float)):
            written = os.lstat(os.path.join(entry.path, MARKER)).st_mtime
        verdict = _read_json(os.path.join(entry.path, "verdict.json")) or {}
        headline = verdict.get("headline") if isinstance(verdict.get("headline"), str) else ""
        running = record.get("complete") is not True and _alive(record.get("pid"))
        runs.append(KeptRun(entry.name, entry.path, float(written), _size(entry.path), running, headline))
    runs.sort(key=lambda r: (r.written, r.name))
    return runs, others


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _remove(run: KeptRun) -> bool:
    """Remove a run directory by its marker (read again now: never through a link); True when it is gone."""
    record = _read_json(os.path.join(run.path, MARKER))
    return record is not None and remove_recorded(run.path, record)


def runs_command(list_them: bool, prune: Optional[str], dry_run: bool, out: IO[str] = sys.stdout) -> int:
    """``ddpdoctor run --list`` / ``--prune AGE [--dry-run]``: the exit code (0; 2 for a bad age)."""
    age = parse_age(prune) if prune is not None else None  # a bad value: exit 2 before anything is read
    root = default_runs_root()
    runs, others = find_runs(root)
    now = time.time()
    lines = []
    note = f"; {others} other entr{'ies' if others != 1 else 'y'} (no run marker) left alone" if others else ""
    if list_them or age is None:
        total = sum(r.size for r in runs)
        lines.append(f"ddpdoctor run: {len(runs)} run director{'ies' if len(runs) != 1 else 'y'} under {root}"
                     + (f" ({_bytes(total)})" if runs else "") + note)
        for r in runs:
            state = "running" if r.running else (r.headline or "no verdict (exit 0, kept)")
            lines.append(f"  {r.name}  {_ago(now - r.written):>8}  {_bytes(r.size):>9}  {state}")
    if age is not None:
        old = [r for r in runs if now - r.written >= age and not r.running]
        busy = [r for r in runs if now - r.written >= age and r.running]
        verb = "would remove" if dry_run else "removed"
        done, kept = [], []
        for r in old:
            (done if dry_run or _remove(r) else kept).append(r)
        freed = sum(r.size for r in done)
        head = (f"ddpdoctor run: {verb} {len(done)} run director{'ies' if len(done) != 1 else 'y'} older than "
                f"{prune.strip()} under {root}" + (f" ({_bytes(freed)})" if done else ""))
        extra = []
        if len(runs) - len(old) - len(busy):
            extra.append(f"{len(runs) - len(old) - len(busy)} newer kept")
        if busy:
            extra.append(f"{len(busy)} still running, untouched")
        if kept:
            extra.append(f"{len(kept)} kept: they hold files that are not ddpdoctor's")
        lines.append(head + ("; " + "; ".join(extra) if extra else "") + note)
        lines += [f"  {verb}: {r.name}  ({_ago(now - r.written)}, {_bytes(r.size)})" for r in done]
        lines += [f"  kept: {r.name} (holds files that are not ddpdoctor's)" for r in kept]
    out.write("".join(safe_text(line) + "\n" for line in lines))
    out.flush()
    return int(ExitCode.OK)
