"""The rank side of a run: one forked worker process per rank runs the checks it is told to.

A worker connects to the control store, says hello, then for each check waits for the
coordinator's directive and publishes its outcome. Its stdout/stderr go to a per-rank log; fatal
signals print the crashing stack to the log. Its Python stacks are read on request by a thread of its
own, under the GIL (:mod:`ddpdoctor.system.threadstacks`: faulthandler's dump from a signal handler can
crash a process whose other threads run Python, and the user's model factory or torch may start such
threads); faulthandler on SIGUSR1 stays the fallback for a worker whose GIL is held.
A worker never returns: it ends with ``os._exit``, and dies with its supervisor (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, NoReturn, Sequence

from ddpdoctor.check import Check, RankContext
from ddpdoctor.result import Outcome, Status
from ddpdoctor.runner.channel import COUNTS, Channel, ChannelLost, connect_store, dump_counts, unpack_hosts
from ddpdoctor.runner.options import reset_signals_in_worker
from ddpdoctor.system import threadstacks
from ddpdoctor.system.stackframes import shown_path

__all__ = ["WorkerSpec", "worker_main", "make_stack_request", "answer_stack_requests", "run_guarded", "raised_at", "set_parent_death_signal", "EXIT_HINT",
           "usable_cores", "pin_crowded"]

STACK_SIGNAL = signal.SIGUSR1
_PR_SET_PDEATHSIG = 1


@dataclass
class WorkerSpec:
    """Everything a worker is told before it starts (the spec; the running process is a Worker)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    backend: str
    timeout: float
    store_addr: str
    store_port: int
    prefix: str
    checks: Sequence[Check]
    stack_path: str
    log_path: str
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    mode: str = "local"
    options: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    close_fds: Sequence[int] = ()
    open_files: Any = None  # set in the worker: files that must stay open for its lifetime

    @property
    def stack_request(self) -> str:
        """The named pipe a stack request's token is written to (next to ``stack_path``, in the run's
        own temporary directory, removed with it)."""
        return f"{self.stack_path}.req"

    @property
    def stack_answers(self) -> str:
        """The file the worker's stack thread appends its answers to (``stack_path``: faulthandler's)."""
        return f"{self.stack_path}.ans"


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def run_guarded(check: Check, ctx: RankContext) -> Outcome:
    """Run one check on this rank; an exception (or ``sys.exit``) becomes a CRASH outcome with its
    traceback and, in ``data``, the exception's type, message and where it was raised (file:line)."""
    start = time.perf_counter()
    try:
        outcome = check.run(ctx)
    except SystemExit as exc:  # sys.exit in the check or in code it called: the rank would have ended
        outcome = _exit_outcome(ctx, exc, check.name)
    except Exception as exc:  # noqa: BLE001 - a crashing check is a result, not a traceback
        lines = traceback.format_exc().rstrip().splitlines()
        first = str(exc).splitlines()[0] if str(exc).strip() else ""
        where = raised_at(exc)
        outcome = Outcome(
            ctx.rank, Status.CRASH, f"check raised {type(exc).__name__}: {first}".rstrip(": ")
            + (f" ({where})" if where else ""),
            hint="rerun with -v for the traceback; if the check itself is wrong, report it to ddpdoctor",
            finding="check-crashed", details=tuple(lines[-25:]),
            data={"exception": type(exc).__name__, "message": first, "where": where},
        )
    duration = time.perf_counter() - start
    return Outcome(ctx.rank, outcome.status, outcome.summary, outcome.hint, outcome.finding,
                   outcome.details, outcome.data, duration)


def _exit_outcome(ctx: RankContext, exc: SystemExit, check: str) -> Outcome:
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    where = raised_at(exc)
    return Outcome(
        ctx.rank, Status.CRASH, f"called sys.exit({exc.code!r})" + (f" ({where})" if where else "")
        + f" during '{check}'",
        hint=EXIT_HINT, finding="rank-exited", details=tuple(traceback.format_exc().rstrip().splitlines()[-25:]),
        data={"exit_code": code, "where": where},
    )


EXIT_HINT = ("a rank that ends in the middle of a check (os._exit or sys.exit in user or library code, even "
             "with code 0) leaves the others waiting: find the call in the rank's log (-v) and raise an "
             "exception instead")


def raised_at(exc: BaseException) -> str:
    """Where ``exc`` was raised: ``dir/file.py:88`` of the innermost frame and, when that is library
    code, the innermost frame of the code that called it (``cuda/__init__.py:567, called from
    process_group (ddpdoctor/check.py:157)``); "" without a traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    inner = frames[-1]
    text = f"{shown_path(inner.filename)}:{inner.lineno}"
    if any(p in inner.filename for p in _LIBRARY):
        caller = next((f for f in reversed(frames) if not any(p in f.filename for p in _LIBRARY)), None)
        if caller is not None:
            text += f", called from {caller.name} ({shown_path(caller.filename)}:{caller.lineno})"
    return text


_LIBRARY = ("/torch/", "/site-packages/", "/dist-packages/", "/lib/python3")


def _prepare(spec: WorkerSpec) -> Any:
    set_parent_death_signal()
    for fd in spec.close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    log = open(spec.log_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    faulthandler.enable(file=log, all_threads=True)
    stack_file = answer_stack_requests(spec)
    os.environ.update(spec.env)
    # Ranks share the node's cores, and an OpenMP pool inherited through fork can deadlock the
    # first parallel op: one intra-op thread per rank (the checks' tensors are small).
    import torch

    torch.set_num_threads(1)
    from ddpdoctor.system import nvml

    nvml.forget()  # NVML state is per process: never use the supervisor's handle after fork
    return log, stack_file


def make_stack_request(spec: WorkerSpec) -> None:
    """Make the named pipe the worker's stack requests go through (``spec.stack_request``): by the
    supervisor, before the fork, so that a request never finds a plain file in its place. Where it
    cannot be made (a file system without them), the worker's thread looks at a plain file instead."""
    try:
        os.mkfifo(spec.stack_request, 0o600)
    except OSError:
        pass


