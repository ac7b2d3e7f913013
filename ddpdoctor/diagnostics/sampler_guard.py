"""Catch a DistributedSampler that repeats its order every epoch, or that ranks configure differently.

``DistributedSampler(shuffle=True)`` derives its permutation from ``seed + epoch``. Without a
``sampler.set_epoch(epoch)`` call at the start of each epoch, every epoch sees the same order, and
nothing fails: the model is just worse. :func:`guard_sampler` instruments the sampler in place: it
looks at the sampler once per pass (when the DataLoader starts iterating it), never per sample.

Reading a loader several times in one epoch (a training pass, then an accuracy pass) is normal:
the guard counts the passes of each epoch and warns only when an epoch runs longer than the ones
before it (or, before any epoch has ended, longer than two passes), or when ``set_epoch`` was
never called at all.

The cross-rank comparison never adds a collective: each rank writes its sampler's settings to the
process group's key-value store (one ``set`` per pass), and the rank that warns reads the others'
entries, waiting at most ``rank_wait`` seconds for ranks that have not written yet. A rank that
never iterates (a loop that runs on rank 0 only) costs one such wait, once, and is then compared
only when its entries show up.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import time
import warnings
from typing import Any, Optional

import torch
from torch.utils.data.distributed import DistributedSampler

__all__ = ["guard_sampler", "SamplerWarning", "SamplerEpochWarning", "SamplerMismatchWarning"]

log = logging.getLogger(__name__)

_FIELDS = ("seed", "epoch", "num_replicas", "dataset length", "shuffle", "drop_last", "rank")
_MASK63 = (1 << 63) - 1
_RETRY_PASSES = 4  # passes after which an entry a peer has not written is no longer looked for
_guard_ids = itertools.count()
_SKIP = (os.path.dirname(torch.__file__) + os.sep, os.path.abspath(__file__))


class SamplerWarning(UserWarning):
    """Base class of the sampler warnings."""


class SamplerEpochWarning(SamplerWarning):
    """A shuffling DistributedSampler kept its epoch for more passes than an epoch takes."""


class SamplerMismatchWarning(SamplerWarning):
    """Ranks disagree on the sampler's seed, epoch, num_replicas, dataset length or rank."""


def _warn(message: str, category: type) -> None:
    """``warnings.warn`` naming the user's line: the first frame outside torch and this module."""
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


