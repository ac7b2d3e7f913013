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

import torch
from torch.utils.data.distributed import DistributedSampler

from ddpdoctor.check import Check, RankContext, Requirements
from ddpdoctor.result import Outcome, count
from ddpdoctor.diagnostics.sampler_guard import SamplerEpochWarning, guard_sampler

__all__ = ["SamplerCheck"]

PITFALL = "without sampler.set_epoch(epoch) the shuffled order repeats every epoch"
FIX = "call sampler.set_epoch(epoch) at the start of every epoch, before iterating the DataLoader"


def _gather(obj: Any) -> list[Any]:
    """Every rank's int, or list of ints, in rank order (tensors: all_gather_object needs numpy)."""
    import torch.distributed as dist

    values = torch.tensor(obj if isinstance(obj, list) else [obj], dtype=torch.int64)
    world = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([values.numel()], dtype=torch.int64))
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.int64)
    padded[:values.numel()] = values
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded)
    rows = [t[:int(n)].tolist() for t, n in zip(out, sizes)]
    return rows if isinstance(obj, list) else [row[0] for row in rows]


def _gather_all(lists: list[list[int]]) -> list[list[list[int]]]:
    """Several int lists per rank in one exchange (two all_gathers in all, whatever the count):
    ``out[k][r]`` is rank r's ``lists[k]``."""
    packed = [len(lists)] + [len(x) for x in lists] + [v for x in lists for v in x]
    out: list[list[list[int]]] = [[] for _ in lists]
    for row in _gather(packed):
        k, pos = row[0], 1 + row[0]
        for i, size in enumerate(row[1:1 + k]):
            out[i].append(row[pos:pos + size])
            pos += size
    return out


def _shard(n: int, world: int, rank: int, **kwargs: Any) -> list[int]:
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, **kwargs)
    sampler.set_epoch(0)
    return list(sampler)


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

        # Every rank's samplers first, then one exchange of all of them (a collective costs far more
        # than these few dozen integers on a crowded world).
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(0)
        first, again = list(sampler), list(sampler)
        sampler.set_epoch(1)
        reshuffled = list(sampler)
        shards, dropped_shards, seeds, skewed, epoch1 = _gather_all([
            _shard(n, world, rank, shuffle=True, seed=0),
            _shard(n, world, rank, shuffle=True, seed=0, drop_last=True),
            [sampler.seed],
            _shard(n, world, rank, shuffle=True, seed=rank),
            reshuffled,
        ])
        seeds = [s[0] for s in seeds]
        dupes, missed = _overlap(shards, n)
        padding = world * math.ceil(n / world) - n
        details.append(f"dataset of {count(n, 'sample')} over {count(world, 'rank')}: every rank gets "
                       f"{count(len(shards[0]), 'sample')}; {count(padding, 'padding duplicate')} "
                       "in all (they count twice in evaluation metrics)")
        if missed:
            problems.append(("sampler-coverage-gap", f"{missed} of {count(n, 'sample')} reach{'es' if missed == 1 else ''} no rank",
                             "pass num_replicas=world_size and rank=this rank to DistributedSampler"))
        if dupes != padding:
            problems.append(("sampler-shards-overlap",
                             f"shards overlap on {count(dupes, 'sample')}, expected {count(padding, 'padding duplicate')}",
                             "pass num_replicas=world_size and rank=this rank to DistributedSampler"))

        d_dupes, d_missed = _overlap(dropped_shards, n)
        details.append(f"drop_last=True: {count(len(dropped_shards[0]), 'sample')} per rank, no duplicates, "
                       f"{count(d_missed, 'sample')} left out of every epoch")
        if d_dupes:
            problems.append(("sampler-shards-overlap",
                             f"with drop_last=True shards still overlap on {count(d_dupes, 'sample')}",
                             "pass num_replicas=world_size and rank=this rank to DistributedSampler"))

        if len(set(seeds)) > 1:
            problems.append(("sampler-seed-mismatch",
                             "ranks shuffle with different seeds ("
                             + ", ".join(f"rank {r}: {v}" for r, v in enumerate(seeds))
                             + f"), so their shards overlap on {count(dupes - padding, 'sample')} and miss {missed}",
                             "pass the same seed to DistributedSampler on every rank"))
        skewed_dupes, skewed_missed = _overlap(skewed, n)
        details.append(f"seed: every rank uses seed {seeds[0]}; with seed=rank instead the shards "
                       f"would overlap on {count(skewed_dupes, 'sample')} and miss {skewed_missed}")

        repeats, changes = first == again, first != reshuffled
        details.append(f"epochs: without set_epoch the second pass {'repeats' if repeats else 'changes'} "
                       f"the first pass's order; after set_epoch(1) it "
                       f"{'changes' if changes else 'stays the same'}")
        if not changes:
            problems.append(("sampler-epoch-no-reshuffle", "set_epoch(1) did not change the order",
                             "construct DistributedSampler with shuffle=True for training"))
        epoch1_dupes, _ = _overlap(epoch1, n)
        if epoch1_dupes != padding:
            problems.append(("sampler-shards-overlap",
                             f"after set_epoch(1) shards overlap on {count(epoch1_dupes, 'sample')}",
                             "call set_epoch with the same epoch on every rank"))

        # check_ranks=False: the seeds were compared above, and every rank reading every peer's entry
        # (warn_rank=None) would be O(world) store reads per rank.
        guarded = guard_sampler(DistributedSampler(range(n), num_replicas=world, rank=rank,
                                                   shuffle=True, seed=0), warn_rank=None, check_ranks=False)
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
        summary = (f"built-in dataset on this world: {count(n, 'sample')} over {count(world, 'rank')}: shards "
                   f"disjoint and complete ({count(padding, 'padding duplicate')}, drop_last drops {d_missed}), same "
                   f"seed; {PITFALL} (your job's own sampler: run it under ddpdoctor run)")
        return ctx.passed(summary, hint=FIX, details=details, data=data)
