"""Supervision of this host's workers: start them, watch them, dump their stacks, stop them.

Worker states (a small state machine)::

    RUNNING --exit 0-->       SUCCEEDED   (reported as ``dead/<rank>`` too: a worker that ends by
                                           itself before the run is over ended in the middle of it)
    RUNNING --exit n / signal--> FAILED   (reported as ``dead/<rank>`` on the control channel)
    RUNNING --stop() or halt/<rank>--> STOPPED  (SIGTERM, a grace period, then SIGKILL; not reported)

Workers are forked from this process (torch is already imported, CUDA never initialized here), so
they start in milliseconds. Each one dies with its supervisor (PR_SET_PDEATHSIG), and :meth:`stop`
reaps every child, so no process outlives the command.
"""

from __future__ import annotations

import enum
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from ddpdoctor.runner.channel import Channel
from ddpdoctor.runner.worker import STACK_SIGNAL, WorkerSpec, make_stack_request, worker_main
from ddpdoctor.system import threadstacks
from ddpdoctor.system.signals import describe_exit
from ddpdoctor.system.stackframes import main_thread_first

__all__ = ["Supervisor", "Worker", "WorkerState", "StackDump", "read_stacks", "tail", "HALT_GRACE"]

HALT_GRACE = 0.5  # seconds a halted worker gets between SIGTERM and SIGKILL
REQUEST_EVERY = 0.05  # seconds between looks at the channel's stack-request and halt counters


