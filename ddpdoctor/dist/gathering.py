"""Gather and reduce across ranks: uneven shapes, objects, evaluation results, metric dicts.

Every collective here first exchanges a small fixed-size metadata block (a flag, ndim, dtype,
destination, shape), so ranks that disagree all raise the same :class:`CollectiveMismatchError`
instead of one rank crashing and the others hanging in the next collective. The first bytes of each
rank's data ride in the same all-gather, so a small gather is one collective; the rest of a large
one follows by broadcasts into place (gloo) or a padded all-gather (NCCL). Uneven dim-0 sizes thus
work on gloo as well as NCCL, where torch's own all_gather needs equal shapes.
"""

from __future__ import annotations

import itertools
import logging
import math
import pickle
import zlib
from typing import Any, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist

from ddpdoctor.dist.ranks import get_rank, get_world_size, rank_device, require_process_group
from ddpdoctor.errors import DdpdoctorError

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
_MAX_NDIM = 8
_FLAG, _NDIM, _DTYPE, _DST, _SHAPE = 0, 1, 2, 3, 4
_META_LEN = _SHAPE + _MAX_NDIM
_META_BYTES = _META_LEN * 8
_BAD_DST = -2
# Up to this many bytes in all (split over the ranks) ride along with the metadata, so a small
# gather costs one collective; data travels as bytes, so gloo's missing bool/bfloat16 support is moot.
_EAGER_BUDGET, _EAGER_MIN = 128 * 1024, 4096
# Where copies cost as much as the network (CPU), the rest of a large gather goes by one broadcast per
# rank into its place in the output; elsewhere (NCCL) by a padded all-gather.
_BROADCAST_BACKENDS = ("gloo",)


# torch 2.13 renamed all_gather_into_tensor (and warns on the old name); older versions lack the new one.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class CollectiveMismatchError(DdpdoctorError):
    """Ranks passed incompatible arguments to the same collective; raised alike on every rank."""


def _mismatch(what: str, message: str, hint: str) -> CollectiveMismatchError:
    return CollectiveMismatchError("collective-mismatch", f"{what}: {message}", hint)


def _meta(tensor: Optional[torch.Tensor], dst: Optional[int], failed: bool) -> list[int]:
    meta = [-1] * _META_LEN
    meta[_FLAG] = int(failed)
    meta[_DST] = -1 if dst is None else dst
    if tensor is not None:
        meta[_NDIM] = tensor.ndim
        meta[_DTYPE] = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else -1
        if tensor.ndim <= _MAX_NDIM:
            meta[_SHAPE:_SHAPE + tensor.ndim] = tensor.shape
    return meta


def _describe(row: Sequence[int]) -> str:
    dtype = str(_DTYPES[row[_DTYPE]]).replace("torch.", "") if row[_DTYPE] >= 0 else "unsupported-dtype"
    return f"{dtype}{list(row[_SHAPE:_SHAPE + row[_NDIM]])}"


def _exchange(tensor: Optional[torch.Tensor], what: str, dst: Optional[int] = None, failed: bool = False,
              same_shape: bool = False, capacity: int = 0) -> tuple[list[list[int]], torch.Tensor]:
    """All-gather every rank's metadata plus up to ``capacity`` bytes of its data, in one collective.

    Raises the same error on every rank when the metadata disagree. Returns the metadata rows and
    the gathered table (one row of bytes per rank: metadata, then the eager payload).
    """
    world, device = get_world_size(), rank_device()
    buf = _scratch("send", _META_BYTES + capacity, device)
    meta = torch.tensor(_meta(tensor, dst, failed), dtype=torch.int64)
    if capacity and tensor is not None and not failed:
        payload = _as_bytes(tensor, device)
        k = min(capacity, payload.numel())
        buf[_META_BYTES:_META_BYTES + k] = payload[:k]
    buf[:_META_BYTES] = meta.view(torch.uint8)
    table = _scratch("receive", world * buf.numel(), device)
    _all_gather_single(table, buf)
    table = table.view(world, -1)
    rows = table.view(torch.int64)[:, :_META_LEN].tolist()  # capacity is a multiple of 8
    _check(rows, what, same_shape)
    return rows, table


