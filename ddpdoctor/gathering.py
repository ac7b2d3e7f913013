"""Gather and reduce across ranks: uneven shapes, objects, evaluation results, metric dicts.

Every collective here first exchanges a small fixed-size metadata tensor (a flag, ndim, dtype,
destination, shape), so ranks that disagree all raise the same :class:`CollectiveMismatchError`
instead of one rank crashing and the others hanging in the next collective. Uneven dim-0 sizes are
padded to the largest and trimmed afterwards, which works on gloo as well as NCCL.
"""

from __future__ import annotations

import logging
import pickle
import zlib
from typing import Any, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist

from .errors import DdpdoctorError
from .ranks import get_rank, get_world_size, rank_device, require_process_group

__all__ = [
    "CollectiveMismatchError",
    "gather",
    "all_gather",
    "gather_object",
    "gather_for_metrics",
    "collect_results",
    "reduce_dict",
    "all_reduce_mean",
]

logger = logging.getLogger(__name__)

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
           torch.int32, torch.int64, torch.uint8, torch.bool)
# gloo has no bool or bfloat16 collectives: move the same bits as an integer type of equal size.
_WIRE = {torch.bool: torch.uint8, torch.bfloat16: torch.float16, torch.int16: torch.float16}
_MAX_NDIM = 8
_FLAG, _NDIM, _DTYPE, _DST, _SHAPE = 0, 1, 2, 3, 4
_META_LEN = _SHAPE + _MAX_NDIM


# torch 2.13 renamed all_gather_into_tensor (and warns on the old name); older versions lack the new one.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class CollectiveMismatchError(DdpdoctorError):
    """Ranks passed incompatible arguments to the same collective; raised alike on every rank."""


def _mismatch(what: str, message: str, hint: str) -> CollectiveMismatchError:
    return CollectiveMismatchError("collective-mismatch", f"{what}: {message}", hint)


def _meta(tensor: Optional[torch.Tensor], dst: Optional[int], failed: bool) -> torch.Tensor:
    meta = torch.full((_META_LEN,), -1, dtype=torch.int64)
    meta[_FLAG] = int(failed)
    meta[_DST] = -1 if dst is None else dst
    if tensor is not None:
        meta[_NDIM] = tensor.ndim
        meta[_DTYPE] = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else -1
        if tensor.ndim <= _MAX_NDIM:
            meta[_SHAPE:_SHAPE + tensor.ndim] = torch.tensor(tensor.shape, dtype=torch.int64)
    return meta


def _describe(row: Sequence[int]) -> str:
    dtype = str(_DTYPES[row[_DTYPE]]).replace("torch.", "") if row[_DTYPE] >= 0 else "unsupported-dtype"
    return f"{dtype}{list(row[_SHAPE:_SHAPE + row[_NDIM]])}"


def _exchange_meta(tensor: Optional[torch.Tensor], what: str, dst: Optional[int] = None,
                   failed: bool = False, same_shape: bool = False) -> list[list[int]]:
    """All-gather every rank's metadata and raise the same error on every rank when they disagree."""
    world, device = get_world_size(), rank_device()
    out = torch.empty(world * _META_LEN, dtype=torch.int64, device=device)
    _all_gather_single(out, _meta(tensor, dst, failed).to(device))
    rows = out.view(world, _META_LEN).tolist()
    bad = [r for r, row in enumerate(rows) if row[_FLAG]]
    if bad:
        raise _mismatch(what, f"rank(s) {bad} failed before the collective (see their tracebacks)",
                        "fix the error on those ranks; the others stopped instead of waiting for them")
    if len({row[_DST] for row in rows}) > 1:
        raise _mismatch(what, "ranks passed different dst: " + ", ".join(
            f"rank {r}: {None if row[_DST] < 0 else row[_DST]}" for r, row in enumerate(rows)),
            "pass the same dst on every rank")
    shapes = ", ".join(f"rank {r}: {_describe(row)}" for r, row in enumerate(rows))
    for r, row in enumerate(rows):
        if row[_DTYPE] < 0 or row[_NDIM] > _MAX_NDIM:
            raise _mismatch(what, f"rank {r} passed an unsupported tensor ({shapes})",
                            f"use one of {[str(d).replace('torch.', '') for d in _DTYPES]} "
                            f"with at most {_MAX_NDIM} dimensions")
    if len({(row[_NDIM], row[_DTYPE]) for row in rows}) > 1:
        raise _mismatch(what, f"ranks disagree on ndim or dtype ({shapes})",
                        "pass tensors of the same dtype and number of dimensions on every rank")
    first = 0 if same_shape else 1
    if len({tuple(row[_SHAPE + first:_SHAPE + row[_NDIM]]) for row in rows}) > 1:
        which = "shape" if same_shape else "shape beyond dim 0"
        raise _mismatch(what, f"ranks disagree on {which} ({shapes})",
                        f"pass tensors of the same {which} on every rank")
    return rows


