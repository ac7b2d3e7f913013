"""Read every rank's Python stack from a running job without stopping it, and group ranks by place.

Ranks are found from a launcher's PID (below a torchrun agent: the processes with ``RANK`` in their
environment; below an ``mp.spawn`` parent: its ``multiprocessing`` children, numbered by start order,
never the resource tracker; below ``ddpdoctor run``: the processes its hook registered, by rank), from
explicit PIDs, or by scanning this user's processes for launcher variables (never another user's
process, even as root, unless its PID was given). On a node running several jobs, the ranks are grouped
by job (``ddpdoctor run``'s run id; torchrun's run id with the process group's store address; the
launcher) and each job is judged alone: rank numbers repeat across jobs, and one job's healthy ranks
are never the odd ones out of another's hang. A stack is read with
``py-spy dump`` when py-spy is installed and allowed to attach (ptrace), else through the handler
``ddpdoctor run`` injects (faulthandler on SIGUSR2, written to a per-pid file). A process that has
neither is never signalled: an unhandled SIGUSR2 would kill it; nor is one whose handler is not
installed at that moment (``SigCgt`` in ``/proc/<pid>/status``: still starting, or exiting).

DDP communicates where no ``torch.distributed`` frame shows: its forward broadcasts buffers
(``_sync_buffers``), its backward all-reduces gradients inside autograd's engine (the reducer). Both
count as collectives when naming the odd one out: the rank that is not in the collective the others
are in.
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
from ddpdoctor.system import threadstacks
from ddpdoctor.system.stackframes import main_thread_first, where_hung

__all__ = ["RankProcess", "StackReading", "find_ranks", "read_stack", "read_stacks", "group_by_place",
           "render_groups", "by_job", "pyspy_to_faulthandler", "stacks_command"]

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
    index: Optional[int] = None  # the process index under mp.spawn / multiprocessing (start order)
    job: tuple = ()  # which job it belongs to (see _job_of): ranks of two jobs are never judged together
    job_label: str = ""
    stack_answers: Optional[str] = None  # where its hook's thread answers stackreq-<pid> (from its record)

    @property
    def label(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank}"
        return f"process {self.index}" if self.index is not None else f"pid {self.pid}"

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
            answers = data.get("stack_answers")
            self.stack_answers = answers if isinstance(answers, str) and os.path.isabs(answers) else None
            if self.rank is None and isinstance(data.get("rank"), int):
                self.rank = data["rank"]
            if self.index is None and isinstance(data.get("index"), int):
                self.index = data["index"]
            path = data["stack_file"]
            return path if isinstance(path, str) and os.path.isabs(path) else None
        except (OSError, ValueError, KeyError):
            return None


@dataclass
class StackReading:
    """A rank's stack and how it was read (``py-spy``; ``handler``: by the injected hook's thread, under the
    GIL; ``signal``: faulthandler on the stack signal, when that thread did not answer; or ``none`` with
    the reason)."""

    proc: RankProcess
    method: str
    stack: str = ""
    error: str = ""
    place: str = field(default="")
    note: str = ""  # why py-spy could not be used
    fallback: str = ""  # why the stack signal was sent (method ``signal``): its hook's thread did not answer


def _int(value: Optional[str]) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


_MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "multiprocessing.semaphore_tracker")


def _registered(pid: int, run_dir: Optional[str]) -> Optional[dict]:
    """The record ``ddpdoctor run``'s hook wrote for ``pid``, if any."""
    if not run_dir:
        return None
    try:
        with open(os.path.join(run_dir, f"proc-{pid}.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _classify(p: psutil.Process) -> tuple:
    """``("rank", RankProcess)``, ``("mp", RankProcess)`` (a multiprocessing child: rank unknown yet),
    ``("skip", None)`` (multiprocessing's resource tracker or forkserver: never a rank), or
    ``("other", None)`` (look below it)."""
    try:
        cmdline = p.cmdline()
    except (psutil.Error, OSError):
        return "skip", None
    joined = " ".join(cmdline)
    if any(h in joined for h in _MP_HELPERS):
        return "skip", None
    try:
        env = p.environ()
    except (psutil.Error, OSError):
        env = {}
    run_dir = env.get("DDPDOCTOR_RUN_DIR")
    info = _registered(p.pid, run_dir)
    if info is not None and info.get("role") in ("rank", "spawn"):
        rank = info.get("rank") if isinstance(info.get("rank"), int) else None
        index = info.get("index") if isinstance(info.get("index"), int) else None
        return "rank", _in_job(RankProcess(p.pid, rank, _int(env.get("LOCAL_RANK")), run_dir, index=index), p, env)
    if "RANK" in env:
        parent = _parent_rank(p)
        if parent is not None and parent == env.get("RANK"):
            return "skip", None  # a rank's own child (DataLoader worker) inherits RANK
        return "rank", _in_job(RankProcess(p.pid, _int(env.get("RANK")), _int(env.get("LOCAL_RANK")), run_dir), p, env)
    if "--multiprocessing-fork" in cmdline:
        return "mp", _in_job(RankProcess(p.pid, None, None, run_dir), p, env)
    return "other", None


def _in_job(r: RankProcess, p: psutil.Process, env: dict) -> RankProcess:
    """``r`` with the job it belongs to: ``ddpdoctor run``'s run id, else torchrun's run id with the
    process group's store (``MASTER_ADDR:MASTER_PORT``: two jobs on one node never share it), else the
    launcher (the parent: an ``mp.spawn`` parent, a torchrun agent, srun's step daemon)."""
    try:
        ppid = p.ppid()
    except (psutil.Error, OSError):
        ppid = 0
    store = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" if env.get("MASTER_ADDR") and env.get("MASTER_PORT") else ""
    torchrun = env.get("TORCHELASTIC_RUN_ID", "")
    if env.get("DDPDOCTOR_RUN_ID"):
        r.job = ("run", env["DDPDOCTOR_RUN_ID"])
    elif torchrun or store:
        r.job = ("store", torchrun, store)
    else:
        r.job = ("launcher", ppid)
    parts = [f"launcher pid {ppid}"] if ppid else []
    if store:
        parts.append(f"store {store}")
    if torchrun and torchrun != "none":
        parts.append(f"torchrun run id {torchrun}")
    if r.run_dir:
        parts.append(f"ddpdoctor run {r.run_dir}")
    r.job_label = ", ".join(parts)
    return r


def _parent_rank(p: psutil.Process) -> Optional[str]:
    try:
        parent = p.parent()
        return parent.environ().get("RANK") if parent is not None else None
    except (psutil.Error, OSError):
        return None


def _uid(p: psutil.Process) -> Optional[int]:
    """The real user id of ``p`` (None when it cannot be read: treated as another user's)."""
    try:
        return p.uids().real
    except (psutil.Error, OSError):
        return None


def _ranks_below(p: psutil.Process, owner: Optional[int] = None) -> list:
    """The ranks among ``p``'s descendants: the topmost processes that carry ``RANK``, that ``ddpdoctor
    run``'s hook registered as ranks, or that are ``multiprocessing`` children (``mp.spawn``), never
    the resource tracker. Unnamed multiprocessing children are numbered in start order (mp.spawn's
    process index)."""
    out: list = []
    unnamed: list = []
    try:
        children = sorted(p.children(), key=lambda c: (c.create_time(), c.pid))
    except psutil.Error:
        return out
    owner = _uid(p) if owner is None else owner
    for c in children:
        if _uid(c) != owner:
            continue  # another user's process below the launcher (a setuid helper): never signalled
        kind, r = _classify(c)
        if kind == "rank":
            out.append(r)
        elif kind == "mp":
            unnamed.append(r)
        elif kind == "other":
            out.extend(_ranks_below(c, owner))
    for i, r in enumerate(unnamed):
        r.index = i
    return out + unnamed


def find_ranks(pids: Sequence[int] = ()) -> list:
    """The rank processes of a job on this node, ordered by rank.

    Args:
        pids: a launcher's PID (torchrun's agent, an ``mp.spawn`` parent: its ranks, those of the
            launcher's user, are found below it), or the ranks' own PIDs (of any user); empty: every
            process of this user (by real user id, root included: never another user's) that carries
            launcher variables (RANK with TORCHELASTIC_RUN_ID or LOCAL_RANK) or that ``ddpdoctor run``
            registered. Each rank knows its job (``job``, ``job_label``).

    Raises:
        UsageError: a PID that does not exist.
    """
    from ddpdoctor.errors import UsageError

    found: list = []
    if pids:
        for pid in pids:
            try:
                p = psutil.Process(pid)
                p.status()
            except (psutil.Error, ValueError, OverflowError):
                raise UsageError("no-such-pid", f"no process with PID {pid}",
                                 "pass a running launcher's PID (torchrun, an mp.spawn parent) or the ranks' PIDs"
                                 ) from None
            kind, me = _classify(p)
            if kind == "skip":
                continue
            if kind in ("rank", "mp"):
                found.append(me)
                continue
            below = _ranks_below(p)
            found.extend(below if below else [RankProcess(pid, None)])
    else:
        me, uid = os.getpid(), os.getuid()
        for p in psutil.process_iter(["pid", "uids"]):
            uids = p.info.get("uids")
            if p.pid == me or uids is None or uids.real != uid:
                continue  # another user's process is never signalled unless its PID was given (even as root)
            try:
                env = p.environ()
            except (psutil.Error, OSError):
                continue
            if not (("RANK" in env and any(v in env for v in _LAUNCHER_VARS)) or env.get("DDPDOCTOR_RUN_DIR")):
                continue
            kind, r = _classify(p)
            if kind == "rank" and (r.rank is not None or r.run_dir):
                found.append(r)
    unique = {r.pid: r for r in found}
    return sorted(unique.values(), key=lambda r: (r.rank is None, r.rank if r.rank is not None else
                                                  (r.index if r.index is not None else r.pid), r.pid))


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


def handler_installed(pid: int, signum: int) -> bool:
    """Whether ``pid`` catches ``signum`` right now (``SigCgt`` in ``/proc/<pid>/status``): a process that
    does not (not started yet, exiting, a zombie) would be killed by the signal, so it is never sent."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
    except OSError:
        return False
    if "\nState:\tZ" in status or "\nState:\tX" in status:
        return False
    m = re.search(r"^SigCgt:\s*([0-9a-fA-F]+)", status, re.M)
    return bool(m) and bool(int(m.group(1), 16) >> (signum - 1) & 1)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _signal_dump(proc: RankProcess, path: str, wait: float) -> tuple:
    """faulthandler's dump of ``proc`` on its stack signal: (text, error). Only where its hook's thread did
    not answer: faulthandler walks the other threads' frames while they run, which can crash a process
    whose threads run Python (CPython issue 116008); one whose thread cannot answer has its GIL held."""
    start = _size(path)
    signum = getattr(signal, proc.signal_name, signal.SIGUSR2)
    if not handler_installed(proc.pid, signum):
        return "", f"PID {proc.pid} has no {proc.signal_name} handler now (exiting or ended): not signalled"
    try:
        os.kill(proc.pid, signum)
    except OSError as exc:
        return "", f"cannot signal PID {proc.pid}: {exc.strerror}"
    _wait_stable(path, start, time.monotonic() + wait)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            f.seek(start)
            text = f.read()
    except OSError as exc:
        return "", f"cannot read {path}: {exc.strerror}"
    if not text.strip():
        return "", f"no stack written within {wait:g}s"
    return text, ""


def _read_handlers(procs: Sequence[tuple], wait: float) -> dict:
    """``{pid: StackReading}`` through the hooks ``ddpdoctor run`` injects, all ranks at once: each hook's
    thread is asked (``stackreq-<pid>``) and reads its process's stacks under the GIL; a process whose
    thread does not answer within 60% of ``wait`` (at least a second) gets the stack signal, and
    faulthandler's dump, for the rest of it (at least a second): its GIL is held, by a C call stuck
    without releasing it (the error says so), or its hook predates the thread."""
    requests = {p.pid: (os.path.join(os.path.dirname(path), f"stackreq-{p.pid}"), p.stack_answers)
                for p, path in procs if p.stack_answers}
    patience = min(wait, max(1.0, 0.6 * wait))
    answers, failed = threadstacks.collect(requests, patience, alive=_alive)
    readings = {}
    for p, path in procs:
        text = answers.get(p.pid)
        if text and text.strip():
            text = main_thread_first(text, p.main_thread)
            readings[p.pid] = StackReading(p, "handler", text, place=describe_place(text))
            continue
        why = failed.get(p.pid) or (f"its hook's thread did not answer within {patience:g}s (the GIL held?)"
                                    if p.pid in requests else "its hook has no stack thread")
        text, err = _signal_dump(p, path, max(1.0, wait - patience))
        if text:
            text = main_thread_first(text, p.main_thread)
            readings[p.pid] = StackReading(p, "signal", text, place=describe_place(text), fallback=why)
        else:
            readings[p.pid] = StackReading(p, "none", error=f"{why}; {err}")
    return readings


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def read_stack(proc: RankProcess, wait: float = 3.0) -> StackReading:
    """One rank's stack: py-spy when usable, else the injected handler; never an unhandled signal."""
    return read_stacks([proc], wait)[0]


def read_stacks(procs: Sequence[RankProcess], wait: float = 3.0) -> list:
    """Each rank's stack, in ``procs``' order: py-spy when usable (one at a time), else through the
    injected hooks (all at once, ``wait`` seconds at most: see :func:`_read_handlers`)."""
    exe = pyspy_path()
    got: dict = {}
    tried: dict = {}
    for p in procs:
        if exe:
            text, err = _read_pyspy(exe, p.pid, wait)
            if text:
                got[p.pid] = StackReading(p, "py-spy", text, place=describe_place(text))
                continue
            tried[p.pid] = err
    rest = [p for p in procs if p.pid not in got]
    hooked = [(p, path) for p in rest if (path := p.handler_file())]  # its record read once
    got.update(_read_handlers(hooked, wait) if hooked else {})
    out = []
    for p in procs:
        r = got.get(p.pid)
        errors = [tried.get(p.pid, "")]
        if r is not None and r.stack:
            r.note = tried.get(p.pid, "")
            out.append(r)
            continue
        if r is not None:
            errors.append(r.error)
        else:
            errors.append("not started under 'ddpdoctor run' (no in-process handler)")
        if not exe:
            errors.append("py-spy is not installed (pip install py-spy)")
        out.append(StackReading(p, "none", error="; ".join(e for e in errors if e), place="unknown (stack not read)"))
    return out


def group_by_place(readings: Sequence[StackReading]) -> list:
    """``[(place, [readings])]``, largest group first."""
    groups: dict = {}
    for r in readings:
        groups.setdefault(r.place, []).append(r)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(_key(r) for r in kv[1])))


