"""Lightning Fabric's collectives, seeding and rank-zero helper, with Fabric's semantics (lightning-fabric 2.6).

``fabric.all_gather(data)`` -> ``all_gather(data)`` and so on: the same arguments, defaults and
results. Fabric first turns Python numbers into tensors (bool -> uint8, int -> int32, float ->
float32) and leaves other leaves (strings) as they are; so do these. ``all_gather`` stacks each
tensor: ``[world, *shape]`` (a world of one returns the tensor unstacked, as Fabric's single-device
strategy). ``all_reduce`` reduces each tensor in place (``reduce_op="mean"`` by default; an integer
mean rounds toward zero into the same dtype) and returns it.

Deliberately different: where Fabric's ranks pass different shapes, dtypes or structures, gloo and
NCCL hang or pair the wrong tensors; here every rank raises the same
:class:`~ddpdoctor.training.CollectiveMismatchError` first.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import Any, Callable, Optional, TypeVar, Union

import torch
import torch.distributed as dist

from ddpdoctor.compat.collection import flat_leaves, map_leaves
from ddpdoctor.compat.exchange import REDUCTIONS, group_exists, reduced
from ddpdoctor.training import barrier as _barrier
from ddpdoctor.training import broadcast_object, gather, is_rank_zero
from ddpdoctor.training import seed_everything as _seed_everything
from ddpdoctor.training.ranks import get_rank

__all__ = ["all_gather", "all_reduce", "broadcast", "barrier", "seed_everything", "reset_seed", "rank_zero_only",
           "convert_to_tensors"]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

max_seed_value = 4294967295  # 2**32 - 1, as Fabric
min_seed_value = 0

# Fabric's CONVERSION_DTYPES: bool first (a bool is an int), bool -> uint8 because NCCL has no bool.
_CONVERSIONS = ((bool, torch.uint8), (int, torch.int32), (float, torch.float32))


def _tensor_leaves(data: Any) -> list[torch.Tensor]:
    return [x for x in flat_leaves(data) if isinstance(x, torch.Tensor)]


def convert_to_tensors(data: Any, device: Union[str, torch.device, None] = None) -> Any:
    """Fabric's ``convert_to_tensors``: Python bools, ints and floats become tensors; tensors move to ``device``."""
    def leaf(x: Any) -> Any:
        for kind, dtype in _CONVERSIONS:
            if isinstance(x, kind):
                return torch.tensor(x, dtype=dtype, device=device)
        if isinstance(x, torch.Tensor) and device is not None:
            return x.to(device)
        return x
    return map_leaves(data, leaf)


def all_gather(data: Any, group: Optional[Any] = None, sync_grads: bool = False) -> Any:
    """Fabric's ``all_gather``: each tensor leaf stacked over the ranks, ``[world, *shape]``.

    Every rank passes the same structure and shapes. Numbers become tensors first; other leaves
    come back as they are. ``sync_grads=True`` keeps the graph (gradients reach each rank's rows).

    Raises:
        CollectiveMismatchError: on every rank, when ranks pass different structures, dtypes or
            shapes (Fabric hangs or pairs the wrong tensors there).
    """
    data = convert_to_tensors(data)
    if not group_exists("all_gather()"):
        return data
    if sync_grads:
        return map_leaves(data, lambda x: gather(x.unsqueeze(0), sync_grads=True, group=group)
                    if isinstance(x, torch.Tensor) else x)
    leaves = _tensor_leaves(data)
    stacked = iter(gather([t.contiguous().unsqueeze(0) for t in leaves], group=group))
    return map_leaves(data, lambda x: next(stacked) if isinstance(x, torch.Tensor) else x)


def all_reduce(data: Any, group: Optional[Any] = None, reduce_op: Optional[Union[str, Any]] = "mean") -> Any:
    """Fabric's ``all_reduce``: each tensor leaf reduced in place over the ranks and returned.

    ``reduce_op``: ``"mean"`` (default, also ``"avg"``), ``"sum"``, ``"max"``, ``"min"``,
    ``"product"``, ``"band"``, ``"bor"``, ``"bxor"`` (any case), or the matching
    ``torch.distributed.ReduceOp``. Numbers become new tensors first (so a Python number comes back
    as a tensor); other leaves come back as they are.

    Raises:
        AttributeError: an unknown ``reduce_op`` (Fabric's ``getattr(ReduceOp, ...)``), on every
            rank alike before any exchange.
        CollectiveMismatchError: on every rank, when ranks pass different structures, dtypes or shapes.
    """
    data = convert_to_tensors(data)
    if not group_exists("all_reduce()"):
        return data
    op = _op_name(reduce_op)
    leaves = _tensor_leaves(data)
    world = dist.get_world_size(group)
    for t, r in zip(leaves, reduced(leaves, op, group=group)):
        if op == "mean":
            # Fabric: all_reduce(SUM) in place, then copy_(result / world) for integers, div_ for floats.
            t.copy_(r / world) if not torch.is_floating_point(t) else t.copy_(r).div_(world)
        else:
            t.copy_(r)
    return data