_scratch_buffers: dict[tuple[str, int, torch.device], torch.Tensor] = {}


def _scratch(role: str, numel: int, device: torch.device) -> torch.Tensor:
    """A reused byte buffer for the eager exchange (fresh allocations cost more than a small collective).

    Results never alias these buffers: whatever leaves this module is copied out first.
    """
    key = (role, numel, device)
    buf = _scratch_buffers.get(key)
    if buf is None:
        if len(_scratch_buffers) > 8:
            _scratch_buffers.clear()
        buf = _scratch_buffers[key] = torch.empty(numel, dtype=torch.uint8, device=device)
    return buf


def _check(rows: list[list[int]], what: str, same_shape: bool) -> None:
    bad = [r for r, row in enumerate(rows) if row[_FLAG]]
    if bad:
        raise _mismatch(what, f"rank(s) {bad} failed before the collective (see their tracebacks)",
                        "fix the error on those ranks; the others stopped instead of waiting for them")
    bad_dst = [r for r, row in enumerate(rows) if row[_DST] == _BAD_DST]
    if bad_dst:
        raise _mismatch(what, f"rank(s) {bad_dst} passed a dst that is not a rank of this world "
                        f"(0 to {len(rows) - 1})", "pass the same valid dst on every rank, or dst=None")
    if len({row[_DST] for row in rows}) > 1:
        raise _mismatch(what, "ranks passed different dst: " + ", ".join(
            f"rank {r}: {None if row[_DST] < 0 else row[_DST]}" for r, row in enumerate(rows)),
            "pass the same dst on every rank")
    shapes = _Shapes(rows)
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


class _Shapes:
    """Every rank's dtype and shape, formatted only when an error needs them."""

    def __init__(self, rows: list[list[int]]) -> None:
        self.rows = rows

    def __str__(self) -> str:
        return ", ".join(f"rank {r}: {_describe(row)}" for r, row in enumerate(self.rows))