def _key(r: StackReading) -> int:
    if r.proc.rank is not None:
        return r.proc.rank
    return r.proc.index if r.proc.index is not None else r.proc.pid


_MAIN_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_DDP = "/torch/nn/parallel/distributed.py"
_DDP_BUFFERS = ("_sync_buffers", "_sync_module_buffers", "_default_broadcast_coalesced",
                "_distributed_broadcast_coalesced", "_sync_params_and_buffers", "_check_global_requires_backward_grad_sync")
_BACKWARD = ("/torch/autograd/graph.py", "/torch/autograd/__init__.py", "/torch/_tensor.py")


def _main_frames(stack: str) -> list:
    """``(file, func)`` of the main thread's frames, innermost first."""
    blocks = re.split(r"\n(?=Thread 0x|Current thread 0x)", stack.strip())
    main = next((b for b in blocks if b.startswith("Current thread")), blocks[0] if blocks else "")
    return [(m.group("file").replace("\\", "/"), m.group("func")) for m in _MAIN_FRAME.finditer(main)]


def collective_of(stack: str) -> Optional[str]:
    """The communication a stack's main thread is in, or None: a ``torch.distributed`` call by name
    (``all_reduce``, ``barrier``), DDP's forward (buffer broadcast, ``_sync_buffers``) or constructor,
    or DDP's backward (the reducer's gradient all-reduce, which runs inside autograd's engine)."""
    frames = _main_frames(stack)
    for file, func in frames:  # innermost first: the call that blocks
        if "/torch/distributed/" in file and not file.endswith("/c10d_logger.py"):
            return func
        if file.endswith(_DDP):
            if func in _DDP_BUFFERS or any(f in _DDP_BUFFERS for fi, f in frames if fi.endswith(_DDP)):
                return "DDP forward (buffer broadcast)"
            if func == "__init__":
                return "DDP constructor"
            return "DDP forward"
        if file.endswith(_BACKWARD) and func in ("_engine_run_backward", "backward", "run_backward"):
            return "DDP backward (reducer all_reduce)"
    return None


