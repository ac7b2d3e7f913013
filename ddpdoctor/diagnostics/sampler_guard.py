"""Catch a DistributedSampler that repeats its order every epoch, or that ranks configure differently.

``DistributedSampler(shuffle=True)`` derives its permutation from ``seed + epoch``. Without a
``sampler.set_epoch(epoch)`` call at the start of each epoch, every epoch sees the same order, and
nothing fails: the model is just worse. :func:`guard_sampler` instruments the sampler in place: it
looks at the sampler once per pass (when the DataLoader starts iterating it), never per sample.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Optional

import torch
from torch.utils.data.distributed import DistributedSampler

__all__ = ["guard_sampler", "SamplerWarning", "SamplerEpochWarning", "SamplerMismatchWarning"]

log = logging.getLogger(__name__)

_FIELDS = ("seed", "epoch", "num_replicas", "dataset length", "shuffle", "drop_last", "rank")
_MASK63 = (1 << 63) - 1


class SamplerWarning(UserWarning):
    """Base class of the sampler warnings."""


class SamplerEpochWarning(SamplerWarning):
    """A shuffling DistributedSampler started a new pass with the same epoch as the previous one."""


class SamplerMismatchWarning(SamplerWarning):
    """Ranks disagree on the sampler's seed, epoch, num_replicas, dataset length or rank."""


class _GuardState:
    def __init__(self, warn_rank: Optional[int], check_ranks: bool, group: Any) -> None:
        self.warn_rank = warn_rank
        self.check_ranks = check_ranks
        self.group = group
        self.last_epoch: Optional[int] = None
        self.passes = 0
        self.warned_epoch = False
        self.warned_mismatch: set[str] = set()

    def speaks(self, sampler: DistributedSampler) -> bool:
        return self.warn_rank is None or sampler.rank == self.warn_rank

    def on_pass(self, sampler: DistributedSampler) -> None:
        """Called when a pass over the sampler starts, on every rank."""
        self.passes += 1
        epoch = int(sampler.epoch)
        if (sampler.shuffle and self.last_epoch is not None and epoch == self.last_epoch
                and not self.warned_epoch):
            self.warned_epoch = True
            if self.speaks(sampler):
                warnings.warn(
                    f"DistributedSampler started pass {self.passes} with epoch {epoch}, the same "
                    "epoch as the previous pass, so with shuffle=True every epoch repeats the same "
                    "order; call sampler.set_epoch(epoch) at the start of every epoch, before "
                    "iterating the DataLoader",
                    SamplerEpochWarning, stacklevel=3)
        self.last_epoch = epoch
        if self.check_ranks:
            self.compare_ranks(sampler)

    def compare_ranks(self, sampler: DistributedSampler) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(self.group) < 2:
            return
        values = [int(sampler.seed) & _MASK63, int(sampler.epoch), int(sampler.num_replicas),
                  len(sampler.dataset), int(sampler.shuffle), int(sampler.drop_last), int(sampler.rank)]
        device = (torch.device("cuda", torch.cuda.current_device())
                  if dist.get_backend(self.group) == "nccl" else torch.device("cpu"))
        mine = torch.tensor(values, dtype=torch.int64, device=device)
        everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(everyone, mine, group=self.group)
        table = [t.tolist() for t in everyone]
        problems = []
        for i, field in enumerate(_FIELDS[:-1]):
            column = [row[i] for row in table]
            if len(set(column)) > 1:
                problems.append(f"{field} " + ", ".join(f"rank {r}: {v}" for r, v in enumerate(column)))
        ranks = [row[-1] for row in table]
        if sorted(ranks) != list(range(len(table))):
            problems.append("sampler rank " + ", ".join(f"process {r}: {v}" for r, v in enumerate(ranks)))
        key = "; ".join(problems)
        if not problems or key in self.warned_mismatch:
            return
        self.warned_mismatch.add(key)
        log.debug("sampler mismatch: %s", key)
        if self.speaks(sampler):
            warnings.warn(
                f"ranks disagree on their DistributedSampler: {key}; build the sampler with the "
                "same dataset, seed and num_replicas=world_size on every rank, rank=this rank, "
                "and call set_epoch(epoch) on every rank",
                SamplerMismatchWarning, stacklevel=4)


_guarded_classes: dict[type, type] = {}


def _guarded_class(cls: type) -> type:
    guarded = _guarded_classes.get(cls)
    if guarded is None:
        def __iter__(self: Any) -> Any:
            self._ddpdoctor_guard.on_pass(self)
            return cls.__iter__(self)  # the sampler's own iterator: no per-sample wrapper

        def __reduce_ex__(self: Any, protocol: Any) -> Any:
            state = dict(self.__dict__)
            state.pop("_ddpdoctor_guard", None)
            return (_rebuild, (cls, state))

        guarded = type(cls.__name__, (cls,), {"__iter__": __iter__, "__reduce_ex__": __reduce_ex__,
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
                  check_ranks: bool = True, group: Any = None) -> DistributedSampler:
    """Instrument a DistributedSampler in place and return it.

    At the start of every pass (``iter(sampler)``, which the DataLoader does once per epoch) the
    guarded sampler:

    * emits :class:`SamplerEpochWarning` once when it shuffles and its epoch equals the previous
      pass's epoch (``set_epoch`` was not called);
    * when ``check_ranks`` and a process group is initialized, exchanges seven integers with the
      other ranks (one ``all_gather``) and emits :class:`SamplerMismatchWarning` once per distinct
      disagreement on seed, epoch, num_replicas, dataset length, shuffle, drop_last, or when two
      ranks use the same sampler rank.

    Samples are yielded by the sampler's own iterator, so nothing is added per sample. Pickling
    a guarded sampler yields the plain sampler.

    Args:
        sampler: the DistributedSampler you pass to ``DataLoader(sampler=...)``.
        warn_rank: the rank that emits the warnings; None for every rank.
        check_ranks: compare ranks at every pass. It is a collective: every rank must start the
            same number of passes; pass False if ranks iterate their samplers differently.
        group: the process group for the comparison; the default group when None.

    Returns:
        The same sampler object (its class swapped for a subclass that adds the checks).

    Raises:
        TypeError: ``sampler`` is not a DistributedSampler.
    """
    if not isinstance(sampler, DistributedSampler):
        raise TypeError(
            f"guard_sampler expects a torch.utils.data.DistributedSampler, got "
            f"{type(sampler).__name__}; guard the DistributedSampler you pass to "
            "DataLoader(sampler=...)")
    if getattr(sampler, "_ddpdoctor_guard", None) is None:
        sampler._ddpdoctor_guard = _GuardState(warn_rank, check_ranks, group)  # type: ignore[attr-defined]
        sampler.__class__ = _guarded_class(type(sampler))
    return sampler