def _as_bytes(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor.detach().to(device).contiguous().view(-1).view(torch.uint8)


def _eager_capacity(world: int) -> int:
    """The most bytes per rank that travel with the metadata: small gathers then take one collective."""
    return max(_EAGER_MIN, _EAGER_BUDGET // world // 8 * 8)


# The longest payload of the previous gather. Every rank sees the same gathered metadata in the same
# order of calls, so every rank derives the same eager size from it: repeated gathers of a few
# hundred bytes do not move the full eager budget each time.
_last_longest: Optional[int] = None


def _next_capacity(world: int) -> int:
    most = _eager_capacity(world)
    if _last_longest is None:
        return most
    return min(most, max(_EAGER_MIN, 1 << max(0, _last_longest - 1).bit_length()))


def _gather_bytes(tensor: torch.Tensor, what: str, dst: Optional[int] = None,
                  failed: bool = False) -> tuple[list[int], Optional[torch.Tensor]]:
    """Every rank's rows of ``tensor`` back to back, as bytes, with each rank's row count.

    Metadata and the first bytes of every rank travel in one all-gather; when some rank has more,
    the rest follows (gloo: one broadcast per rank straight into the output, so neither padding
    nor compaction; other backends: a padded all-gather or gather). Returns (rows per rank, bytes),
    the bytes being None on ranks other than ``dst``.
    """
    global _last_longest
    world, rank, device = get_world_size(), get_rank(), rank_device()
    cap = _next_capacity(world)
    try:
        rows, table = _exchange(tensor, what, dst, failed, capacity=cap)
    except CollectiveMismatchError:
        _last_longest = None  # identical on every rank: they all raise here
        raise
    sizes = [row[_SHAPE] for row in rows]
    row_bytes = tensor.element_size() * math.prod(rows[0][_SHAPE + 1:_SHAPE + rows[0][_NDIM]])
    lengths = [n * row_bytes for n in sizes]
    _last_longest = max(lengths)
    offsets = [0, *itertools.accumulate(lengths)][:-1]
    receives = dst is None or rank == dst
    if not receives:
        out = None
    elif max(lengths) <= cap:  # everything came with the metadata: one copy out of the table
        out = torch.cat([table[r, _META_BYTES:_META_BYTES + lengths[r]] for r in range(world)])
    else:
        out = torch.empty(sum(lengths), dtype=torch.uint8, device=device)
        for r in range(world):
            k = min(cap, lengths[r])
            out[offsets[r]:offsets[r] + k] = table[r, _META_BYTES:_META_BYTES + k]
    if max(lengths) > cap:
        rest = _as_bytes(tensor, device)[cap:]
        if dst is None and dist.get_backend() in _BROADCAST_BACKENDS:
            if rest.numel():
                out[offsets[rank] + cap:offsets[rank] + lengths[rank]] = rest
            for r in range(world):  # one at a time: concurrent gloo ops can deadlock on its worker threads
                if lengths[r] > cap:
                    dist.broadcast(out[offsets[r] + cap:offsets[r] + lengths[r]], src=r)
        else:
            _padded_rest(rest, out, lengths, offsets, cap, dst)
    return sizes, out


def _padded_rest(rest: torch.Tensor, out: Optional[torch.Tensor], lengths: list[int], offsets: list[int],
                 cap: int, dst: Optional[int]) -> None:
    """The bytes beyond the eager part, padded to the longest and all-gathered (or gathered to dst)."""
    world, device = len(lengths), rest.device
    most = max(lengths) - cap
    mine = torch.empty(most, dtype=torch.uint8, device=device)
    mine[:rest.numel()] = rest
    buf = torch.empty(world * most, dtype=torch.uint8, device=device) if out is not None else None
    if dst is None:
        _all_gather_single(buf, mine)
    else:
        dist.gather(mine, list(buf.chunk(world)) if buf is not None else None, dst=dst)
    if out is not None:
        for r in range(world):
            if lengths[r] > cap:
                out[offsets[r] + cap:offsets[r] + lengths[r]] = buf[r * most:r * most + lengths[r] - cap]


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
        ValueError: in a world of one, ``dst`` is not 0 or None.
        NotInitializedError: several processes were launched but no process group exists.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"gather() takes a torch.Tensor, got {type(tensor).__name__}; use gather_object() "
                        "for other values")
    world = get_world_size()
    valid_dst = dst is None or (not isinstance(dst, bool) and isinstance(dst, int) and 0 <= dst < world)
    if tensor.ndim == 0:
        tensor = tensor.reshape(1)
    if not require_process_group("gather()"):
        if not valid_dst:
            raise ValueError(f"gather(dst={dst!r}): the world has ranks 0 to {world - 1}, or pass dst=None")
        return tensor.detach().clone()
    # A bad dst on one rank is reported on every rank, after the metadata exchange, never by a lone raise.
    sizes, out = _gather_bytes(tensor, "gather()", dst if valid_dst else _BAD_DST)
    if out is None:
        return None
    return out.view(tensor.dtype).view((sum(sizes),) + tuple(tensor.shape[1:])).to(tensor.device)


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
        sizes, out = _gather_bytes(payload, "gather_object()", failed=failed is not None)
    except CollectiveMismatchError:
        if failed is not None:
            raise TypeError(f"gather_object(): this rank's {type(obj).__name__} cannot be pickled: {failed}; "
                            "pass picklable values") from failed
        raise
    flat = out.detach().reshape(-1).cpu()
    buf = bytearray(flat.numel())  # bytes without numpy: a CPU torch wheel does not install it
    if buf:
        torch.frombuffer(buf, dtype=torch.uint8).copy_(flat)
    data = bytes(buf)
    offsets = [0, *itertools.accumulate(sizes)]
    return [pickle.loads(data[offsets[r]:offsets[r + 1]]) for r in range(len(sizes))]


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
    not. With ``drop_last=True`` the sampler never yields ``len(dataset) % world_size`` samples
    (the tail of its order, shuffled or not); they are missing from the result and a warning on
    rank 0 says how many.

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
    lines = [f"rank {r} lacks {', '.join(sorted(set(union) - set(mine)))}" for r, mine in enumerate(everyone)
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
    _exchange(tensor, "all_reduce_mean()", same_shape=True)
    work = tensor.detach().to(rank_device(), dtype, copy=True)
    dist.all_reduce(work)
    work /= get_world_size()
    return work.to(tensor.device)