def answer_stack_requests(spec: WorkerSpec) -> Any:
    """Make this process answer stack requests (see :func:`ddpdoctor.runner.supervisor.read_stacks`): a
    daemon thread, ``ddpdoctor-stacks``, that reads every thread's stack under the GIL when asked, and
    faulthandler on SIGUSR1 as the fallback for a process whose GIL is held (then no other thread runs
    Python, and the signal's dump is safe). The file faulthandler writes to, which must stay open."""
    stack_file = open(spec.stack_path, "a")
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True, chain=False)
    threadstacks.start_answering(spec.stack_request, spec.stack_answers, threading.main_thread().ident,
                                 block=STACK_SIGNAL)
    return stack_file


def worker_main(spec: WorkerSpec) -> NoReturn:
    """Entry point of a forked worker; never returns."""
    # First thing: the parent's handlers (raise Interrupted, print a report) are not a worker's.
    # Ctrl-C is the supervisor's to handle; SIGTERM ends the worker.
    reset_signals_in_worker()
    code = 0
    try:
        spec.open_files = _prepare(spec)  # the log and stack files must stay open
        COUNTS.clear()  # this rank's own messages, not the supervisor's before the fork
        store = connect_store(spec.store_addr, spec.store_port, spec.timeout)
        channel = Channel(store, spec.prefix)
        ctx = RankContext(
            rank=spec.rank, world_size=spec.world_size, local_rank=spec.local_rank,
            local_world_size=spec.local_world_size, node_rank=spec.node_rank, backend=spec.backend,
            timeout=spec.timeout, store=store, options=spec.options, master_addr=spec.master_addr,
            master_port=spec.master_port, mode=spec.mode,
        )
        cores = _cores()  # before any pinning: the hello and the env check report the node as it is
        channel.put(f"hello/{spec.rank}", _hello(spec))
        channel.enrol("hello", spec.rank, counted=True)
        pinned = False
        for i, check in enumerate(spec.checks):
            directive = channel.wait(f"plan/{i}", timeout=float("inf"))
            if directive["action"] == "stop":
                break
            if directive["action"] != "run":
                continue
            if check.requires.process_group and not pinned:
                pinned = True
                pin_crowded(spec.local_rank, spec.local_world_size, spec.backend, cores)
            _learn(ctx, directive)
            outcome = run_guarded(check, ctx)
            channel.put(f"result/{i}/{spec.rank}", outcome.to_dict())
            channel.enrol(f"result/{i}", spec.rank)
        channel.wait(f"plan/{len(spec.checks)}", timeout=float("inf"))
    except ChannelLost as exc:
        print(f"rank {spec.rank}: {exc}", file=sys.stderr)
        code = 1
    except BaseException:  # noqa: BLE001 - the log is the only witness
        traceback.print_exc()
        code = 3
    finally:
        try:
            dump_counts(f"rank{spec.rank}")
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _learn(ctx: RankContext, directive: dict) -> None:
    """What a run directive tells the rank (lockstep.py): the check's deadline and the world's facts."""
    ctx.deadline = float(directive.get("deadline", ctx.timeout))
    world = directive.get("world") or {}
    if "hosts" in world:
        ctx.hosts = unpack_hosts(world["hosts"])
    if world.get("ranks_per_core") is not None:
        ctx.ranks_per_core = float(world["ranks_per_core"])


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask), at least 1."""
    return max(1, len(_cores()) or os.cpu_count() or 1)


CROWDED_PER_CORE = 2  # CPU ranks per core beyond which each rank is pinned to one core


def pin_crowded(local_rank: int, local_world_size: int, backend: str, cores: Sequence[int]) -> bool:
    """On a node with more than CROWDED_PER_CORE CPU (gloo) ranks per core, pin this rank to one of
    the cores it may use (round robin by local rank); True if it did.

    Gloo's collectives pass a message from rank to rank: where ranks outnumber the cores, each step
    waits for the next rank to get a core, and the scheduler moving ranks between cores makes that
    wait longer. Measured on 2 cores: all_reduce of 6 KiB 28-33 ms unpinned, 15-16 ms pinned at 8
    ranks, 271 against 170 ms at 32; at 2 ranks (one per core) pinning made it slower (1 against
    3.5 ms), so an uncrowded node is left alone. Done before the first check that uses the
    process group, after the hello and the env check, which report the node as the user set it up.
    """
    if backend == "nccl" or not cores or local_world_size <= CROWDED_PER_CORE * len(cores):
        return False
    try:
        os.sched_setaffinity(0, {cores[local_rank % len(cores)]})
    except (AttributeError, OSError):
        return False
    return True


def _hello(spec: WorkerSpec) -> dict[str, Any]:
    from ddpdoctor.system import nvml

    return {
        "rank": spec.rank,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "local_rank": spec.local_rank,
        "local_world_size": spec.local_world_size,
        "cpus": usable_cores(),
        "gpus": nvml.load().device_count(),
    }
