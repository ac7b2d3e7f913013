"""Test-only checks that misbehave on purpose, loaded through DDPDOCTOR_PLUGINS=faults.

Which rank misbehaves comes from FAULT_RANK (default 1); FAULT_SLEEP bounds the "hang" (seconds).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

from ddpdoctor.check import Check, RankContext, Requirements
from ddpdoctor.result import Outcome


def _target() -> int:
    return int(os.environ.get("FAULT_RANK", "1"))


def hang_forever(seconds: float) -> None:
    time.sleep(seconds)


class RaiseCheck(Check):
    name = "fault-raise"
    description = "raises ValueError on FAULT_RANK"

    def run(self, ctx: RankContext) -> Outcome:
        if ctx.rank == _target():
            raise ValueError(f"injected failure on rank {ctx.rank}")
        return ctx.passed("fine")


class ExitCheck(Check):
    name = "fault-exit"
    description = "os._exit(7) on FAULT_RANK"

    def run(self, ctx: RankContext) -> Outcome:
        if ctx.rank == _target():
            os._exit(7)
        return ctx.passed("fine")


class SegvCheck(Check):
    name = "fault-segv"
    description = "SIGSEGV on FAULT_RANK"

    def run(self, ctx: RankContext) -> Outcome:
        if ctx.rank == _target():
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(5)
        return ctx.passed("fine")


class HangCheck(Check):
    name = "fault-hang"
    description = "FAULT_RANK sleeps (a hung rank)"

    def run(self, ctx: RankContext) -> Outcome:
        if ctx.rank == _target():
            hang_forever(float(os.environ.get("FAULT_SLEEP", "600")))
        return ctx.passed("fine")


def churn() -> None:
    """Run Python all the time, as a DataLoader's pin-memory thread or a user's data thread does."""
    def rec(n: int) -> int:
        return 0 if n == 0 else rec(n - 1) + 1

    while True:
        rec(300)


def hold_the_gil() -> None:
    re.match(r"(a+)+$", "a" * 64 + "b")  # C code that never lets the GIL go (2**64 steps)


class BusyHangCheck(Check):
    name = "fault-hang-busy"
    description = "FAULT_RANK hangs while a thread of its own runs Python; FAULT_GIL_RANK holds the GIL (busy thread too)"

    def run(self, ctx: RankContext) -> Outcome:
        if ctx.rank == _target():
            threading.Thread(target=churn, name="churn", daemon=True).start()
            hang_forever(float(os.environ.get("FAULT_SLEEP", "600")))
        if str(ctx.rank) == os.environ.get("FAULT_GIL_RANK"):
            threading.Thread(target=churn, name="churn", daemon=True).start()  # may handle the stack signal
            hold_the_gil()
        return ctx.passed("fine")


class SkipCollectiveCheck(Check):
    name = "fault-skip-collective"
    description = "FAULT_RANK skips an all_reduce the others enter"
    requires = Requirements(min_world_size=2, process_group=True)

    def run(self, ctx: RankContext) -> Outcome:
        ctx.process_group()
        if ctx.rank != _target():
            t = torch.ones(1)
            dist.all_reduce(t)
        return ctx.passed("fine")


class MarkThenCollectiveCheck(Check):
    """Every rank touches FAULT_MARKER.<rank>, sleeps FAULT_DELAY seconds, then all_reduces: a test
    can break something (a link, a process) in that window, knowing every rank got there."""

    name = "fault-mark-then-collective"
    description = "marker file, pause, all_reduce"
    requires = Requirements(min_world_size=2, process_group=True)

    def run(self, ctx: RankContext) -> Outcome:
        ctx.process_group()
        with open(f"{os.environ['FAULT_MARKER']}.{ctx.rank}", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(float(os.environ.get("FAULT_DELAY", "2")))
        t = torch.ones(1)
        dist.all_reduce(t)
        return ctx.passed(f"sum {t.item():g}")


class PassCheck(Check):
    name = "fault-none"
    description = "passes on every rank (runs after a fault)"

    def run(self, ctx: RankContext) -> Outcome:
        return ctx.passed(f"rank {ctx.rank} ok")


CHECKS = [RaiseCheck, ExitCheck, SegvCheck, HangCheck, BusyHangCheck, SkipCollectiveCheck, MarkThenCollectiveCheck, PassCheck]


FAULT_KINDS = ("raise", "fail", "exit0", "exit3", "sysexit2", "sigkill", "sigsegv")


def fail_now(ctx: RankContext) -> Outcome:
    """Fail in the way FAULT_KIND names, after writing the time to FAULT_STAMP (if set)."""
    kind = os.environ.get("FAULT_KIND", "raise")
    stamp = os.environ.get("FAULT_STAMP")
    if stamp:
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
    if kind == "raise":
        raise RuntimeError(f"injected failure on rank {ctx.rank}")
    if kind == "fail":
        return ctx.failed(f"injected finding on rank {ctx.rank}", hint="undo the injected fault",
                          finding="injected-fault")
    if kind in ("exit0", "exit3"):
        os._exit(int(kind[-1]))
    if kind == "sysexit2":
        sys.exit(2)
    if kind == "vanish":  # the rank's whole process goes (joined mode: the launched process, as the OOM killer does)
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(5)
    if kind in ("sigkill", "sigsegv"):
        os.kill(os.getpid(), signal.SIGKILL if kind == "sigkill" else signal.SIGSEGV)
        time.sleep(5)
    raise AssertionError(f"unknown FAULT_KIND {kind!r}; one of {', '.join(FAULT_KINDS)}")


class MatrixCheck(Check):
    """FAULT_RANK fails (FAULT_KIND) either before the world forms (FAULT_WHEN=before: the others wait
    for it in the rendezvous) or while the others wait for it in all_reduce (FAULT_WHEN=during)."""

    name = "fault-matrix"
    description = "FAULT_RANK fails in the FAULT_KIND way, FAULT_WHEN before or during a collective"
    requires = Requirements(min_world_size=2, process_group=True)

    def run(self, ctx: RankContext) -> Outcome:
        target = ctx.rank == _target()
        if target and os.environ.get("FAULT_WHEN", "during") == "before":
            return fail_now(ctx)
        ctx.process_group()
        if target:
            time.sleep(float(os.environ.get("FAULT_DELAY", "0.5")))  # the others are in all_reduce by now
            return fail_now(ctx)
        t = torch.ones(1)
        dist.all_reduce(t)
        return ctx.passed(f"sum {t.item():g}")


CHECKS.insert(CHECKS.index(PassCheck), MatrixCheck)  # fault-none runs after it


class DeviceOrdinalCheck(Check):
    """FAULT_RANK fails the way a rank does that asks for a GPU it cannot see (the message CUDA
    gives), before the others' rendezvous completes."""

    name = "fault-device-ordinal"
    description = "FAULT_RANK raises CUDA's invalid device ordinal error before the process group forms"
    requires = Requirements(min_world_size=2, process_group=True)

    def run(self, ctx: RankContext) -> Outcome:
        if ctx.rank == _target():
            raise RuntimeError("CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously "
                               "reported at some other API call, so the stacktrace below might be incorrect.")
        ctx.process_group()
        return ctx.passed("joined")


CHECKS.insert(CHECKS.index(PassCheck), DeviceOrdinalCheck)