class WorkerState(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass
class Worker:
    """A started worker process (the instance of a :class:`WorkerSpec`)."""

    spec: WorkerSpec
    pid: int
    state: WorkerState = WorkerState.RUNNING
    wait_status: Optional[int] = None
    main_thread: Optional[int] = None  # its main thread's ident: the thread that forked it keeps its own

    @property
    def rank(self) -> int:
        return self.spec.rank


class Supervisor:
    """Starts and watches this host's workers.

    Args:
        channel: the control channel, attached after the workers start (see :meth:`attach`).
    """

    def __init__(self) -> None:
        self.workers: list[Worker] = []
        self.channel: Optional[Channel] = None
        self.halting: dict[int, float] = {}  # rank -> when SIGTERM was sent (SIGKILL after HALT_GRACE)
        self._stackreqs = 0  # stack requests seen on the channel (a counter: one read per look)
        self._halts = 0  # halts seen on the channel (a counter: one read per look)
        self._looked = 0.0  # when the counters were last read (at most every REQUEST_EVERY seconds)

    def start(self, specs: Sequence[WorkerSpec]) -> None:
        """Fork one worker per spec. Call before this process starts any thread or store server.

        The objects alive at the fork (torch's modules: a few hundred MB) are frozen for the garbage
        collector first (``gc.freeze``), so a worker's collections do not walk them, writing to each
        object's header and so copying every page of the heap (copy-on-write): a third fewer page
        faults per rank. This process unfreezes them once the workers are forked.

        Each worker's stack request is a named pipe made here, before the fork (see :func:`read_stacks`).
        """
        import gc

        for spec in specs:
            make_stack_request(spec)
        gc.freeze()
        try:
            for spec in specs:
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the child never returns
                    worker_main(spec)
                self.workers.append(Worker(spec, pid, main_thread=threading.get_ident()))
        finally:
            gc.unfreeze()

    def attach(self, channel: Channel) -> None:
        self.channel = channel

    def worker(self, rank: int) -> Optional[Worker]:
        return next((w for w in self.workers if w.rank == rank), None)

    def poll(self, now: bool = False) -> None:
        """Reap exited workers (publishing ``dead/<rank>``), answer stack requests, obey halts.

        The request counters are read at most every REQUEST_EVERY seconds (two store messages), unless
        ``now``: the coordinator polls every few milliseconds, and on a crowded machine this process
        competes with the ranks for the cores."""
        for w in self._reap():
            if w.rank in self.halting:
                w.state = WorkerState.STOPPED
            elif self.channel is not None:
                info = describe_exit(w.wait_status or 0, w.pid)
                info["log"] = tail(w.spec.log_path)
                self.channel.put(f"dead/{w.rank}", info)
                self.channel.enrol("dead", w.rank, counted=True)
        if self.channel is None or not (now or time.monotonic() - self._looked >= REQUEST_EVERY):
            self._escalate()
            return
        self._looked = time.monotonic()
        if self.channel.count("stackreq") > self._stackreqs:
            self._stackreqs = self.channel.count("stackreq")
            wanted = [w for w in self.workers if self.channel.has(f"stackreq/{w.rank}")]
            if wanted:
                for w in wanted:
                    self.channel.take(f"stackreq/{w.rank}")
                for rank, dump in self.dump_stacks([w.rank for w in wanted]).items():
                    self.channel.put(f"stack/{rank}", dump.to_dict())
        if self.channel.count("halt") > self._halts:
            self._halts = self.channel.count("halt")
            for w in self.running():
                if w.rank not in self.halting and self.channel.has(f"halt/{w.rank}"):
                    self.halt(w.rank)
        self._escalate()

    def halt(self, rank: int) -> None:
        """Stop one worker without waiting (SIGTERM now, SIGKILL from a later :meth:`poll`): the
        coordinator gave up on it (it was left waiting for a rank that failed)."""
        w = self.worker(rank)
        if w is not None and w.state is WorkerState.RUNNING and rank not in self.halting:
            self.halting[rank] = time.monotonic()
            _signal(w.pid, signal.SIGTERM)

    def _escalate(self) -> None:
        now = time.monotonic()
        for w in self.running():
            if w.rank in self.halting and now - self.halting[w.rank] > HALT_GRACE:
                _signal(w.pid, signal.SIGKILL)

    def dump_stacks(self, ranks: Sequence[int], wait: float = 1.0) -> dict[int, StackDump]:
        """Each worker's Python stacks, all asked at once (see :func:`read_stacks`); a worker that is not
        running gets an empty dump that says so."""
        out = {}
        targets = {}
        for rank in ranks:
            w = self.worker(rank)
            if w is None or w.state is not WorkerState.RUNNING:
                out[rank] = StackDump(why="the worker is not running")
            else:
                targets[rank] = w
        out.update(read_stacks(targets, wait))
        return out

    def running(self) -> list[Worker]:
        return [w for w in self.workers if w.state is WorkerState.RUNNING]

    def wait_all(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every worker to exit by itself; True if they did."""
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.005)
        return not self.running()

    def _reap(self) -> list[Worker]:
        """Collect the workers that exited since the last look (their state and wait status set)."""
        exited: list[Worker] = []
        try:  # one peek (nothing reaped) instead of a waitpid per worker while none has exited
            if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return exited
        except ChildProcessError:  # no child at all
            pass
        except (AttributeError, OSError):  # no waitid here: look at each worker
            pass
        for w in self.running():
            try:
                pid, status = os.waitpid(w.pid, os.WNOHANG)
            except ChildProcessError:  # already reaped elsewhere
                pid, status = w.pid, 0
            if pid:
                w.wait_status = status
                w.state = WorkerState.SUCCEEDED if status == 0 else WorkerState.FAILED
                exited.append(w)
        return exited

    def stop(self, grace: float = 1.0) -> None:
        """SIGTERM every running worker, wait ``grace`` seconds, SIGKILL the rest, reap all."""
        for w in self.running():
            _signal(w.pid, signal.SIGTERM)
        if not self.wait_all(grace):
            for w in self.running():
                _signal(w.pid, signal.SIGKILL)
            for w in self.running():
                try:
                    os.waitpid(w.pid, 0)
                except ChildProcessError:
                    pass
                w.state = WorkerState.STOPPED


@dataclass(frozen=True)
class StackDump:
    """One worker's stacks and how they were read: ``thread`` (its stack thread, under the GIL),
    ``signal`` (faulthandler on SIGUSR1, because the thread did not answer: ``why``) or ``none``."""

    text: str = ""
    method: str = "none"
    why: str = ""

    def how(self) -> str:
        """The line a report shows with the stack."""
        if self.method == "thread":
            return "stack read by the worker's stack thread (under the GIL)"
        if self.method == "signal":
            return f"stack read with faulthandler (SIGUSR1): {self.why}"
        return f"no stack: {self.why}" if self.why else "no stack"

    def to_dict(self) -> dict:
        return {"stack": self.text, "read": self.method, "why": self.why}

    @classmethod
    def from_dict(cls, d: Mapping) -> "StackDump":
        return cls(str(d.get("stack", "")), str(d.get("read", "none")), str(d.get("why", "")))


def read_stacks(targets: Mapping[int, Worker], wait: float = 1.0) -> dict[int, StackDump]:
    """``{rank: StackDump}`` for ``{rank: Worker}``, all at once, within about ``wait`` seconds.

    Each worker's stack thread is asked first (a token through its request pipe, made before the fork;
    :mod:`ddpdoctor.system.threadstacks`) and reads every thread's stack under the GIL. A worker whose thread has not answered within 60% of
    ``wait`` gets SIGUSR1, and faulthandler's dump, for the rest: its GIL is held by C code that never
    lets it go, so no other thread runs Python and the signal's dump is safe (its main thread is put
    first and marked current: the signal may be handled on another thread). Never the signal first:
    faulthandler walks the other threads' frames while they run, which can crash the worker (CPython
    issue 116008) and turn "hung at X" into "died of SIGSEGV"."""
    started = time.monotonic()
    patience = 0.6 * wait
    texts, failed = threadstacks.collect({r: (w.spec.stack_request, w.spec.stack_answers) for r, w in targets.items()},
                                         patience, poll=0.01)
    out = {r: StackDump(text, "thread") for r, text in texts.items()}
    late = {r: failed.get(r, f"its stack thread did not answer within {patience:.2g}s (the GIL held?)")
            for r in targets if r not in out}
    out.update(_signal_dumps({r: targets[r] for r in late}, late, started + max(wait, patience + 0.2)))
    return out


def _signal_dumps(targets: Mapping[int, Worker], why: Mapping[int, str], deadline: float) -> dict[int, StackDump]:
    """faulthandler's dumps (SIGUSR1) of the workers whose stack thread did not answer."""
    sizes = {}
    out = {}
    for rank, w in targets.items():
        sizes[rank] = _size(w.spec.stack_path)
        try:
            os.kill(w.pid, STACK_SIGNAL)
        except ProcessLookupError:
            out[rank] = StackDump(why=f"{why[rank]}; the worker has ended")
    pending = set(sizes) - set(out)
    while pending and time.monotonic() < deadline:
        time.sleep(0.02)
        for rank in list(pending):
            path = targets[rank].spec.stack_path
            if _size(path) > sizes[rank]:
                _wait_stable(path, deadline)  # faulthandler writes frame by frame
                with open(path, errors="replace") as f:
                    f.seek(sizes[rank])
                    text = main_thread_first(f.read(), targets[rank].main_thread)
                out[rank] = StackDump(text, "signal", why[rank])
                pending.discard(rank)
    for rank in pending:
        out[rank] = StackDump(why=f"{why[rank]}; no stack written after SIGUSR1 either")
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_stable(path: str, deadline: float, quiet: float = 0.05) -> None:
    """Wait until ``path`` stops growing for ``quiet`` seconds (or the deadline passes)."""
    last = _size(path)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = _size(path)
        if now == last:
            return
        last = now


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def tail(path: str, lines: int = 30) -> list[str]:
    """The end of a worker's log: from a fatal-signal dump on (capped), else the last ``lines`` lines."""
    try:
        with open(path, errors="replace") as f:
            text = f.read().splitlines()
    except OSError:
        return []
    fatal = next((i for i in range(len(text) - 1, -1, -1) if text[i].startswith("Fatal Python error")), None)
    if fatal is not None:
        dump = [line for line in text[fatal:] if not line.startswith("Extension modules:")]
        return dump[: lines * 2]
    return text[-lines:]