def describe_place(stack: str) -> str:
    """:func:`where_hung`, with DDP's hidden communication named (``DDP backward (reducer all_reduce),
    called from train (proj/train.py:30)``) instead of autograd's or DDP's inner function."""
    place = where_hung(stack)
    kind = collective_of(stack)
    if kind and kind.startswith("DDP") and ", called from " in place:
        return kind + place[place.index(", called from "):]
    return place


def _collective(readings: Sequence[StackReading]) -> Optional[str]:
    """The collective family the group's ranks are in: DDP's forward, backward and constructor are one
    family (ranks a step apart in one DDP loop pair their collectives with each other's), a
    ``torch.distributed`` call is its own."""
    kinds = [collective_of(r.stack) for r in readings if r.stack]
    kind = next((k for k in kinds if k), None)
    return "DDP" if kind and kind.startswith("DDP") else kind


def odd_ones_out(groups: Sequence) -> list:
    """The places whose ranks are the odd ones out: not in a collective while the others wait in one,
    or not in the collective most ranks are in, or else the one strictly smallest group."""
    if len(groups) < 2:
        return []
    kinds = {place: _collective(rs) for place, rs in groups}
    waiting = [place for place, rs in groups if kinds[place]]
    elsewhere = [place for place, rs in groups if not kinds[place] and not rs[0].method == "none"]
    if waiting and elsewhere:
        return elsewhere
    if waiting and not elsewhere:
        count: dict = {}
        for place, rs in groups:
            if kinds[place]:
                count[kinds[place]] = count.get(kinds[place], 0) + len(rs)
        ranked = sorted(count.values(), reverse=True)
        if len(ranked) > 1 and ranked[0] > ranked[1]:
            top = max(count, key=count.get)
            return [place for place, _ in groups if kinds[place] and kinds[place] != top]
        if len(ranked) > 1:
            return []
    sizes = sorted(len(rs) for _, rs in groups)
    if sizes[0] < sizes[1]:
        return [place for place, rs in groups if len(rs) == sizes[0]]
    return []