def _op_name(reduce_op: Any) -> str:
    """Fabric's reading of ``reduce_op``: "mean"/"avg" or a ReduceOp name in any case, or a ReduceOp."""
    if reduce_op is None:
        return "sum"  # Fabric's _sync_ddp passes None on to torch's default, SUM
    if isinstance(reduce_op, str):
        name = "mean" if reduce_op.lower() in ("mean", "avg") else reduce_op.lower()
    else:
        name = {getattr(dist.ReduceOp, n.upper(), None): n for n in REDUCTIONS if n != "mean"}.get(reduce_op, "")
        name = "mean" if reduce_op == getattr(dist.ReduceOp, "AVG", object()) else name
    if name not in REDUCTIONS:
        raise AttributeError(f"all_reduce(reduce_op={reduce_op!r}): torch.distributed.ReduceOp has no such operation; "
                             f"use 'mean', {', '.join(repr(n) for n in REDUCTIONS if n != 'mean')}")
    return name


def broadcast(obj: Any, src: int = 0) -> Any:
    """Fabric's ``broadcast``: ``src``'s picklable ``obj`` on every rank (``obj`` itself in a world of one)."""
    if not group_exists("broadcast()"):
        return obj
    return broadcast_object(obj, src)


def barrier(name: Optional[str] = None) -> None:
    """Fabric's ``barrier(name)``: wait for every rank (``name`` is for logs, as in Fabric)."""
    if name is not None:
        logger.debug("barrier %r on rank %s", name, get_rank())
    _barrier()


def seed_everything(seed: Optional[int] = None, workers: bool = False, verbose: bool = True) -> int:
    """Fabric's ``seed_everything``: seed ``random``, NumPy and torch; return the seed.

    No ``seed`` reads ``PL_GLOBAL_SEED``; without it the seed is 0 and a ``UserWarning`` says
    "No seed found, seed set to 0" (on rank zero, as Fabric's ``rank_zero_warn``). Sets
    ``PL_GLOBAL_SEED`` and ``PL_SEED_WORKERS`` (``"1"``/``"0"``) for workers and subprocesses.

    Raises:
        ValueError: ``PL_GLOBAL_SEED`` is not an integer, or the seed is outside ``[0, 2**32 - 1]``.
    """
    if seed is None:
        env_seed = os.environ.get("PL_GLOBAL_SEED")
        if env_seed is None:
            seed = 0
            if verbose and is_rank_zero():
                warnings.warn(f"No seed found, seed set to {seed}", UserWarning, stacklevel=2)
        else:
            try:
                seed = int(env_seed)
            except ValueError:
                raise ValueError(f"Invalid seed specified via PL_GLOBAL_SEED: {env_seed!r}") from None
    elif not isinstance(seed, int):
        seed = int(seed)
    if not min_seed_value <= seed <= max_seed_value:
        raise ValueError(f"{seed} is not in bounds, numpy accepts from {min_seed_value} to {max_seed_value}")
    if verbose:
        logger.info("[rank: %s] Seed set to %s", get_rank(), seed)
    _seed_everything(seed)  # random, NumPy, torch; and PL_GLOBAL_SEED
    os.environ["PL_SEED_WORKERS"] = f"{int(workers)}"
    return seed


def reset_seed() -> None:
    """Fabric's ``reset_seed``: seed again with ``PL_GLOBAL_SEED`` and ``PL_SEED_WORKERS``; nothing when unset."""
    seed = os.environ.get("PL_GLOBAL_SEED", None)
    if seed is None:
        return
    workers = os.environ.get("PL_SEED_WORKERS", "0")
    seed_everything(int(seed), workers=bool(int(workers)), verbose=False)


def rank_zero_only(fn: F, default: Optional[Any] = None) -> F:
    """Fabric's ``rank_zero_only``: call ``fn`` on rank zero only, else return ``default``.

    Fabric reads ``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID`` and ``JSM_NAMESPACE_RANK`` once at import
    and keeps the answer in ``rank_zero_only.rank``, which its strategies overwrite; so does this
    module. Here rank zero is ddpdoctor's rule as well (every rank variable that is set, and the
    process group once it exists, say 0; ``LOCAL_RANK`` alone counts only when no global variable
    is set), read at each call: ``fn`` runs only where both say 0.
    Deliberately different: Fabric runs ``fn`` on a non-zero rank whose ``RANK`` is unset but whose
    ``SLURM_PROCID`` says otherwise, or before its strategy sets the rank.
    """
    @functools.wraps(fn)
    def wrapped_fn(*args: Any, **kwargs: Any) -> Any:
        rank = getattr(rank_zero_only, "rank", None)
        if (rank is None or rank == 0) and is_rank_zero():
            return fn(*args, **kwargs)
        return default

    return wrapped_fn  # type: ignore[return-value]


def _fabric_rank() -> int:
    """Fabric's ``_get_rank``: the first of RANK, LOCAL_RANK, SLURM_PROCID, JSM_NAMESPACE_RANK that is set, else 0."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        rank = os.environ.get(key)
        if rank is not None:
            try:
                return int(rank)
            except ValueError:
                continue
    return 0


# As Fabric: set once at import (a strategy overwrites it). It can only keep fn from running, never make
# it run where ddpdoctor's rule says this is not rank zero.
rank_zero_only.rank = getattr(rank_zero_only, "rank", _fabric_rank())  # type: ignore[attr-defined]
