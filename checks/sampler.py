"""Check ``sampler``: how DistributedSampler shards a dataset, and the set_epoch pitfall.

Over a dataset whose length does not divide by the world size, every rank builds the sampler the
way training code does; the ranks exchange their shards (a few dozen integers) and verify that the
shards are disjoint and cover the dataset, count the padding duplicates and what ``drop_last``
changes, verify that every rank uses the same seed, and show that the shuffled order repeats across
epochs without ``set_epoch`` and changes with it. :func:`ddpdoctor.guard_sampler` must catch the
repeat.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from typing import Any

from torch.utils.data.distributed import DistributedSampler

from ddpdoctor.check import Check, RankContext, Requirements
from ddpdoctor.result import Outcome
from ddpdoctor.diagnostics.sampler_guard import SamplerEpochWarning, guard_sampler

__all__ = ["SamplerCheck"]

PITFALL = "without sampler.set_epoch(epoch) the shuffled order repeats every epoch"
FIX = "call sampler.set_epoch(epoch) at the start of every epoch, before iterating the DataLoader"


def _gather(obj: Any) -> list[Any]:
    # ddpdoctor's gather_object, not torch's all_gather_object: torch's needs numpy.
    from ddpdoctor.dist.gathering import gather_object

    return gather_object(obj)


def _shards(n: int, world: int, rank: int, **kwargs: Any) -> list[list[int]]:
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, **kwargs)
    sampler.set_epoch(0)
    return _gather(list(sampler))


def _overlap(shards: list[list[int]], n: int) -> tuple[int, int]:
    """(extra copies beyond the first, dataset indices no rank sees)."""
    counts = Counter(i for shard in shards for i in shard)
    return sum(c - 1 for c in counts.values()), n - len(counts)


class SamplerCheck(Check):
    """DistributedSampler shards are disjoint, padded as documented, seeded alike, reshuffled by set_epoch."""

    name = "sampler"
    description = "DistributedSampler: disjoint shards, padding, same seed, set_epoch reshuffles"
    requires = Requirements(min_world_size=2, process_group=True)

    def run(self, ctx: RankContext) -> Outcome:
        ctx.process_group()
        world, rank = ctx.world_size, ctx.rank
        n = 5 * world + 1  # never divisible by the world size
        problems: list[tuple[str, str, str]] = []  # finding, summary, hint
        details: list[str] = []

        shards = _shards(n, world, rank, shuffle=True, seed=0)
        dupes, missed = _overlap(shards, n)
        padding = world * math.ceil(n / world) - n
        details.append(f"dataset of {n} samples over {world} ranks: every rank gets "
                       f"{len(shards[0])} samples; {padding} padding duplicate{'s' if padding != 1 else ''} "
                       "in all (they count twice in evaluation metrics)")
        if missed:
            problems.append(("sampler-coverage-gap", f"{missed} of {n} samples reach no rank",
                             "pass num_replicas=world_size and rank=this rank to DistributedSampler"))
        if dupes != padding:
            problems.append(("sampler-shards-overlap",
                             f"shards overlap on {dupes} samples, expected {padding} padding duplicates",
                             "pass num_replicas=world_size and rank=this rank to DistributedSampler"))

        dropped_shards = _shards(n, world, rank, shuffle=True, seed=0, drop_last=True)
        d_dupes, d_missed = _overlap(dropped_shards, n)
        details.append(f"drop_last=True: {len(dropped_shards[0])} samples per rank, no duplicates, "
                       f"{d_missed} sample{'s' if d_missed != 1 else ''} left out of every epoch")
        if d_dupes:
            problems.append(("sampler-shards-overlap",
                             f"with drop_last=True shards still overlap on {d_dupes} samples",
                             "pass num_replicas=world_size and rank=this rank to DistributedSampler"))

        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=0)
        seeds = _gather(sampler.seed)
        if len(set(seeds)) > 1:
            problems.append(("sampler-seed-mismatch",
                             "ranks shuffle with different seeds ("
                             + ", ".join(f"rank {r}: {v}" for r, v in enumerate(seeds))
                             + f"), so their shards overlap on {dupes - padding} samples and miss {missed}",
                             "pass the same seed to DistributedSampler on every rank"))
        skewed_dupes, skewed_missed = _overlap(_shards(n, world, rank, shuffle=True, seed=rank), n)
        details.append(f"seed: every rank uses seed {seeds[0]}; with seed=rank instead the shards "
                       f"would overlap on {skewed_dupes} samples and miss {skewed_missed}")

        sampler.set_epoch(0)
        first, again = list(sampler), list(sampler)
        sampler.set_epoch(1)
        reshuffled = list(sampler)
        repeats, changes = first == again, first != reshuffled
        details.append(f"epochs: without set_epoch the second pass {'repeats' if repeats else 'changes'} "
                       f"the first pass's order; after set_epoch(1) it "
                       f"{'changes' if changes else 'stays the same'}")
        if not changes:
            problems.append(("sampler-epoch-no-reshuffle", "set_epoch(1) did not change the order",
                             "construct DistributedSampler with shuffle=True for training"))
        epoch1_dupes, _ = _overlap(_gather(reshuffled), n)
        if epoch1_dupes != padding:
            problems.append(("sampler-shards-overlap",
                             f"after set_epoch(1) shards overlap on {epoch1_dupes} samples",
                             "call set_epoch with the same epoch on every rank"))

        guarded = guard_sampler(DistributedSampler(range(n), num_replicas=world, rank=rank,
                                                   shuffle=True, seed=0), warn_rank=None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(guarded)
            list(guarded)
        warned = any(issubclass(w.category, SamplerEpochWarning) for w in caught)
        details.append(f"ddpdoctor.guard_sampler(sampler) {'warned' if warned else 'did NOT warn'} "
                       "on the second pass without set_epoch")
        if not warned:
            problems.append(("sampler-guard-silent", "guard_sampler missed a pass without set_epoch",
                             "report this ddpdoctor bug with the torch version"))
        details.append(f"fix: {FIX}; wrap it with ddpdoctor.guard_sampler(sampler) to be warned")

        data = {"dataset": n, "padding": padding, "dropped": d_missed, "seed": seeds[0],
                "repeats_without_set_epoch": repeats, "guard_warned": warned}
        if problems:
            # a seed mismatch causes the overlaps and gaps: name the cause first
            problems.sort(key=lambda p: p[0] != "sampler-seed-mismatch")
            finding, summary, hint = problems[0]
            return ctx.failed(summary, hint=hint, finding=finding, details=details, data=data)
        summary = (f"{n} samples over {world} ranks: shards disjoint and complete ({padding} padding "
                   f"duplicate{'s' if padding != 1 else ''}, drop_last drops {d_missed}), same seed; "
                   f"{PITFALL}")
        return ctx.passed(summary, hint=FIX, details=details, data=data)
