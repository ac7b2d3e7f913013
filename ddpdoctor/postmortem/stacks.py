"""Read every rank's Python stack from a running job without stopping it, and group ranks by place.

Ranks are found from a torchrun agent's PID (its children with ``RANK`` in their environment), from
explicit PIDs, or by scanning this user's processes for launcher variables. A stack is read with
``py-spy dump`` when py-spy is installed and allowed to attach (ptrace), else through the handler
``ddpdoctor run`` injects (faulthandler on SIGUSR2, written to a per-pid file). A process that has
neither is never signalled: an unhandled SIGUSR2 would kill it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import psutil

from ddpdoctor.result import format_ranks
from ddpdoctor.system.stackframes import where_hung

__all__ = ["RankProcess", "StackReading", "find_ranks", "read_stack", "read_stacks", "group_by_place",
           "render_groups", "pyspy_to_faulthandler", "stacks_command"]

_LAUNCHER_VARS = ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "DDPDOCTOR_RUN_DIR")
_PYSPY_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>[^()]+):(?P<line>\d+)\)\s*$")


@dataclass
class RankProcess:
    """One rank's process on this node."""

    pid: int
    rank: Optional[int]
    local_rank: Optional[int] = None
    run_dir: Optional[str] = None
    signal_name: str = "SIGUSR2"
    main_thread: Optional[int] = None

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"

    def handler_file(self) -> Optional[str]:
        """The injected handler's stack file, when this process registered one."""
        if not self.run_dir:
            return None
        info = os.path.join(self.run_dir, f"proc-{self.pid}.json")
        if not os.path.exists(info):
            return None
        try:
            with open(info) as f:
                data = json.load(f)
            self.signal_name = data.get("signal", self.signal_name)
            self.main_thread = data.get("main_thread")
            return data["stack_file"]
        except (OSError, ValueError, KeyError):
            return None


@dataclass
class StackReading:
    """A rank's stack and how it was read (``py-spy``, ``handler``, or ``none`` with the reason)."""

    proc: RankProcess
    method: str
    stack: str = ""
    error: str = ""
    place: str = field(default="")
    note: str = ""


def _int(value: Optional[str]) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _as_rank(p: psutil.Process) -> Optional[RankProcess]:
    try:
        env = p.environ()
    except (psutil.Error, OSError):
        return None
    if "RANK" not in env and not env.get("DDPDOCTOR_RUN_DIR"):
        return None
    return RankProcess(p.pid, _int(env.get("RANK")), _int(env.get("LOCAL_RANK")), env.get("DDPDOCTOR_RUN_DIR"))


def _ranks_below(p: psutil.Process) -> list:
    """The ranks among ``p``'s descendants: the topmost processes that carry ``RANK``."""
    out = []
    try:
        children = p.children()
    except psutil.Error:
        return out
    for c in children:
        r = _as_rank(c)
        if r is not None and r.rank is not None:
            out.append(r)
        else:
            out.extend(_ranks_below(c))
    return out


def find_ranks(pids: Sequence[int] = ()) -> list:
    """The rank processes of a job on this node, ordered by rank.

    Args:
        pids: a torchrun agent's PID (its ranks are found below it), or the ranks' own PIDs; empty:
            every process of this user that carries launcher variables (RANK with TORCHELASTIC_RUN_ID
            or LOCAL_RANK, or started by ``ddpdoctor run``).

    Raises:
        UsageError: a PID that does not exist.
    """
    from ddpdoctor.errors import UsageError

    found: list = []
    if pids:
        for pid in pids:
            try:
                p = psutil.Process(pid)
            except psutil.Error:
                raise UsageError("no-such-pid", f"no process with PID {pid}",
                                 "pass a running torchrun agent's PID or the ranks' PIDs") from None
            below = _ranks_below(p)
            me = _as_rank(p)
            found.extend(below if below else ([me] if me else [RankProcess(pid, None)]))
    else:
        me = os.getpid()
        for p in psutil.process_iter(["pid", "uids"]):
            if p.pid == me:
                continue
            try:
                env = p.environ()
            except (psutil.Error, OSError):
                continue
            if "RANK" in env and any(v in env for v in _LAUNCHER_VARS):
                r = _as_rank(p)
                parent = p.parent()
                if r is not None and not (parent and _as_rank(parent) and _as_rank(parent).rank == r.rank):
                    found.append(r)
    unique = {r.pid: r for r in found}
    return sorted(unique.values(), key=lambda r: (r.rank is None, r.rank if r.rank is not None else r.pid))


