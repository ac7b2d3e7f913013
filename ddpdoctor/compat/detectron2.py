"""detectron2's ``detectron2.utils.comm``, with detectron2's semantics.

``all_gather(data)`` and ``gather(data, dst=0)`` move any picklable object: a list with one entry per
rank (``gather`` gives it on ``dst`` and ``[]`` on the others); ``reduce_dict`` reduces a dict of
scalar tensors in sorted key order; ``shared_random_seed`` is rank 0's draw on every rank.

Deliberately different, because detectron2 misaligns or corrupts there:

* ``reduce_dict``'s result is right on every rank (detectron2 reduces to rank 0 only and leaves the
  other ranks with partial sums);
* every call takes ddpdoctor's agreement step first, so ranks with different ``dst``, keys or shapes
  raise the same error on every rank instead of hanging;
* ``is_main_process`` is :func:`ddpdoctor.training.is_rank_zero`'s rule.
"""

from __future__ import annotations

import random
from typing import Any, Optional

import torch
import torch.distributed as dist

from ddpdoctor.compat.exchange import group_exists
from ddpdoctor.training import barrier, gather_object, is_rank_zero, reduce

__all__ = ["all_gather", "gather", "reduce_dict", "shared_random_seed", "synchronize", "is_main_process",
           "get_rank", "get_world_size"]


def _on() -> bool:
    return dist.is_available() and dist.is_initialized()


def _alone(what: str) -> bool:
    """True in a world of one, where detectron2's helpers return at once.

    Raises:
        NotInitializedError: a launcher started several processes but no process group exists.
    """
    return not group_exists(what) or dist.get_world_size() == 1


def get_world_size() -> int:
    """detectron2's ``get_world_size``: 1 without a process group."""
    return dist.get_world_size() if _on() else 1


def get_rank() -> int:
    """detectron2's ``get_rank``: 0 without a process group."""
    return dist.get_rank() if _on() else 0


def is_main_process() -> bool:
    """detectron2's ``is_main_process``, under ddpdoctor's rank-zero rule."""
    return is_rank_zero()


def synchronize() -> None:
    """detectron2's ``synchronize``: a barrier among all ranks; nothing in a world of one."""
    if not _alone("synchronize()"):
        barrier()


def all_gather(data: Any, group: Optional[Any] = None) -> list[Any]:
    """detectron2's ``all_gather``: a list with every rank's picklable ``data``, in rank order."""
    if _alone("all_gather()"):
        return [data]
    out = gather_object(data, group=group)
    assert out is not None
    return out


def gather(data: Any, dst: int = 0, group: Optional[Any] = None) -> list[Any]:
    """detectron2's ``gather``: on rank ``dst`` a list with every rank's ``data``; ``[]`` on the others."""
    if _alone("gather()"):
        return [data]
    out = gather_object(data, dst=dst, group=group)
    return [] if out is None else out


def shared_random_seed() -> int:
    """detectron2's ``shared_random_seed``: rank 0's random integer in ``[0, 2**31)``, on every rank.

    Drawn from NumPy's global generator as detectron2, or from Python's when NumPy is not installed.
    """
    try:
        import numpy as np
    except ImportError:
        ints = random.randrange(2**31)
    else:
        ints = int(np.random.randint(2**31))
    return all_gather(ints)[0]


def reduce_dict(input_dict: dict[str, torch.Tensor], average: bool = True) -> dict[str, torch.Tensor]:
    """detectron2's ``reduce_dict``: each scalar tensor summed (``average``: averaged) over the ranks.

    The keys come back sorted, as detectron2's; the values are right on every rank.
    """
    if _alone("reduce_dict()"):
        return input_dict
    with torch.no_grad():
        names = sorted(input_dict.keys())
        values = torch.stack([input_dict[k] for k in names], dim=0)
        values = reduce(values, "mean" if average else "sum")
        return {k: v for k, v in zip(names, values)}
