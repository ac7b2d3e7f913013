"""What a run of the checks is asked to do and what it produced, shared by the local and joined worlds."""

from __future__ import annotations

import sys

import os
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

if TYPE_CHECKING:  # the CLI imports this module for the interrupt handlers: `ddpdoctor run` needs no report
    from ddpdoctor.report.document import RunReport

__all__ = ["RunOptions", "RunOutcome", "Interrupted", "terminate_as_interrupt", "install_interrupt_handlers",
           "reset_signals_in_worker", "note_pending", "raise_pending"]

class Interrupted(BaseException):
    """SIGTERM (or SIGINT) reached the supervising process."""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signame = signame



@dataclass
class RunOptions:
    """What ``ddpdoctor check`` was asked to do (defaults match the CLI's)."""

    nproc: Optional[int] = None
    backend: Optional[str] = None
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    only: Sequence[str] = ()
    skip: Sequence[str] = ()
    timeout: float = 30.0
    mode: str = "auto"  # auto | local | join
    strict: bool = False
    options: dict = field(default_factory=dict)
    broken_plugins: bool = True  # a plugin that did not load is a CRASH result (False: bench, locate)



@dataclass
class RunOutcome:
    """What a run produced here: the report (on the reporting process) and the exit code."""

    report: Optional[RunReport]
    exit_code: int
    message: str = ""

    def reported_elsewhere(self) -> bool:
        """True on a non-reporting rank of a joined world (rank 0 prints the report); its own message, if
        any, is said here on stderr."""
        if self.report is not None:
            return False
        if self.message:
            print(self.message, file=sys.stderr, flush=True)
        return True



_PARENT_PID: list = []  # the process that installed the handlers (a forked worker is not it)
_HARD_EXIT_HOOKS: list = []
_PENDING: list = []  # a signal that arrived during start-up, before the handlers (see note_pending)  # cleanups a second signal still runs (temporary folders), then exits


def _second_signal(signum: int, frame: Any) -> None:
    """A second Ctrl-C or SIGTERM: exit now, without unwinding (no traceback, no atexit noise)."""
    if _PARENT_PID and os.getpid() != _PARENT_PID[0]:
        _in_child(signum)
        return
    for hook in list(_HARD_EXIT_HOOKS):
        try:
            hook()
        except BaseException:  # noqa: BLE001 - exiting anyway
            pass
    try:
        os.write(2, f"\ninterrupted again ({signal.Signals(signum).name}): exiting now\n".encode())
    except OSError:
        pass
    os._exit(130)  # ExitCode.INTERRUPTED; workers die with us (PR_SET_PDEATHSIG)


def _first_signal(signum: int, frame: Any) -> None:
    """The first Ctrl-C or SIGTERM: stop cleanly (the run ends with a report of what ran)."""
    if _PARENT_PID and os.getpid() != _PARENT_PID[0]:
        _in_child(signum)
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _second_signal)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(signal.Signals(signum).name)


def _in_child(signum: int) -> None:
    """A forked worker got a signal before it reset the handlers: behave as a worker does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if signum == signal.SIGTERM:
        os.kill(os.getpid(), signal.SIGTERM)


def note_pending(signum: int) -> None:
    """A signal that arrived before the handlers were installed: :func:`raise_pending` acts on it."""
    _PENDING[:] = [signum]
    for sig in (signal.SIGINT, signal.SIGTERM):  # the next one is the second
        try:
            signal.signal(sig, _second_signal)
        except ValueError:
            pass


def raise_pending() -> None:
    """Raise for a signal kept by :func:`note_pending` (once): where the command can stop cleanly."""
    if _PENDING:
        signum = _PENDING.pop()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Interrupted(signal.Signals(signum).name)


def install_interrupt_handlers() -> bool:
    """SIGINT and SIGTERM stop this process in two stages: the first raises (``KeyboardInterrupt`` or
    :class:`Interrupted`) so the run ends with a report; a second exits at once (code 130).

    Returns False where handlers cannot be set (not the main thread). Idempotent.
    """
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) not in (_first_signal, _second_signal):
                signal.signal(sig, _first_signal)
    except ValueError:  # not the main thread
        return False
    _PARENT_PID[:] = [os.getpid()]
    return True


def reset_signals_in_worker() -> None:
    """In a forked worker, first thing: drop the parent's handlers (Ctrl-C is the supervisor's to
    handle; SIGTERM ends the worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _HARD_EXIT_HOOKS.clear()


class terminate_as_interrupt:
    """Within the block, SIGTERM raises :class:`Interrupted` and Ctrl-C raises KeyboardInterrupt; a second
    one exits at once, after running ``cleanup`` (see :func:`install_interrupt_handlers`)."""

    def __init__(self, cleanup: Optional[Callable[[], Any]] = None) -> None:
        self.cleanup = cleanup
        self.previous: Optional[dict] = None

    def __enter__(self) -> None:
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        if install_interrupt_handlers():
            self.previous = previous
        if self.cleanup is not None:
            _HARD_EXIT_HOOKS.append(self.cleanup)

    def __exit__(self, *exc: Any) -> None:
        if self.cleanup is not None and self.cleanup in _HARD_EXIT_HOOKS:
            _HARD_EXIT_HOOKS.remove(self.cleanup)
        if self.previous is not None:
            for sig, handler in self.previous.items():
                if handler is not None and signal.getsignal(sig) is _first_signal:
                    signal.signal(sig, handler)  # a second-stage handler stays: the run is ending