def _who(rs: Sequence[StackReading]) -> str:
    ranks = [r.proc.rank for r in rs if r.proc.rank is not None]
    indexes = [r.proc.index for r in rs if r.proc.rank is None and r.proc.index is not None]
    pids = [r.proc.pid for r in rs if r.proc.rank is None and r.proc.index is None]
    parts = []
    if ranks:
        parts.append(f"rank{'s' if len(ranks) != 1 else ''} {format_ranks(ranks)}")
    if indexes:
        parts.append(f"process{'es' if len(indexes) != 1 else ''} {format_ranks(indexes)}")
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
    names = {"py-spy": "py-spy dump", "handler": "the in-process handler", "signal": "faulthandler (stack signal)"}
    if methods:
        lines.append("stacks read with " + " and ".join(names[m] for m in methods))
    notes = sorted({r.note.splitlines()[0] for r in readings if r.note})
    if notes:
        lines.append("py-spy could not be used here (" + notes[0][:120] + "); fell back to the handler")
    for r in readings:
        if r.method == "signal":
            who = r.proc.label if r.proc.label.startswith("pid ") else f"{r.proc.label} (pid {r.proc.pid})"
            lines.append(f"{who}: read with faulthandler: {r.fallback}")
        if r.method == "none":
            who = r.proc.label if r.proc.label.startswith("pid ") else f"{r.proc.label} (pid {r.proc.pid})"
            lines.append(f"{who}: no stack: {r.error}")
    return lines


