"""An in-place broadcast of tensors that checks the ranks' shapes first: accelerate's and mmengine's ``broadcast``.

torch's ``broadcast`` copies ``src``'s bytes into every rank's tensor without checking that the
shapes agree: gloo raises on some ranks and hangs others, NCCL may write past the end. Here every
rank sends its shapes (and ``src`` its values) in one ddpdoctor ``gather_object``, so every rank sees
the same table and either copies ``src``'s values or raises the same error.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from ddpdoctor.compat.mismatch import CollectiveTypeError, CollectiveValueError, as_builtin
from ddpdoctor.training import gather, gather_object, reduce
from ddpdoctor.training.agreement import group_ranks
from ddpdoctor.training.ranks import get_rank, require_process_group

__all__ = ["REDUCTIONS", "broadcast_into", "group_exists", "reduced"]

#: torch's ReduceOp names, lower case, as Fabric and mmengine spell them (mean: a sum the caller divides).
REDUCTIONS = ("sum", "mean", "max", "min", "product", "band", "bor", "bxor")
_BITWISE = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}


def reduced(tensors: Sequence[torch.Tensor], op: str, *, group: Any = None) -> list[torch.Tensor]:
    """Each tensor reduced over the ranks with ``op`` (one of :data:`REDUCTIONS`; ``"mean"`` gives the sum).

    Sum, max and min take ddpdoctor's ``reduce`` (exact integer sums); product and the bitwise ones
    gather the ranks' tensors (every rank passes the same shapes) and combine them in rank order.

    Raises:
        CollectiveMismatchError: on every rank, when ranks pass different shapes or dtypes (a
            ``TypeError`` as well when some rank's input is not a tensor).
    """
    if op in ("sum", "mean", "max", "min"):
        return list(as_builtin(lambda: reduce(list(tensors), "sum" if op == "mean" else op, group=group)))
    stacked = as_builtin(lambda: gather([t.unsqueeze(0) for t in tensors], group=group))
    if op == "product":
        return [s.prod(dim=0) for s in stacked]
    return [functools.reduce(_BITWISE[op], s.unbind(0)) for s in stacked]


def group_exists(what: str) -> bool:
    """True when a process group exists; False in a world of one, where the peers' helpers return at once.

    Raises:
        NotInitializedError: a launcher started several processes but no process group exists (the
            peer would have made one; returning this rank's own data would be silently wrong).
    """
    if dist.is_available() and dist.is_initialized():
        return True
    require_process_group(what)
    return False


def broadcast_into(leaves: Sequence[torch.Tensor], shapes: Any, bad: Optional[str], src: int, *, group: Any = None,
                   what: str, on_mismatch: Callable[[list[Any]], BaseException]) -> None:
    """Copy global rank ``src``'s ``leaves`` into every rank's ``leaves``, in place.

    Args:
        leaves: this rank's tensors, in a fixed order.
        shapes: this rank's description of its input (compared between ranks).
        bad: why this rank's input is unusable, as ``"TypeError: ..."``, or None.
        what: the helper's name, for the messages.
        on_mismatch: builds the error for shapes that differ, from every rank's ``shapes``.

    Raises:
        CollectiveTypeError / CollectiveValueError: on every rank alike, when some rank's input is
            unusable (``bad``) or ``src`` is not a rank of the group; the class of the bad ranks' reasons.
        what ``on_mismatch`` builds, on every rank alike, when the shapes differ.
    """
    ranks = group_ranks(group)
    if src not in ranks:
        bad = bad or f"ValueError: src={src} is not a rank of the group (ranks {ranks})"
    mine = (shapes, bad, [t.detach().cpu() for t in leaves] if get_rank() == src and bad is None else None)
    table = gather_object(mine, group=group)
    assert table is not None
    errors = [(ranks[i], row[1]) for i, row in enumerate(table) if row[1] is not None]
    if errors:
        def fails(error: str) -> bool:
            return error.startswith("ValueError")
        cls = CollectiveValueError if all(map(fails, (e for _, e in errors))) else CollectiveTypeError
        raise cls("collective-input", f"{what}: bad input on rank(s) {[r for r, _ in errors]}: "
                  + "; ".join(f"rank {r}: {e}" for r, e in errors),
                  "fix the input on those ranks; every rank stopped here instead of waiting for them")
    if any(row[0] != table[0][0] for row in table):
        raise on_mismatch([row[0] for row in table])
    values = table[ranks.index(src)][2]
    for t, value in zip(leaves, values):
        t.copy_(value)