def _gather_parts(tensor: torch.Tensor, what: str, dst: Optional[int] = None,
                  failed: bool = False) -> Optional[list[torch.Tensor]]:
    """Every rank's tensor (on this rank's collective device), or None on ranks other than ``dst``."""
    rows = _exchange_meta(tensor, what, dst, failed)
    world, rank, device = get_world_size(), get_rank(), rank_device()
    sizes = [row[_SHAPE] for row in rows]
    most = max(sizes)
    wire = _WIRE.get(tensor.dtype, tensor.dtype)
    local = tensor.detach().to(device).contiguous().view(wire)
    trailing = tuple(local.shape[1:])
    if most == 0:
        return None if dst is not None and rank != dst else [local.view(tensor.dtype)] * world
    if local.shape[0] < most:
        padded = torch.zeros((most,) + trailing, dtype=wire, device=device)
        padded[: local.shape[0]] = local
        local = padded
    if dst is None:
        out = torch.empty((world * most,) + trailing, dtype=wire, device=device)
        _all_gather_single(out, local)
    else:
        out = torch.empty((world * most,) + trailing, dtype=wire, device=device) if rank == dst else None
        dist.gather(local, list(out.chunk(world)) if out is not None else None, dst=dst)
        if out is None:
            return None
    out = out.view(tensor.dtype)
    return [out[r * most: r * most + sizes[r]] for r in range(world)]