class _GuardState:
    def __init__(self, warn_rank: Optional[int], check_ranks: bool, group: Any,
                 passes_per_epoch: Optional[int], rank_wait: float) -> None:
        self.warn_rank = warn_rank
        self.check_ranks = check_ranks
        self.group = group
        self.passes_per_epoch = passes_per_epoch
        self.rank_wait = rank_wait
        self.key = f"ddpdoctor/sampler_guard/{next(_guard_ids)}" if check_ranks else ""
        self.last_epoch: Optional[int] = None
        self.run = 0  # passes so far with the current epoch value
        self.longest = 0  # the most passes any earlier epoch value had
        self.set_epoch_calls = 0
        self.passes = 0
        self.warned_epoch = False
        self.warned_mismatch: set[str] = set()
        self.history: dict[int, list[int]] = {}  # pass -> this rank's values, for late peers
        self.pending: dict[int, set[int]] = {}  # pass -> peers whose entry was not there yet
        self.absent: set[int] = set()  # peers not waited for any more
        self.rows: dict[int, dict[int, list[int]]] = {}  # pass -> rank -> values read so far

    def speaks(self, sampler: DistributedSampler) -> bool:
        return self.warn_rank is None or sampler.rank == self.warn_rank

    def limit(self) -> int:
        """How many passes one epoch value may take before the order counts as repeated."""
        if self.passes_per_epoch is not None:
            return self.passes_per_epoch
        if self.set_epoch_calls == 0:
            return 1  # set_epoch never called: a second pass repeats the first one's order
        return max(2, self.longest)  # a training pass and an accuracy pass, or what epochs took

    def on_pass(self, sampler: DistributedSampler) -> None:
        """Called when a pass over the sampler starts, on every rank."""
        self.passes += 1
        epoch = int(sampler.epoch)
        if epoch == self.last_epoch:
            self.run += 1
        else:
            self.longest = max(self.longest, self.run) if self.last_epoch is not None else 0
            self.last_epoch, self.run = epoch, 1
        if sampler.shuffle and self.run > self.limit() and not self.warned_epoch:
            self.warned_epoch = True
            if self.speaks(sampler):
                called = ("set_epoch was never called" if self.set_epoch_calls == 0
                          else f"set_epoch was last called with {epoch}")
                _warn(f"DistributedSampler started pass {self.passes} with epoch {epoch}, the same "
                      f"epoch as the {self.run - 1} previous pass{'es' if self.run > 2 else ''} "
                      f"({called}), so with shuffle=True every epoch repeats the same order; call "
                      "sampler.set_epoch(epoch) at the start of every epoch, before iterating the "
                      "DataLoader (guard_sampler(..., passes_per_epoch=N) if you read the loader "
                      "more than twice per epoch)", SamplerEpochWarning)
        if self.check_ranks:
            self.compare_ranks(sampler)

    def compare_ranks(self, sampler: DistributedSampler) -> None:
        """Publish this pass's settings; on the warning rank, compare with the others' (no collective)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(self.group) < 2:
            return
        store = dist.distributed_c10d._get_default_store()
        me = dist.get_rank()
        values = [int(sampler.seed) & _MASK63, int(sampler.epoch), int(sampler.num_replicas),
                  len(sampler.dataset), int(sampler.shuffle), int(sampler.drop_last), int(sampler.rank)]
        store.set(f"{self.key}/{self.passes}/{me}", ",".join(map(str, values)))
        if not self.speaks(sampler):
            return
        peers = [r for r in dist.get_process_group_ranks(self.group) if r != me] \
            if self.group is not None else [r for r in range(dist.get_world_size()) if r != me]
        self.history[self.passes] = values
        self.pending[self.passes] = set(peers)
        deadline = time.monotonic() + self.rank_wait
        delay = 0.001
        while True:
            for done in self.collect(store, me, sampler):
                self.absent.difference_update(done)
            waiting = self.pending.get(self.passes, set()) - self.absent
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        self.absent.update(self.pending.get(self.passes, set()))
        for old in [p for p in self.history if p <= self.passes - _RETRY_PASSES]:
            self.pending.pop(old, None)
            rows = self.rows.pop(old, {})
            if len(rows) > 1:  # some peers never wrote this pass: compare those that did
                self.report(rows, sampler)
            del self.history[old]

    def collect(self, store: Any, me: int, sampler: DistributedSampler) -> list[set[int]]:
        """Read the entries peers have written for pending passes; compare the passes now complete."""
        arrived = []
        for n, missing in list(self.pending.items()):
            found = {r for r in missing if store.check([f"{self.key}/{n}/{r}"])}
            if not found:
                continue
            arrived.append(found)
            missing -= found
            rows = self.rows.setdefault(n, {me: self.history[n]})
            for r in found:
                rows[r] = [int(v) for v in store.get(f"{self.key}/{n}/{r}").decode().split(",")]
            if not missing:
                del self.pending[n]
                self.report(self.rows.pop(n), sampler)
        return arrived

    def report(self, rows: dict[int, list[int]], sampler: DistributedSampler) -> None:
        ranks = sorted(rows)
        problems = []
        for i, field in enumerate(_FIELDS[:-1]):
            column = [rows[r][i] for r in ranks]
            if len(set(column)) > 1:
                problems.append(f"{field} " + ", ".join(f"rank {r}: {rows[r][i]}" for r in ranks))
        sampler_ranks = [rows[r][-1] for r in ranks]
        if len(set(sampler_ranks)) < len(sampler_ranks):
            problems.append("sampler rank " + ", ".join(f"process {r}: {rows[r][-1]}" for r in ranks))
        key = "; ".join(problems)
        if not problems or key in self.warned_mismatch:
            return
        self.warned_mismatch.add(key)
        log.debug("sampler mismatch: %s", key)
        _warn(f"ranks disagree on their DistributedSampler: {key}; build the sampler with the "
              "same dataset, seed and num_replicas=world_size on every rank, rank=this rank, "
              "and call set_epoch(epoch) on every rank", SamplerMismatchWarning)


_guarded_classes: dict[type, type] = {}


def _guarded_class(cls: type) -> type:
    guarded = _guarded_classes.get(cls)
    if guarded is None:
        def __iter__(self: Any) -> Any:
            self._ddpdoctor_guard.on_pass(self)
            return cls.__iter__(self)  # the sampler's own iterator: no per-sample wrapper

        def set_epoch(self: Any, epoch: int) -> None:
            self._ddpdoctor_guard.set_epoch_calls += 1
            cls.set_epoch(self, epoch)

        def __reduce_ex__(self: Any, protocol: Any) -> Any:
            state = dict(self.__dict__)
            state.pop("_ddpdoctor_guard", None)
            return (_rebuild, (cls, state))

        guarded = type(cls.__name__, (cls,), {"__iter__": __iter__, "set_epoch": set_epoch, "__reduce_ex__": __reduce_ex__,
                                             "__module__": cls.__module__,
                                             "__qualname__": cls.__qualname__})
        _guarded_classes[cls] = guarded
    return guarded


def _rebuild(cls: type, state: dict) -> Any:
    """Unpickle a guarded sampler as the plain sampler it wraps."""
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


def guard_sampler(sampler: DistributedSampler, *, warn_rank: Optional[int] = 0,
                  check_ranks: bool = True, group: Any = None, passes_per_epoch: Optional[int] = None,
                  rank_wait: float = 1.0) -> DistributedSampler:
    """Instrument a DistributedSampler in place and return it.

    At the start of every pass (``iter(sampler)``, which the DataLoader does once per loop over
    it) the guarded sampler:

    * emits :class:`SamplerEpochWarning` once when it shuffles and keeps its epoch for more passes
      than an epoch takes: a second pass when ``set_epoch`` was never called; otherwise more
      passes than ``passes_per_epoch``, or, when that is not given, than the longest earlier epoch
      (at least two: a training pass and an accuracy pass per epoch are fine);
    * when ``check_ranks`` and a process group is initialized, publishes seven integers (seed,
      epoch, num_replicas, dataset length, shuffle, drop_last, rank) in the process group's store
      and, on the warning rank, compares them with the other ranks' entries for the same pass,
      emitting :class:`SamplerMismatchWarning` once per distinct disagreement. This is not a
      collective: ranks that iterate a different number of times (or not at all) never block
      anyone; the warning rank waits at most ``rank_wait`` seconds for entries not written yet,
      and stops waiting for a rank that missed that deadline until it writes again.

    Warnings name the line of your code that started the pass, not a line inside torch. Samples
    are yielded by the sampler's own iterator, so nothing is added per sample. Pickling a guarded
    sampler yields the plain sampler.

    Args:
        sampler: the DistributedSampler you pass to ``DataLoader(sampler=...)``.
        warn_rank: the rank that emits the warnings; None for every rank.
        check_ranks: compare the sampler's settings across ranks. Ranks must guard their samplers
            in the same order (the n-th guarded sampler of each rank is compared with the n-th).
        group: the process group whose ranks are compared; the default group when None.
        passes_per_epoch: how many times your loop reads the loader per epoch, when it is more
            than two; None to learn it from the epochs seen.
        rank_wait: the longest the warning rank waits, per pass, for other ranks' entries.

    Returns:
        The same sampler object (its class swapped for a subclass that adds the checks).

    Raises:
        TypeError: ``sampler`` is not a DistributedSampler.
        ValueError: ``passes_per_epoch`` is not a positive integer, or ``rank_wait`` is negative.
    """
    if not isinstance(sampler, DistributedSampler):
        raise TypeError(
            f"guard_sampler expects a torch.utils.data.DistributedSampler, got "
            f"{type(sampler).__name__}; guard the DistributedSampler you pass to "
            "DataLoader(sampler=...)")
    if passes_per_epoch is not None and (not isinstance(passes_per_epoch, int) or passes_per_epoch < 1):
        raise ValueError(f"passes_per_epoch must be a positive integer, got {passes_per_epoch!r}; "
                         "pass how many times your loop reads the loader per epoch, or None")
    if rank_wait < 0:
        raise ValueError(f"rank_wait must be >= 0 seconds, got {rank_wait!r}")
    if getattr(sampler, "_ddpdoctor_guard", None) is None:
        sampler._ddpdoctor_guard = _GuardState(  # type: ignore[attr-defined]
            warn_rank, check_ranks, group, passes_per_epoch, rank_wait)
        sampler.__class__ = _guarded_class(type(sampler))
    return sampler