def by_job(readings: Sequence[StackReading]) -> list:
    """``[[readings of one job], ...]``, in the order each job's first rank comes."""
    jobs: dict = {}
    for r in readings:
        jobs.setdefault(r.proc.job or ("pid", r.proc.pid), []).append(r)
    return list(jobs.values())


def _recorded(procs: Sequence[RankProcess], wait: float, read) -> tuple:
    """Each rank's last recorded collectives (Flight Recorder), asked of the ranks of jobs under ``ddpdoctor
    run`` while ``read()`` reads the stacks: ``(read()'s result, {pid: lines})``. A rank of another job
    gets no entry (its recorder is not reachable)."""
    from ddpdoctor.postmortem.recorder import RankRef, last_collectives, read_recorder, request_dumps, wait_dumps

    dirs: dict = {}
    for p in procs:
        if p.run_dir and os.path.isdir(p.run_dir) and p.handler_file():
            dirs.setdefault(p.run_dir, []).append(p)
    start = time.monotonic()
    requests = {d: request_dumps(d, wait) for d in dirs}
    result = read()
    lines: dict = {}
    for d, ranks in dirs.items():
        if requests[d] is None:
            for p in ranks:
                lines[p.pid] = ["Flight Recorder: not reachable (cannot write the request into the run directory)"]
            continue
        wait_dumps(d, requests[d], [p.pid for p in ranks], start + wait)
        reading = read_recorder(d, [RankRef(p.rank, p.pid, True) for p in ranks], requests[d])
        for p in ranks:
            dump = reading.dumps.dumps.get(p.rank) if reading.dumps and p.rank is not None else None
            if dump is not None and dump.entries:
                lines[p.pid] = ["Flight Recorder, last collectives:"] + ["  " + x for x in last_collectives(dump)]
            else:
                why = reading.no_dump.get(p.rank if p.rank is not None else f"pid {p.pid}") or reading.unavailable
                lines[p.pid] = [f"Flight Recorder: {why or 'nothing recorded'}"]
    return result, lines


