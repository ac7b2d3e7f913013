"""mmengine.dist's collectives, with mmengine's semantics (mmengine 0.10.7).

``all_reduce``, ``all_reduce_dict``, ``broadcast`` and ``broadcast_object_list`` change their input
in place and return None; ``gather(dst=0)`` and ``gather_object(dst=0)`` give the list on ``dst``
only (``[]`` and None elsewhere); ``collect_results`` gives the ordered list on rank 0 and None on
the others. ``all_reduce`` takes ``'sum'`` (default), ``'mean'``, ``'max'``, ``'min'``, ``'product'``,
``'band'``, ``'bor'``, ``'bxor'``; a mean of an integer tensor is the true quotient copied back into
the tensor (rounded toward zero), as mmengine.

Deliberately different, because mmengine hangs, misaligns or corrupts there:

* every collective takes ddpdoctor's agreement step first: ranks with different shapes, dtypes, keys
  or ``dst`` raise the same error on every rank instead of hanging or pairing the wrong calls;
* ``collect_results`` keeps results that are None (mmengine's ``zip_longest`` drops them, shifting
  every later result) and never writes to ``tmpdir`` (the data travels through the process group);
* ``init_local_group`` creates every node's group on every rank, in the same order (mmengine creates
  only its own node's, so ``new_group`` calls pair up wrongly on a multi-node job).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from ddpdoctor.compat.exchange import REDUCTIONS, broadcast_into, group_exists, reduced
from ddpdoctor.compat.mismatch import as_builtin
from ddpdoctor.training import CollectiveMismatchError, broadcast_object
from ddpdoctor.training import barrier as _barrier
from ddpdoctor.training import collect_results as _collect
from ddpdoctor.training import gather as _gather
from ddpdoctor.training import gather_object as _objects
from ddpdoctor.training import get_rank as _get_rank
from ddpdoctor.training import get_world_size as _get_world_size
from ddpdoctor.training import is_rank_zero

__all__ = ["all_reduce", "all_reduce_dict", "broadcast", "broadcast_object_list", "gather", "gather_object",
           "all_gather", "all_gather_object", "collect_results", "init_local_group", "get_local_group",
           "get_local_size", "get_local_rank", "get_rank", "get_world_size", "is_main_process", "barrier"]

_LOCAL_GROUP: Optional[Any] = None


def get_world_size(group: Optional[Any] = None) -> int:
    """mmengine's ``get_world_size``: the group's size (1 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def _alone(group: Optional[Any], what: str) -> bool:
    """True in a world (or group) of one, where mmengine's collectives do nothing.

    Raises:
        NotInitializedError: a launcher started several processes but no process group exists
            (mmengine would do nothing and leave each rank with its own data: silently wrong).
    """
    return not group_exists(what) or dist.get_world_size(group) == 1


def get_rank(group: Optional[Any] = None) -> int:
    """mmengine's ``get_rank``: this process's rank in ``group`` (0 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group)
    return 0


def is_main_process(group: Optional[Any] = None) -> bool:
    """mmengine's ``is_main_process``, under ddpdoctor's rank-zero rule for the default group."""
    return is_rank_zero() if group is None else get_rank(group) == 0


def barrier(group: Optional[Any] = None) -> None:
    """mmengine's ``barrier``: every rank of ``group`` waits for the others."""
    if get_world_size(group) > 1:
        _barrier(group=group)


def all_reduce(data: torch.Tensor, op: str = "sum", group: Optional[Any] = None) -> None:
    """mmengine's ``all_reduce``: ``data`` reduced over the ranks, in place.

    Raises:
        ValueError: an unknown ``op``.
        CollectiveMismatchError: on every rank, when ranks pass different shapes or dtypes.
    """
    if _alone(group, "all_reduce()"):
        return
    name = op.lower() if isinstance(op, str) else op
    if name not in REDUCTIONS:
        raise ValueError(f"reduce op should be one of {', '.join(REDUCTIONS)}, but got {op!r}")
    result = reduced([data], name, group=group)[0]
    # mmengine: true_divide into a new tensor, then copied back into data (an integer mean truncates)
    data.copy_(torch.true_divide(result, get_world_size(group)) if name == "mean" else result)


def all_reduce_dict(data: dict[str, torch.Tensor], op: str = "sum", group: Optional[Any] = None) -> None:
    """mmengine's ``all_reduce_dict``: every value reduced over the ranks; ``data``'s values replaced in place.

    The values are flattened into one tensor in sorted key order (so mixed dtypes promote, as in
    mmengine), reduced with :func:`all_reduce`, and put back in their shapes.
    """
    assert isinstance(data, dict), f"all_reduce_dict takes a dict, got {type(data).__name__}"
    if _alone(group, "all_reduce_dict()"):
        return
    keys = sorted(data.keys())
    shapes = [data[k].shape for k in keys]
    sizes = [data[k].numel() for k in keys]
    flat = torch.cat([data[k].flatten() for k in keys]) if keys else torch.zeros(0)
    all_reduce(flat, op=op, group=group)
    for k, part, shape in zip(keys, torch.split(flat, sizes), shapes):
        data[k] = part.reshape(shape)


def broadcast(data: torch.Tensor, src: int = 0, group: Optional[Any] = None) -> None:
    """mmengine's ``broadcast``: ``src``'s tensor copied into every rank's ``data``, in place.

    Raises:
        CollectiveMismatchError: on every rank, when the ranks' shapes differ (torch's broadcast
            hangs or writes past the end there).
    """
    if _alone(group, "broadcast()"):
        return
    bad = None if isinstance(data, torch.Tensor) else f"TypeError: broadcast takes a tensor, got {type(data).__name__}"
    shape = list(data.shape) if bad is None else None

    def mismatch(table: list[Any]) -> BaseException:
        return CollectiveMismatchError("collective-mismatch", "broadcast(): ranks disagree: " + "; ".join(
            f"rank {r}: shape {s}" for r, s in enumerate(table)), "pass the same shape on every rank")
    broadcast_into([data] if bad is None else [], shape, bad, src, group=group, what="broadcast()",
                   on_mismatch=mismatch)


def broadcast_object_list(data: list[Any], src: int = 0, group: Optional[Any] = None) -> None:
    """mmengine's ``broadcast_object_list``: ``data`` replaced in place by ``src``'s list (same length)."""
    assert isinstance(data, list), f"broadcast_object_list takes a list, got {type(data).__name__}"
    if _alone(group, "broadcast_object_list()"):
        return
    data[:] = broadcast_object(list(data), src, group=group)


def all_gather(data: torch.Tensor, group: Optional[Any] = None) -> list[torch.Tensor]:
    """mmengine's ``all_gather``: a list with every rank's tensor (same shapes), in rank order."""
    if _alone(group, "all_gather()"):
        return [data]
    return list(as_builtin(lambda: _gather(data.unsqueeze(0), group=group)).unbind(0))


def gather(data: torch.Tensor, dst: int = 0, group: Optional[Any] = None) -> list[Optional[torch.Tensor]]:
    """mmengine's ``gather``: on global rank ``dst`` the list of every rank's tensor; ``[]`` on the others."""
    if _alone(group, "gather()"):
        return [data]
    out = as_builtin(lambda: _gather(data.unsqueeze(0), dst=dst, group=group))
    return [] if out is None else list(out.unbind(0))


def all_gather_object(data: Any, group: Optional[Any] = None) -> list[Any]:
    """mmengine's ``all_gather_object``: a list with every rank's picklable ``data``."""
    out = _objects(data, group=group) if get_world_size(group) > 1 else [data]
    assert out is not None
    return out


def gather_object(data: Any, dst: int = 0, group: Optional[Any] = None) -> Optional[list[Any]]:
    """mmengine's ``gather_object``: every rank's ``data`` on ``dst``; None on the others."""
    if _alone(group, "gather_object()"):
        return [data]
    return _objects(data, dst=dst, group=group)


def collect_results(results: list, size: int, device: str = "cpu", tmpdir: Optional[str] = None) -> Optional[list]:
    """mmengine's ``collect_results``: every rank's results in sampler order, cut to ``size``, on rank 0; None elsewhere.

    ``device`` is ``'cpu'``, ``'gpu'`` or ``'npu'``, as mmengine; all travel through the process
    group here, and ``tmpdir`` is accepted but never written to.

    Raises:
        NotImplementedError: another ``device``, as mmengine.
        AssertionError: ``tmpdir`` with ``device='gpu'`` or ``'npu'``, as mmengine.
    """
    if device not in ("gpu", "cpu", "npu"):
        raise NotImplementedError(f"device must be 'cpu' , 'gpu' or 'npu', but got {device}")
    if device in ("gpu", "npu"):
        assert tmpdir is None, f"tmpdir should be None when device is {device}"
    if _alone(None, "collect_results()"):
        return results[:size]
    ordered = _collect(results, size)
    return ordered if _get_rank() == 0 else None


def init_local_group(node_rank: int, num_gpus_per_node: int) -> None:
    """mmengine's ``init_local_group``: the process group of this node's ranks, for :func:`get_local_size` and friends.

    Every rank creates every node's group, in node order, and keeps its own: ``new_group`` must be
    called by all ranks alike.
    """
    global _LOCAL_GROUP
    assert _LOCAL_GROUP is None, "the local process group is already initialized"
    world = _get_world_size()
    nodes = -(-world // num_gpus_per_node)
    for node in range(nodes):
        ranks = list(range(node * num_gpus_per_node, min(world, (node + 1) * num_gpus_per_node)))
        group = dist.new_group(ranks)
        if node == node_rank:
            _LOCAL_GROUP = group


def get_local_group() -> Optional[Any]:
    """mmengine's ``get_local_group``: the group :func:`init_local_group` made (None before)."""
    return _LOCAL_GROUP


def _require_local() -> Any:
    if _LOCAL_GROUP is None:
        raise RuntimeError("Local process group is not created, please use `init_local_group` to setup local "
                           "process group.")
    return _LOCAL_GROUP


def get_local_size() -> int:
    """mmengine's ``get_local_size``: the number of ranks on this node (1 without a process group)."""
    if get_world_size() == 1:
        return 1
    return dist.get_world_size(_require_local())


def get_local_rank() -> int:
    """mmengine's ``get_local_rank``: this rank's index on its node (0 without a process group)."""
    if get_world_size() == 1:
        return 0
    return dist.get_rank(_require_local())