def pyspy_to_faulthandler(text: str) -> str:
    """py-spy's ``dump`` output rewritten as a faulthandler dump (main thread first), for where_hung."""
    out: list = []
    blocks: list = []
    current: Optional[list] = None
    for line in text.splitlines():
        if line.startswith("Thread "):
            current = [line]
            blocks.append(current)
        elif current is not None:
            m = _PYSPY_FRAME.match(line)
            if m:
                current.append(f'  File "{m.group("file")}", line {m.group("line")} in {m.group("func")}')
    blocks.sort(key=lambda b: 0 if '"MainThread"' in b[0] else 1)
    for i, b in enumerate(blocks):
        out.append(("Current thread" if i == 0 else "Thread") + " 0x0 (most recent call first):")
        out.extend(b[1:])
        out.append("")
    return "\n".join(out)


_THREAD_HEAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)(.*)$", re.M)


def main_thread_first(dump: str, ident: Optional[int]) -> str:
    """A faulthandler dump with the main thread's block marked "Current thread" (the signal may have
    been handled on any thread, and where_hung reads the current one)."""
    if ident is None or not dump.strip():
        return dump
    blocks = re.split(r"\n(?=Thread 0x|Current thread 0x)", dump.strip())
    main = [b for b in blocks if (m := _THREAD_HEAD.match(b)) and int(m.group(2), 16) == ident]
    if not main:
        return dump
    rest = [_THREAD_HEAD.sub(r"Thread \2\3", b, count=1) for b in blocks if b is not main[0]]
    first = _THREAD_HEAD.sub(r"Current thread \2\3", main[0], count=1)
    return "\n\n".join([first] + rest) + "\n"


def pyspy_path() -> Optional[str]:
    """py-spy's executable, unless disabled with DDPDOCTOR_STACKS_METHOD=handler."""
    if os.environ.get("DDPDOCTOR_STACKS_METHOD", "auto") == "handler":
        return None
    return shutil.which("py-spy")


def _read_pyspy(exe: str, pid: int, wait: float) -> tuple:
    try:
        p = subprocess.run([exe, "dump", "--pid", str(pid), "--full-filenames"], capture_output=True,
                           text=True, timeout=max(wait, 5.0))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"py-spy: {exc}"
    if p.returncode != 0 or "Thread " not in p.stdout:
        return "", "py-spy: " + (p.stderr.strip().splitlines() or ["failed"])[-1]
    return pyspy_to_faulthandler(p.stdout), ""


def _wait_stable(path: str, start: int, deadline: float) -> None:
    last = -1
    while time.monotonic() < deadline:
        size = os.path.getsize(path) if os.path.exists(path) else 0
        if size > start and size == last:
            return
        last = size
        time.sleep(0.05)


def _read_handler(proc: RankProcess, path: str, wait: float) -> tuple:
    start = os.path.getsize(path) if os.path.exists(path) else 0
    try:
        os.kill(proc.pid, getattr(signal, proc.signal_name, signal.SIGUSR2))
    except OSError as exc:
        return "", f"cannot signal PID {proc.pid}: {exc.strerror}"
    _wait_stable(path, start, time.monotonic() + wait)
    with open(path, encoding="utf-8", errors="replace") as f:
        f.seek(start)
        text = f.read()
    if not text.strip():
        return "", f"no stack written within {wait:g}s"
    return main_thread_first(text, proc.main_thread), ""


def read_stack(proc: RankProcess, wait: float = 3.0) -> StackReading:
    """One rank's stack: py-spy when usable, else the injected handler; never an unhandled signal."""
    errors = []
    exe = pyspy_path()
    if exe:
        text, err = _read_pyspy(exe, proc.pid, wait)
        if text:
            return StackReading(proc, "py-spy", text, place=where_hung(text))
        errors.append(err)
    path = proc.handler_file()
    if path:
        text, err = _read_handler(proc, path, wait)
        if text:
            return StackReading(proc, "handler", text, place=where_hung(text), note="; ".join(errors))
        errors.append(err)
    else:
        errors.append("not started under 'ddpdoctor run' (no in-process handler)")
    if not exe:
        errors.append("py-spy is not installed (pip install py-spy)")
    return StackReading(proc, "none", error="; ".join(e for e in errors if e), place="unknown (stack not read)")


