"""Test-only subclasses of the collectives checks that misbehave on one rank, through the check's seams.

Loaded with DDPDOCTOR_PLUGINS=collective_faults. FAULT_RANK picks the rank; FAULT_OP, FAULT_DTYPE,
FAULT_COUNT and FAULT_GROUP (a prefix of the group label, default "world") pick the operation;
FAULT_INDEX is the flat output index to perturb; FAULT_SLEEP the straggler's delay in seconds.
"""

from __future__ import annotations

import os
import time

from ddpdoctor.check import RankContext
from ddpdoctor.checks.collectives import CollectivesBenchCheck, CollectivesCheck
from ddpdoctor.diagnostics.collective_plan import Step


def _is_target(ctx: RankContext, step: Step) -> bool:
    return (ctx.rank == int(os.environ.get("FAULT_RANK", "1"))
            and step.op == os.environ.get("FAULT_OP", "all_reduce(sum)")
            and step.dtype == os.environ.get("FAULT_DTYPE", "float32")
            and step.count == int(os.environ.get("FAULT_COUNT", "8"))
            and step.group.label.startswith(os.environ.get("FAULT_GROUP", "world")))


def perturb(step: Step, index: int) -> None:
    """Add 1 at flat ``index`` of the step's output (list outputs count as one concatenated buffer)."""
    for out in step.outputs():
        if index < out.numel():
            out.view(-1)[index] += 1
            return
        index -= out.numel()
    raise IndexError("FAULT_INDEX is past the end of the output")


def hang_before_entering(seconds: float) -> None:
    time.sleep(seconds)


class PerturbedCollectives(CollectivesCheck):
    name = "coll-perturb"
    description = "FAULT_RANK's result of one operation is changed after the collective"

    def received(self, ctx: RankContext, step: Step) -> None:
        if _is_target(ctx, step):
            perturb(step, int(os.environ.get("FAULT_INDEX", "0")))


class HangingCollectives(CollectivesCheck):
    name = "coll-hang"
    description = "FAULT_RANK never enters one operation"

    def collective(self, ctx: RankContext, step: Step) -> None:
        if _is_target(ctx, step):
            hang_before_entering(600)
        super().collective(ctx, step)


class SlowCollectives(CollectivesCheck):
    name = "coll-slow"
    description = "FAULT_RANK reaches every timed collective FAULT_SLEEP seconds late (a straggler)"

    def arrive(self, ctx: RankContext, step: Step) -> None:
        if ctx.rank == int(os.environ.get("FAULT_RANK", "1")):
            time.sleep(float(os.environ.get("FAULT_SLEEP", "0.04")))


class PerturbedBench(CollectivesBenchCheck):
    name = "coll-bench-perturb"
    description = "the bench sweep with FAULT_RANK's result of one operation changed"

    def received(self, ctx: RankContext, step: Step) -> None:
        if _is_target(ctx, step):
            perturb(step, int(os.environ.get("FAULT_INDEX", "0")))


CHECKS = [PerturbedCollectives, HangingCollectives, SlowCollectives, PerturbedBench]


class SkippingCollectives(CollectivesCheck):
    name = "coll-skip"
    description = "FAULT_RANK skips one operation (neither records nor runs it)"

    def collective(self, ctx: RankContext, step: Step) -> None:
        if _is_target(ctx, step):
            self._seq += 1
            return
        super().collective(ctx, step)


CHECKS.append(SkippingCollectives)
