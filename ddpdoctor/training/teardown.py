"""The end of a training process: gloo's worker threads settle while Python is whole, and an opt-in
way out without the interpreter's teardown.

Why a finished job aborts at exit ("terminate called without an active exception", SIGABRT; torchrun
then reports the job as failed). Seen in a core dump of the README example under torchrun (torch
2.13, gloo): the main thread was in ``Py_FinalizeEx``; a gloo worker thread (``pt_gloo_runloop``)
was destroying the work object of the job's last collective, after the collective had completed
and the main thread had gone on. The work held tensors that Python also knows, so dropping them
calls ``Py_DECREF``, which takes the GIL; a thread that asks for the GIL once the interpreter is
finalizing is ended by CPython with ``pthread_exit``, whose forced unwinding through torch's
``noexcept`` destructor calls ``std::terminate``. It is a race between the worker's last release and
the main thread's exit: a collective that was the last thing the script did (``assert_in_sync``,
DDP's buffer broadcast) is the usual one. ``destroy_process_group()`` does not stop it: DDP keeps
the group, and gloo's ``shutdown()`` leaves its worker threads running.

The library's exit hook (registered on import of ``ddpdoctor``'s helpers, ``ddpdoctor.training`` or
``ddpdoctor.diagnostics``) runs while Python is still whole: it destroys a gloo group the script left
alive, then waits, with the GIL released, until every gloo worker thread is back in its idle wait
(so it has dropped its last work), up to a deadline. How the interpreter exits is not changed.

:func:`exit_now` is the opt-in for the rest of the interpreter's teardown (freeing every object, C++
static destructors): a rank that has finished its work ends at once, exit handlers run and files
flushed. It is never imposed.
"""

from __future__ import annotations

import atexit
import gc
import io
import logging
import os
import sys
import time
from typing import NoReturn, Optional

__all__ = ["exit_now"]

logger = logging.getLogger(__name__)


def destroy_at_exit() -> None:
    """At interpreter exit: destroy a gloo process group still alive, then let gloo's workers settle.

    A no-op for a process that never loaded torch.distributed (it is looked up, never imported); the
    group is destroyed only for gloo (NCCL's teardown may wait on a peer; torch only warns there).
    Never raises: exiting anyway, a clean exit must not turn into a traceback.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - exiting anyway; never turn a clean exit into a traceback
        logger.debug("destroy_process_group at exit failed: %s", exc)
    settle_gloo_workers()


GLOO_WORKER = "pt_gloo_runloop"  # torch's name for ProcessGroupGloo's worker threads
SETTLE_DEADLINE = 5.0  # seconds: a worker still inside a collective at exit is not waited for longer


def settle_gloo_workers(deadline: float = SETTLE_DEADLINE) -> Optional[bool]:
    """Wait, with the GIL released, until every gloo worker thread of this process is idle.

    A worker is idle when it waits for work on its condition variable with no timeout (what
    ``/proc/self/task/TID/syscall`` shows: futex, op ``FUTEX_WAIT_BITSET``, a null timeout); by then it
    has dropped the work of its last collective. One waiting for the GIL waits with a timeout, one
    executing a collective is running or in another call: both are waited for. The idle state must
    be seen twice in a row, a sleep apart, so a worker that was handed the GIL in between is seen.

    Returns:
        True when every worker was idle, False at the deadline, None where the threads cannot be
        read (not Linux): then the GIL is released for a few milliseconds, the best that can be done.
    """
    workers = _gloo_workers()
    if workers is None:
        time.sleep(0.02)
        return None
    end = time.monotonic() + deadline
    settled = 0
    while workers:
        idle = [tid for tid in workers if _is_idle(tid)]
        settled = settled + 1 if len(idle) == len(workers) else 0
        if settled >= 2:
            return True
        if time.monotonic() > end:
            logger.debug("gloo workers still busy at exit after %.1fs: %s", deadline, workers)
            return False
        time.sleep(0.001)
        workers = [tid for tid in workers if os.path.exists(f"/proc/self/task/{tid}")]
    return True


def _gloo_workers() -> Optional[list]:
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    out = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
                if f.read().strip() == GLOO_WORKER:
                    out.append(int(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return out


_FUTEX = "202"  # x86-64; other architectures: see _futex_number()
_WAIT_BITSET = 9


def _is_idle(tid: int) -> bool:
    """The thread is blocked in an untimed condition-variable wait (a thread that ended is idle too)."""
    try:
        with open(f"/proc/self/task/{tid}/syscall", encoding="ascii", errors="replace") as f:
            fields = f.read().split()
    except OSError:  # the thread ended: nothing of it is left to release
        return not os.path.exists(f"/proc/self/task/{tid}")
    if len(fields) < 5 or fields[0] != _futex_number():
        return False
    try:
        op, timeout = int(fields[2], 16), int(fields[4], 16)
    except ValueError:
        return False
    return op & 0x7F == _WAIT_BITSET and timeout == 0


def _futex_number() -> str:
    """The futex system call's number on this machine (x86-64 202, arm64/riscv 98)."""
    return {"aarch64": "98", "riscv64": "98"}.get(os.uname().machine, _FUTEX)


def exit_now(code: int = 0) -> NoReturn:
    """End this process with ``code`` now, without the interpreter's teardown (opt-in).

    Call it as the last line of a training script (``ddpdoctor.exit_now()``, or ``exit_now(1)``) on
    every rank. What a normal exit does first is done here too: the ``atexit`` handlers run (the
    process group is destroyed, logging is flushed), then every open file and the standard streams
    are flushed. What is skipped is the interpreter freeing every object and the C++ static
    destructors, where torch's native threads can abort a finished job (SIGABRT, "terminate called
    without an active exception"; torchrun then reports the job as failed).

    Args:
        code: the exit status (0-255).

    Raises:
        ValueError: ``code`` is not an int in 0..255 (nothing is done then).
    """
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
        raise ValueError(f"exit_now(code={code!r}): pass an exit status from 0 to 255")
    try:
        atexit._run_exitfuncs()
    finally:
        _flush_files()
        os._exit(code)


def _flush_files() -> None:
    """Flush every open writable file object: os._exit would drop what their buffers still hold."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        _flush(stream)
    for obj in gc.get_objects():
        if isinstance(obj, (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)):
            _flush(obj)


def _flush(stream: object) -> None:
    try:
        if stream is not None and not stream.closed and stream.writable():  # type: ignore[attr-defined]
            stream.flush()  # type: ignore[attr-defined]
    except (OSError, ValueError, AttributeError):  # a closed pipe, a detached stream: nothing more to save
        pass


atexit.register(destroy_at_exit)