def read_stacks(procs: Sequence[RankProcess], wait: float = 3.0) -> list:
    return [read_stack(p, wait) for p in procs]


def group_by_place(readings: Sequence[StackReading]) -> list:
    """``[(place, [readings])]``, largest group first."""
    groups: dict = {}
    for r in readings:
        groups.setdefault(r.place, []).append(r)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(_key(r) for r in kv[1])))


def _key(r: StackReading) -> int:
    return r.proc.rank if r.proc.rank is not None else r.proc.pid


def _in_collective(readings: Sequence[StackReading]) -> bool:
    return any("/torch/distributed/" in r.stack for r in readings)


def odd_ones_out(groups: Sequence) -> list:
    """The places whose ranks are the odd ones out: not in a collective while the others wait in one,
    or else the one strictly smallest group."""
    if len(groups) < 2:
        return []
    waiting = [place for place, rs in groups if _in_collective(rs)]
    elsewhere = [place for place, rs in groups if not _in_collective(rs) and not rs[0].method == "none"]
    if waiting and elsewhere:
        return elsewhere
    sizes = sorted(len(rs) for _, rs in groups)
    if sizes[0] < sizes[1]:
        return [place for place, rs in groups if len(rs) == sizes[0]]
    return []


def _who(rs: Sequence[StackReading]) -> str:
    ranks = [r.proc.rank for r in rs if r.proc.rank is not None]
    pids = [r.proc.pid for r in rs if r.proc.rank is None]
    parts = []
    if ranks:
        parts.append(f"rank{'s' if len(ranks) != 1 else ''} {format_ranks(ranks)}")
    if pids:
        parts.append("pid " + ",".join(map(str, pids)))
    return " ".join(parts)


def render_groups(readings: Sequence[StackReading]) -> list:
    """``ranks 0,2-3: all_reduce, called from step (proj/train.py:88)`` lines, odd one out marked."""
    groups = group_by_place(readings)
    odd = odd_ones_out(groups)
    whos = [_who(rs) for _, rs in groups]
    width = max((len(w) for w in whos), default=0) + 1
    lines = []
    for (place, rs), who in zip(groups, whos):
        mark = "   <- the odd one out" if place in odd else ""
        lines.append(f"{(who + ':').ljust(width)} {place}{mark}")
    methods = sorted({r.method for r in readings if r.method != "none"})
    names = {"py-spy": "py-spy dump", "handler": "the in-process handler (faulthandler)"}
    if methods:
        lines.append("stacks read with " + " and ".join(names[m] for m in methods))
    notes = sorted({r.note.splitlines()[0] for r in readings if r.note})
    if notes:
        lines.append("py-spy could not be used here (" + notes[0][:120] + "); fell back to the handler")
    for r in readings:
        if r.method == "none":
            lines.append(f"{r.proc.label} (pid {r.proc.pid}): no stack: {r.error}")
    return lines


def stacks_command(pids: Sequence[int], wait: float) -> int:
    """``ddpdoctor stacks``: print grouped stacks; exit 1 when no rank's stack could be read."""
    import click

    from ddpdoctor.errors import UsageError
    from ddpdoctor.system.redact import safe_text

    procs = find_ranks(pids)
    if not procs:
        raise UsageError("no-ranks", "no rank processes found on this node" + (f" under PID {pids[0]}" if pids else ""),
                         "pass the torchrun agent's PID or the ranks' PIDs")
    readings = read_stacks(procs, wait)
    click.echo(f"ddpdoctor stacks: {len(procs)} rank process{'es' if len(procs) != 1 else ''}")
    for line in render_groups(readings):
        click.echo(safe_text(line))  # process names and frames come from outside: escaped, redacted
    for r in readings:
        if r.stack:
            click.echo("\n" + safe_text(f"--- {r.proc.label} (pid {r.proc.pid}), read with {r.method}"))
            for line in r.stack.rstrip().splitlines():
                click.echo(safe_text(line))
    return 0 if any(r.stack for r in readings) else 1