def gather(tensor: torch.Tensor, *, dst: Optional[int] = None) -> Optional[torch.Tensor]:
    """Concatenate every rank's ``tensor`` along dim 0, in rank order, on every rank or on ``dst``.

    Dim 0 may differ between ranks, and may be 0 on some. A 0-d tensor counts as one row.
    The result is detached and on ``tensor``'s device.

    Args:
        tensor: this rank's rows; every rank must pass the same dtype and shape beyond dim 0.
        dst: the one rank that receives the result (others get None); None for every rank.

    Raises:
        CollectiveMismatchError: on every rank, when ranks disagree on ndim, dtype, trailing
            shape or ``dst``; names each rank's dtype and shape.
        ValueError: ``dst`` is not a rank of this job.
        NotInitializedError: several processes were launched but no process group exists.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"gather() takes a torch.Tensor, got {type(tensor).__name__}; use gather_object() "
                        "for other values")
    world = get_world_size()
    if dst is not None and (isinstance(dst, bool) or not isinstance(dst, int) or not 0 <= dst < world):
        raise ValueError(f"gather(dst={dst!r}): the world has ranks 0 to {world - 1}, or pass dst=None")
    if tensor.ndim == 0:
        tensor = tensor.reshape(1)
    if not require_process_group("gather()"):
        return tensor.detach().clone()
    parts = _gather_parts(tensor, "gather()", dst)
    if parts is None:
        return None
    if all(p.shape[0] == parts[0].shape[0] for p in parts) and parts[0].numel() > 0:
        # No padding: the parts are back-to-back views of one buffer, so skip the copy.
        base = parts[0]
        whole = torch.as_strided(base, (base.shape[0] * len(parts),) + tuple(base.shape[1:]), base.stride())
    else:
        whole = torch.cat(parts)
    return whole.to(tensor.device)


#: detectron2's and accelerate's name for the all-ranks form.
all_gather = gather


def gather_object(obj: Any) -> list[Any]:
    """A list with every rank's picklable ``obj``, in rank order (``[obj]`` in a world of one).

    Raises:
        CollectiveMismatchError: on every rank, when some rank's ``obj`` cannot be pickled
            (that rank also raises its own pickling error).
        NotInitializedError: several processes were launched but no process group exists.
    """
    if not require_process_group("gather_object()"):
        return [obj]
    try:
        payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        failed = None
    except Exception as exc:  # noqa: BLE001 - tell the other ranks before raising
        payload, failed = torch.empty(0, dtype=torch.uint8), exc
    try:
        parts = _gather_parts(payload, "gather_object()", failed=failed is not None)
    except CollectiveMismatchError:
        if failed is not None:
            raise TypeError(f"gather_object(): this rank's {type(obj).__name__} cannot be pickled: {failed}; "
                            "pass picklable values") from failed
        raise
    assert parts is not None
    return [pickle.loads(p.cpu().numpy().tobytes()) for p in parts]


def collect_results(results: Sequence[Any], size: int) -> list[Any]:
    """mmengine's ``collect_results``: every rank's list, interleaved back into sampler order, cut to ``size``.

    Prefer :func:`gather_for_metrics`, which also works for shuffled samplers.
    """
    parts = gather_object(list(results))
    return [item for group in zip(*parts) for item in group][:size]


def gather_for_metrics(values: Union[torch.Tensor, Sequence[Any]], sampler: Any) -> Union[torch.Tensor, list[Any]]:
    """The whole dataset's results in dataset order on every rank, padding duplicates removed.

    Give each rank's per-sample results (a tensor with one row per sample, or a list; None items
    are kept) in the order its ``DistributedSampler`` yielded them, in the same epoch. The result
    equals a single-process evaluation of the dataset, bit for bit, whether the sampler shuffles or
    not. With ``drop_last=True`` the sampler never yields the last ``len(dataset) % world_size``
    samples; they are missing from the result and a warning on rank 0 says how many.

    Args:
        values: this rank's results, one per index the sampler yielded.
        sampler: this rank's sampler (``DistributedSampler`` or any sampler whose iteration gives
            the dataset indices this rank evaluated).

    Raises:
        CollectiveMismatchError: on every rank, when some rank's number of results differs from
            its sampler's length, its sampler was built for another rank or world size, or ranks
            mix tensors and lists.
    """
    indices = list(iter(sampler))
    is_tensor = isinstance(values, torch.Tensor)
    if is_tensor and values.ndim == 0:
        raise ValueError("gather_for_metrics(): values is a 0-d tensor; pass one row per sample")
    if not is_tensor:
        values = list(values)
    dataset = getattr(sampler, "dataset", None)
    size = len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None
    world = get_world_size()
    infos = gather_object((len(indices), len(values), is_tensor, getattr(sampler, "num_replicas", world),
                           getattr(sampler, "rank", None)))
    what = "gather_for_metrics()"
    for r, (n_idx, n_val, _, replicas, srank) in enumerate(infos):
        if replicas != world or (srank is not None and srank != r):
            raise _mismatch(what, f"rank {r}'s sampler has num_replicas={replicas}, rank={srank} in a world "
                            f"of {world}", "build the DistributedSampler after init_process_group, or pass "
                            "num_replicas and rank that match")
        if n_idx != n_val:
            raise _mismatch(what, f"rank {r} has {n_val} results but its sampler yielded {n_idx} indices",
                            "pass one result per sample in sampler order (DataLoader(drop_last=False), "
                            "and the same sampler epoch)")
    if len({info[2] for info in infos}) > 1:
        raise _mismatch(what, "some ranks passed tensors and others lists: " + ", ".join(
            f"rank {r}: {'tensor' if info[2] else 'list'}" for r, info in enumerate(infos)),
            "pass the same kind of values on every rank")
    all_idx = gather(torch.tensor(indices, dtype=torch.int64))
    assert all_idx is not None
    order = torch.argsort(all_idx, stable=True)
    ranked = all_idx[order]
    first = torch.ones_like(ranked, dtype=torch.bool)
    first[1:] = ranked[1:] != ranked[:-1]
    keep = order[first]
    if size is not None and int(first.sum()) < size and get_rank() == 0:
        logger.warning("gather_for_metrics: the sampler never yielded %s of %s samples (drop_last=True?); "
                       "evaluate with DistributedSampler(drop_last=False), the padding is removed here",
                       size - int(first.sum()), size)
    if is_tensor:
        whole = gather(values)
        assert whole is not None
        return whole[keep.to(whole.device)]
    flat = [item for part in gather_object(values) for item in part]
    return [flat[p] for p in keep.tolist()]


def _fingerprint(d: Mapping[Any, Any], keys: list[Any]) -> tuple[int, int]:
    text = ";".join(f"{k!r}:{torch.as_tensor(d[k]).numel()}" for k in keys)
    return len(keys), zlib.crc32(text.encode())


def reduce_dict(d: Mapping[Any, Any], average: bool = True) -> dict[Any, Any]:
    """Sum (or average) a dict of numbers or tensors over all ranks, in one flattened all_reduce.

    Results are valid on every rank. Tensors come back as tensors (floating dtypes kept; integer
    tensors become floats when averaged), Python numbers as Python numbers.

    Raises:
        CollectiveMismatchError: on every rank, when ranks have different keys or shapes; names
            the keys each rank lacks.
        NotInitializedError: several processes were launched but no process group exists.
    """
    if not isinstance(d, Mapping):
        raise TypeError(f"reduce_dict() takes a dict, got {type(d).__name__}")
    keys = sorted(d, key=repr)
    distributed = require_process_group("reduce_dict()")
    device = rank_device()
    if distributed:
        count, crc = _fingerprint(d, keys)
        world = get_world_size()
        out = torch.empty(world * 2, dtype=torch.int64, device=device)
        _all_gather_single(out, torch.tensor([count, crc], dtype=torch.int64, device=device))
        if len(set(map(tuple, out.view(world, 2).tolist()))) > 1:
            _raise_key_mismatch(d, keys)
    tensors = [torch.as_tensor(d[k]) for k in keys]
    flat = torch.cat([t.detach().reshape(-1).to(device, torch.float64) for t in tensors]) if keys else None
    if distributed and flat is not None:
        dist.all_reduce(flat)
    if flat is not None and average:
        flat /= get_world_size()
    result, offset = {}, 0
    for k, t in zip(keys, tensors):
        piece = flat[offset: offset + t.numel()].reshape(t.shape)
        offset += t.numel()
        value = d[k]
        if isinstance(value, torch.Tensor):
            dtype = value.dtype if value.is_floating_point() or not average else torch.get_default_dtype()
            result[k] = piece.to(value.device, dtype)
        elif isinstance(value, int) and not isinstance(value, bool) and not average:
            result[k] = int(piece.item())
        else:
            result[k] = piece.item() if piece.numel() == 1 else piece.tolist()
    return result


def _raise_key_mismatch(d: Mapping[Any, Any], keys: list[Any]) -> None:
    everyone = gather_object({repr(k): torch.as_tensor(d[k]).numel() for k in keys})
    union = sorted(set().union(*everyone))
    lines = [f"rank {r} lacks {sorted(set(union) - set(mine))}" for r, mine in enumerate(everyone)
             if set(mine) != set(union)]
    if not lines:
        lines = [f"key {k} has sizes {[mine[k] for mine in everyone]}" for k in union
                 if len({mine[k] for mine in everyone}) > 1]
    raise _mismatch("reduce_dict()", "ranks passed different keys or sizes: " + "; ".join(lines),
                    "log the same keys with the same shapes on every rank (use 0 for a missing value)")


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """The mean of ``tensor`` over all ranks, as a new tensor on every rank (floats for integer input).

    Raises:
        CollectiveMismatchError: on every rank, when ranks pass different shapes or dtypes.
        NotInitializedError: several processes were launched but no process group exists.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"all_reduce_mean() takes a torch.Tensor, got {type(tensor).__name__}")
    dtype = tensor.dtype if tensor.is_floating_point() else torch.get_default_dtype()
    if not require_process_group("all_reduce_mean()"):
        return tensor.detach().to(dtype, copy=True)
    _exchange_meta(tensor, "all_reduce_mean()", same_shape=True)
    work = tensor.detach().to(rank_device(), dtype, copy=True)
    dist.all_reduce(work)
    work /= get_world_size()
    return work.to(tensor.device)