def stacks_command(pids: Sequence[int], wait: float) -> int:
    """``ddpdoctor stacks``: print grouped stacks, each job judged alone; exit 1 when no rank's stack
    could be read."""
    import click

    from ddpdoctor.errors import UsageError
    from ddpdoctor.system.redact import safe_text

    procs = find_ranks(pids)
    if not procs:
        raise UsageError("no-ranks", "no rank processes found on this node" + (f" under PID {pids[0]}" if pids else ""),
                         "pass the torchrun agent's PID or the ranks' PIDs")
    readings, recorded = _recorded(procs, wait, lambda: read_stacks(procs, wait))
    jobs = by_job(readings)
    many = len(jobs) > 1
    n = len(procs)
    click.echo(f"ddpdoctor stacks: {n} rank process{'es' if n != 1 else ''}"
               + (f" in {len(jobs)} jobs (each judged alone)" if many else ""))
    for i, job in enumerate(jobs, start=1):
        if many:
            head = job[0].proc.job_label
            click.echo(safe_text(f"job {i} of {len(jobs)}: {len(job)} rank process{'es' if len(job) != 1 else ''}"
                                 + (f" ({head})" if head else "")))
        for line in render_groups(job):
            click.echo(safe_text(("  " if many else "") + line))  # names and frames come from outside: escaped, redacted
        if not any(r.proc.pid in recorded for r in job):
            click.echo(("  " if many else "") + "Flight Recorder: not reachable (the job was not started under "
                       "'ddpdoctor run', which asks each rank for its last collectives)")
    for i, job in enumerate(jobs, start=1):
        for r in job:
            if r.stack:
                click.echo("\n" + safe_text(f"--- {f'job {i}, ' if many else ''}{r.proc.label} (pid {r.proc.pid}), "
                                             f"read with {r.method}"))
                for line in recorded.get(r.proc.pid, []):
                    click.echo(safe_text(line))
                for line in r.stack.rstrip().splitlines():
                    click.echo(safe_text(line))
    return 0 if any(r.stack for r in readings) else 1
