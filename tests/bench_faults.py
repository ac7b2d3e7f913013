"""Loaded with DDPDOCTOR_PLUGINS=bench_faults: `ddpdoctor bench` itself, with FAULT_RANK failing
(FAULT_KIND, see faults.fail_now) when it reaches its first FAULT_OP (default all_reduce(sum)) while the
other ranks enter that collective. Adds no check: it wraps the bench check's collective seam."""

from __future__ import annotations

import os
import time

from ddpdoctor.checks.collectives import CollectivesBenchCheck
from faults import fail_now

_collective = CollectivesBenchCheck.collective


def _failing_collective(self, ctx, step) -> None:  # type: ignore[no-untyped-def]
    if ctx.rank == int(os.environ.get("FAULT_RANK", "1")) and step.op == os.environ.get("FAULT_OP", "all_reduce(sum)"):
        time.sleep(float(os.environ.get("FAULT_DELAY", "0.5")))  # the others are in the collective by now
        fail_now(ctx)
    _collective(self, ctx, step)


CollectivesBenchCheck.collective = _failing_collective
CHECKS: list = []
