"""Gather and reduce across ranks: uneven shapes, nested structures, objects, evaluation results, metrics.

Every helper here takes the agreement step of :mod:`ddpdoctor.training.agreement` first: one small
all-gather in which the ranks compare what they are about to do, so ranks that disagree (or whose
input is bad) all raise the same :class:`CollectiveMismatchError` and the next call starts aligned.
The first bytes of each rank's data ride in that same all-gather, so a small gather or reduction is
one collective in all; the rest of a large one follows by broadcasts into place (gloo) or a padded
all-gather (NCCL), and large reductions by one all_reduce per dtype.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import math
import pickle
import weakref
from numbers import Number
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist

from torch.utils.data import DistributedSampler

from ddpdoctor.training.agreement import (DEFAULT_TIMEOUT, Agreement, CollectiveMismatchError, agree, check_timeout,
                        group_ranks, group_state, next_capacity)
from ddpdoctor.training.ranks import rank_device, require_process_group

__all__ = [
    "gather",
    "all_gather",
    "gather_object",
    "broadcast_object",
    "gather_all_tensors",
    "gather_for_metrics",
    "collect_results",
    "pad_across_processes",
    "reduce",
    "reduce_dict",
    "all_reduce_mean",
    "all_reduce_params",
]

logger = logging.getLogger(__name__)

# Where copies cost as much as the network (CPU), the rest of a large gather goes by one broadcast per
# rank into its place in the output; elsewhere (NCCL) by a padded all-gather.
_BROADCAST_BACKENDS = ("gloo",)
_REDUCTIONS = ("sum", "mean", "max", "min")


def _mismatch(what: str, message: str, hint: str) -> CollectiveMismatchError:
    return CollectiveMismatchError("collective-mismatch", f"{what}: {message}", hint)


# --- structures ------------------------------------------------------------------------------------

def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _leaves(obj: Any, what: str, numbers: bool = False) -> list[Any]:
    """The tensors (and with ``numbers`` Python numbers) of a nested dict/list/tuple, in a fixed order."""
    out: list[Any] = []

    def walk(x: Any) -> None:
        if isinstance(x, _Unreducible):
            raise x.error
        if isinstance(x, torch.Tensor):
            if x.layout != torch.strided or x.is_quantized:
                raise TypeError(f"{what}: {x.layout} / quantized tensors are not supported; pass dense tensors")
            out.append(x)
        elif numbers and isinstance(x, Number) and isinstance(x, (bool, int, float)):
            out.append(x)
        elif isinstance(x, Mapping):
            for k in sorted(x, key=repr):
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:
            kinds = "tensors or numbers" if numbers else "tensors"
            raise TypeError(f"{what} takes {kinds} (or dicts, lists, tuples of them), got {type(x).__name__}"
                            + ("" if numbers else "; use gather_object() for other values"))
    walk(obj)
    return out


def _rebuild(obj: Any, leaves: Iterable[Any]) -> Any:
    it = iter(leaves)

    def walk(x: Any) -> Any:
        if isinstance(x, (torch.Tensor, bool, int, float)):
            return next(it)
        if isinstance(x, Mapping):
            done = {k: walk(x[k]) for k in sorted(x, key=repr)}
            return type(x)((k, done[k]) for k in x) if type(x) is not dict else {k: done[k] for k in x}
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
            return type(x)(*[walk(v) for v in x])
        return type(x)(walk(v) for v in x)
    return walk(obj)


def _describe(obj: Any, leaf: Callable[[Any], str]) -> str:
    if isinstance(obj, (torch.Tensor, bool, int, float)):
        return leaf(obj)
    if isinstance(obj, Mapping):
        return "{" + ", ".join(f"{k!r}: {_describe(obj[k], leaf)}" for k in sorted(obj, key=repr)) + "}"
    inner = ", ".join(_describe(v, leaf) for v in obj)
    return f"({inner})" if isinstance(obj, tuple) else f"[{inner}]"


def _paths(obj: Any, leaf: Callable[[Any], str]) -> Optional[dict[str, str]]:
    """{path: description} of a nested structure's leaves (None for a lone leaf: its text says it all)."""
    if not isinstance(obj, (Mapping, list, tuple)):
        return None
    out: dict[str, str] = {}

    def walk(x: Any, path: str) -> None:
        if isinstance(x, Mapping):
            for k in sorted(x, key=repr):
                walk(x[k], f"{path}.{k}" if isinstance(k, str) and k.isidentifier() else f"{path}[{k!r}]")
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]")
        else:
            out[path.lstrip(".") or "input"] = leaf(x)
    walk(obj, "")
    return out


def _shape_text(t: Any, dim0: bool = True) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    shape = [str(s) for s in t.shape]
    if shape and not dim0:
        shape[0] = "*"
    return f"{_dtype_name(t.dtype)}[{', '.join(shape)}]"


def _as_bytes(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor.detach().to(device).contiguous().view(-1).view(torch.uint8)


def _to_bytes(t: torch.Tensor) -> bytes:
    """A uint8 tensor's bytes, in one copy and without NumPy."""
    t = t.cpu().contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel()) if t.numel() else b""


def _is_mine(rank_list: list[int], dst: Optional[int]) -> bool:
    return dst is None or dist.get_rank() == dst


def _check_dst(what: str, dst: Any, ranks: list[int], name: str = "dst") -> None:
    if dst is None and name == "dst":
        return
    if isinstance(dst, bool) or not isinstance(dst, int) or dst not in ranks:
        raise ValueError(f"{what}: {name}={dst!r} is not a rank of this group ({_ranks_text(ranks)}); pass the "
                         f"same valid {name} on every rank" + (", or dst=None" if name == "dst" else ""))


def _ranks_text(ranks: list[int]) -> str:
    if ranks == list(range(len(ranks))):
        return f"ranks 0 to {len(ranks) - 1}"
    return f"ranks {ranks}"


def _local_world(what: str, group: Any) -> Optional[list[int]]:
    """The group's global ranks when a collective must run; None in a world (or group) of one."""
    if not require_process_group(what):
        return None
    ranks = group_ranks(group)
    if dist.get_rank() not in ranks:
        raise ValueError(f"{what}: rank {dist.get_rank()} is not a member of the group (ranks {ranks}); call it only "
                         f"on the group's ranks")
    return ranks if len(ranks) > 1 else None


# --- the byte gather everything else is built on ---------------------------------------------------

def _gather_bytes(what: str, payload: Optional[torch.Tensor], *, group: Any, timeout: float, ranks: list[int],
                  digest: str, text: str, failed: Optional[BaseException] = None, rows: int = 0,
                  dst: Optional[int] = None, detail: Optional[dict[str, str]] = None,
                  ) -> tuple[Agreement, list[int], Optional[torch.Tensor]]:
    """Every rank's ``payload`` bytes back to back, with each rank's length and ``rows``.

    The agreement and the first bytes travel in one all-gather; when some rank has more, the rest
    follows (gloo: one broadcast per rank straight into the output; other backends: a padded
    all-gather or gather). Returns (agreement, lengths, bytes); the bytes are None except on ``dst``.
    """
    world, device = len(ranks), rank_device()
    if payload is None or failed is not None:
        payload = torch.empty(0, dtype=torch.uint8)
    n = payload.numel()
    agreed = agree(what, group=group, timeout=timeout, digest=digest, text=text, failed=failed,
                   ints=(n, rows), payload=payload, eager=True, detail=detail)
    cap = agreed.capacity
    lengths = [i[0] for i in agreed.ints]
    next_capacity(group_state(group), world, max(lengths))
    offsets = [0, *itertools.accumulate(lengths)][:-1]
    me = ranks.index(dist.get_rank())
    receives = _is_mine(ranks, dst)
    if not receives:
        out = None
    elif max(lengths) <= cap:  # everything came with the agreement: one copy out of the table
        out = torch.cat([agreed.eager(r, lengths[r]) for r in range(world)])
    else:
        out = torch.empty(sum(lengths), dtype=torch.uint8, device=device)
        for r in range(world):
            k = min(cap, lengths[r])
            out[offsets[r]:offsets[r] + k] = agreed.eager(r, k)
    if max(lengths) > cap:
        rest = payload.to(device)[cap:]
        if dst is None and dist.get_backend(group) in _BROADCAST_BACKENDS:
            if rest.numel():
                out[offsets[me] + cap:offsets[me] + lengths[me]] = rest
            for r in range(world):  # one at a time: concurrent gloo ops can deadlock on its worker threads
                if lengths[r] > cap:
                    dist.broadcast(out[offsets[r] + cap:offsets[r] + lengths[r]], src=ranks[r], group=group)
        else:
            _padded_rest(rest, out, lengths, offsets, cap, dst, group)
    return agreed, lengths, out


def _padded_rest(rest: torch.Tensor, out: Optional[torch.Tensor], lengths: list[int], offsets: list[int],
                 cap: int, dst: Optional[int], group: Any) -> None:
    """The bytes beyond the eager part, padded to the longest and all-gathered (or gathered to dst)."""
    world, device = len(lengths), rest.device
    most = max(lengths) - cap
    mine = torch.zeros(most, dtype=torch.uint8, device=device)
    mine[:rest.numel()] = rest
    buf = torch.empty(world * most, dtype=torch.uint8, device=device) if out is not None else None
    if dst is None:
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(buf, mine, group=group)
    else:
        dist.gather(mine, list(buf.chunk(world)) if buf is not None else None, dst=dst, group=group)
    if out is not None:
        for r in range(world):
            if lengths[r] > cap:
                out[offsets[r] + cap:offsets[r] + lengths[r]] = buf[r * most:r * most + lengths[r] - cap]


# --- gather ----------------------------------------------------------------------------------------

def _gather_tree(what: str, data: Any, *, dst: Optional[int], group: Any, timeout: float,
                 failed: Optional[BaseException] = None, tag: str = "") -> tuple[Any, list[list[int]]]:
    """gather() of a nested structure; returns (result or None, rows per leaf per rank)."""
    ranks = _local_world(what, group)
    leaves: list[torch.Tensor] = []
    if failed is None:
        try:
            leaves = [t.reshape(1) if t.ndim == 0 else t for t in _leaves(data, what)]
            if ranks is not None:
                _check_dst(what, dst, ranks)
        except (TypeError, ValueError) as exc:
            if ranks is None:
                raise
            failed = exc
    if ranks is None:
        if failed is not None:
            raise failed
        _check_dst(what, dst, [0])
        return _rebuild(data, [t.detach().clone() for t in leaves]), [[t.shape[0]] for t in leaves]
    device = rank_device()
    single = failed is None and len(leaves) == 1
    payload = None
    if failed is None:
        if single:
            payload = _as_bytes(leaves[0], device)
        else:
            prefix = torch.tensor([t.shape[0] for t in leaves], dtype=torch.int64).view(torch.uint8).to(device)
            payload = torch.cat([prefix, *[_as_bytes(t, device) for t in leaves]]) if leaves else prefix
    structure = _describe(data, lambda t: _shape_text(t, dim0=False)) if failed is None else "?"
    shown = _describe(data, _shape_text) if failed is None else ""
    dst_text = "" if dst is None else f" dst={dst}"
    agreed, lengths, out = _gather_bytes(
        what, payload, group=group, timeout=timeout, ranks=ranks, digest=f"{tag}|{structure}|{dst}",
        text=shown + dst_text, failed=failed, rows=leaves[0].shape[0] if single else -1, dst=dst,
        detail=_paths(data, lambda t: _shape_text(t, dim0=False)) if failed is None else None)
    world = len(ranks)
    if single:
        sizes = [[i[1] for i in agreed.ints]]
    else:
        # Each rank's rows travel in its payload's prefix: known only where the payload arrives.
        sizes = [[] for _ in leaves] if out is not None else [[-1] * world for _ in leaves]
    if out is None:
        return None, sizes
    t0 = leaves[0] if leaves else None
    if single:
        return _rebuild(data, [out.view(t0.dtype).view((sum(sizes[0]),) + tuple(t0.shape[1:])).to(t0.device)]), sizes
    offsets = [0, *itertools.accumulate(lengths)]
    n = len(leaves)
    pieces: list[list[torch.Tensor]] = [[] for _ in leaves]
    for r in range(world):
        seg = out[offsets[r]:offsets[r + 1]]
        dims = seg[:8 * n].clone().view(torch.int64).tolist()
        pos = 8 * n
        for i, t in enumerate(leaves):
            k = dims[i] * t.element_size() * math.prod(t.shape[1:])
            pieces[i].append(seg[pos:pos + k])
            sizes[i].append(dims[i])
            pos += k
    result = [torch.cat(pieces[i]).view(t.dtype).view((sum(sizes[i]),) + tuple(t.shape[1:])).to(t.device)
              for i, t in enumerate(leaves)]
    return _rebuild(data, result), sizes


def gather(data: Any, *, dst: Optional[int] = None, group: Any = None, timeout: float = DEFAULT_TIMEOUT,
           sync_grads: bool = False) -> Any:
    """Concatenate every rank's tensors along dim 0, in rank order, on every rank or on ``dst``.

    ``data`` is a tensor or a nested dict / list / tuple of tensors (as accelerate's ``gather``);
    each tensor is gathered on its own and the structure is kept. Dim 0 may differ between ranks,
    and may be 0 on some; a 0-d tensor counts as one row. The result is detached, unless
    ``sync_grads=True`` (Lightning's name, for a single tensor): then gradients flow back to each
    rank's own rows, summed over the ranks, as contrastive losses need.

    Args:
        data: this rank's rows; every rank passes the same structure, dtypes and shapes beyond dim 0.
        dst: the global rank that receives the result (the others get None); None for every rank.
        group: a process group from ``dist.new_group`` (default: the whole world).
        timeout: seconds to wait for every rank of the group (default :data:`DEFAULT_TIMEOUT`, 600).
        sync_grads: keep the autograd graph (a single tensor, ``dst=None``).

    Raises:
        CollectiveMismatchError: on every rank, when ranks disagree on structure, dtype, shape beyond
            dim 0 or ``dst``, or any rank's ``data`` is not tensors; names each rank's input.
        CollectiveTimeoutError: some rank of the group did not call within ``timeout``.
        NotInitializedError: several processes were launched but no process group exists.
    """
    timeout = check_timeout("gather()", timeout)
    if sync_grads:
        if not isinstance(data, torch.Tensor) or dst is not None:
            raise TypeError("gather(sync_grads=True) takes one tensor and dst=None")
        if _local_world("gather()", group) is None:
            return data.reshape(1) if data.ndim == 0 else data
        return _GatherWithGrad.apply(data, group, timeout)
    return _gather_tree("gather()", data, dst=dst, group=group, timeout=timeout)[0]


#: detectron2's and accelerate's name for the all-ranks form.
all_gather = gather


class _GatherWithGrad(torch.autograd.Function):
    """Forward: gather; backward: sum the gradient over the ranks, keep this rank's rows."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any, timeout: float) -> torch.Tensor:  # type: ignore[override]
        whole, sizes = _gather_tree("gather()", tensor.detach(), dst=None, group=group, timeout=timeout)
        ranks = group_ranks(group)
        me = ranks.index(dist.get_rank())
        start = sum(sizes[0][:me])
        ctx.group, ctx.rows, ctx.scalar = group, (start, start + sizes[0][me]), tensor.ndim == 0
        return whole

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)  # the same shape on every rank: the gathered one
        mine = grad[ctx.rows[0]:ctx.rows[1]]
        return (mine.reshape(()) if ctx.scalar else mine), None, None


def gather_all_tensors(result: torch.Tensor, group: Any = None, *, timeout: float = DEFAULT_TIMEOUT) -> list[torch.Tensor]:
    """torchmetrics' ``gather_all_tensors``: a list with every rank's tensor, whose shapes may differ in any dim.

    Every rank passes the same dtype and number of dimensions. This rank's own entry is ``result``
    itself (so its gradient is kept, as in torchmetrics); the others are detached.

    Raises:
        CollectiveMismatchError: on every rank, when ranks disagree on dtype or ndim, or some rank's
            ``result`` is not a tensor.
        CollectiveTimeoutError: some rank of the group did not call within ``timeout``.
    """
    what = "gather_all_tensors()"
    timeout = check_timeout(what, timeout)
    ranks = _local_world(what, group)
    failed = None
    if not isinstance(result, torch.Tensor):
        failed = TypeError(f"{what} takes a tensor, got {type(result).__name__}")
        if ranks is None:
            raise failed
    if ranks is None:
        return [result]
    device = rank_device()
    payload = None
    if failed is None:
        prefix = torch.tensor(list(result.shape), dtype=torch.int64).view(torch.uint8).to(device)
        payload = torch.cat([prefix, _as_bytes(result, device)])
    digest = f"{_dtype_name(result.dtype)}/{result.ndim}" if failed is None else "?"
    _, lengths, out = _gather_bytes(what, payload, group=group, timeout=timeout, ranks=ranks, digest=digest,
                                    text=_shape_text(result) if failed is None else "", failed=failed)
    offsets = [0, *itertools.accumulate(lengths)]
    me = ranks.index(dist.get_rank())
    parts = []
    for r in range(len(ranks)):
        if r == me:
            parts.append(result)
            continue
        seg = out[offsets[r]:offsets[r + 1]]
        shape = seg[:8 * result.ndim].clone().view(torch.int64).tolist()
        parts.append(seg[8 * result.ndim:].clone().view(result.dtype).view(shape).to(result.device))
    return parts


def gather_object(obj: Any, dst: Optional[int] = None, *, group: Any = None,
                  timeout: float = DEFAULT_TIMEOUT) -> Optional[list[Any]]:
    """A list with every rank's picklable ``obj``, in rank order, on every rank or only on ``dst``.

    ``[obj]`` in a world of one. With ``dst`` (a global rank, as ``torch.distributed.gather_object``)
    the other ranks get None.

    Raises:
        CollectiveMismatchError: on every rank, when some rank's ``obj`` cannot be pickled or ranks
            pass different ``dst``; names the rank and its error.
        CollectiveTimeoutError: some rank of the group did not call within ``timeout``.
        NotInitializedError: several processes were launched but no process group exists.
    """
    return _gather_pickled("gather_object()", obj, dst=dst, group=group, timeout=timeout)


def _gather_pickled(what: str, obj: Any, *, dst: Optional[int], group: Any, timeout: float,
                    failed: Optional[BaseException] = None) -> Optional[list[Any]]:
    timeout = check_timeout(what, timeout)
    ranks = _local_world(what, group)
    if ranks is None:
        if failed is not None:
            raise failed
        _check_dst(what, dst, [0])
        return [obj]
    payload = None
    if failed is None:
        try:
            _check_dst(what, dst, ranks)
            payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        except Exception as exc:  # noqa: BLE001 - tell the other ranks before raising
            failed = exc if isinstance(exc, ValueError) else TypeError(
                f"this rank's {type(obj).__name__} cannot be pickled: {exc}; pass picklable values")
    _, lengths, out = _gather_bytes(what, payload, group=group, timeout=timeout, ranks=ranks,
                                    digest=f"pickle|{dst}", text=f"dst={dst}", failed=failed, dst=dst)
    if out is None:
        return None
    data = _to_bytes(out)
    offsets = [0, *itertools.accumulate(lengths)]
    return [pickle.loads(data[offsets[r]:offsets[r + 1]]) for r in range(len(lengths))]


def broadcast_object(obj: Any, src: int = 0, *, group: Any = None, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """Return ``src``'s picklable ``obj`` on every rank (``obj`` itself in a world of one).

    ``src`` is a global rank (as ``torch.distributed.broadcast_object_list``). The ranks agree first
    that they all broadcast from the same ``src``; a small object travels within that same exchange.

    Raises:
        CollectiveMismatchError: on every rank, when ranks pass different ``src``, another helper was
            called on some rank, or ``src``'s object cannot be pickled.
        CollectiveTimeoutError: some rank of the group did not call within ``timeout``.
        ValueError: in a world of one, ``src`` is not 0.
        NotInitializedError: several processes were launched but no process group exists.
    """
    what = "broadcast_object()"
    timeout = check_timeout(what, timeout)
    ranks = _local_world(what, group)
    if ranks is None:
        _check_dst(what, src, [0] if not dist.is_initialized() else group_ranks(group), name="src")
        return obj
    failed, payload = None, None
    try:
        _check_dst(what, src, ranks, name="src")
        if dist.get_rank() == src:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    except Exception as exc:  # noqa: BLE001
        failed = exc if isinstance(exc, ValueError) else TypeError(
            f"rank {src}'s {type(obj).__name__} cannot be pickled: {exc}; pass a picklable value")
    _, lengths, out = _gather_bytes(what, payload, group=group, timeout=timeout, ranks=ranks,
                                    digest=f"src={src}", text=f"src={src}", failed=failed)
    r = ranks.index(src)
    start = sum(lengths[:r])
    return pickle.loads(_to_bytes(out[start:start + lengths[r]]))


def collect_results(results: Sequence[Any], size: int, *, group: Any = None,
                    timeout: float = DEFAULT_TIMEOUT) -> list[Any]:
    """mmengine's ``collect_results``: every rank's list, interleaved back into sampler order, cut to ``size``.

    Ranks may hold different counts (the last ranks one fewer): nothing is dropped. Prefer
    :func:`gather_for_metrics`, which also works for shuffled samplers.
    """
    parts = _gather_pickled("collect_results()", list(results), dst=None, group=group, timeout=timeout)
    assert parts is not None
    out = [part[i] for i in range(max(map(len, parts), default=0)) for part in parts if i < len(part)]
    return out[:size]


# --- gather_for_metrics ----------------------------------------------------------------------------

# Per-batch progress of each sampler: (its epoch, samples this rank has returned so far).
_seen: weakref.WeakKeyDictionary[Any, tuple[Any, int]] = weakref.WeakKeyDictionary()


def gather_for_metrics(values: Any, sampler: Any = None, *, total: Optional[int] = None, per_batch: bool = False,
                       group: Any = None, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """Evaluation results of every rank, padding duplicates removed (accelerate's ``gather_for_metrics``).

    Three forms:

    * ``gather_for_metrics(values, sampler)`` once after the loop: ``values`` are this rank's results
      (a tensor with one row per sample, a nested dict/list/tuple of such tensors, or a list of any
      objects) in the order its ``DistributedSampler`` yielded them. Returns the whole dataset's
      results in dataset order on every rank, equal to a single-process evaluation bit for bit,
      shuffled or not. With ``drop_last=True`` the tail the sampler never yields is missing and a
      warning on rank 0 says how many.
    * ``gather_for_metrics(batch, sampler, per_batch=True)`` on every batch: the batch of every rank
      in rank order, with the sampler's padding duplicates (in the last batch) removed.
    * ``gather_for_metrics(batch, total=N)`` on every batch of an IterableDataset (no sampler): the
      batches in rank order, cut so that no more than ``N`` rows come back over the whole loop.

    Raises:
        CollectiveMismatchError: on every rank, when some rank's number of results differs from its
            sampler's length, its sampler was built for another rank or world size, or ranks mix
            tensors and lists.
        CollectiveTimeoutError: some rank of the group did not call within ``timeout``.
    """
    what = "gather_for_metrics()"
    timeout = check_timeout(what, timeout)
    if total is not None and sampler is None:
        return _per_batch_total(values, total, group, timeout)
    if sampler is None:  # every rank still takes part, so that no later call shifts
        error = TypeError(f"{what} needs the sampler (DistributedSampler), or total= for an IterableDataset")
        return _gather_tree(what, values, dst=None, group=group, timeout=timeout, failed=error)[0]
    if per_batch:
        return _per_batch_sampler(values, sampler, group, timeout)
    return _whole(values, sampler, group, timeout)


def _world_of(group: Any) -> int:
    return len(group_ranks(group)) if dist.is_available() and dist.is_initialized() else 1


def _sampler_problem(sampler: Any, group: Any) -> Optional[str]:
    ranks = group_ranks(group) if dist.is_available() and dist.is_initialized() else [0]
    me = ranks.index(dist.get_rank()) if dist.is_available() and dist.is_initialized() else 0
    replicas, srank = getattr(sampler, "num_replicas", len(ranks)), getattr(sampler, "rank", None)
    if replicas != len(ranks) or (srank is not None and srank != me):
        return (f"this rank's sampler has num_replicas={replicas}, rank={srank} in a group of {len(ranks)} where this "
                f"rank is {me}; build the DistributedSampler after init_process_group, or pass num_replicas and "
                f"rank that match")
    return None


def _global_order(sampler: Any) -> Optional[torch.Tensor]:
    """A DistributedSampler's whole padded order (rank r yields ``order[r::world]``), computed as torch does.

    Every rank computes the same order locally, so the indices need not travel. None for other samplers.
    """
    if type(sampler) is not DistributedSampler:
        return None
    n = len(sampler.dataset)
    if sampler.shuffle:
        g = torch.Generator()
        g.manual_seed(sampler.seed + sampler.epoch)
        order = torch.randperm(n, generator=g)
    else:
        order = torch.arange(n)
    if not sampler.drop_last:
        pad = sampler.total_size - n
        if pad:
            order = torch.cat([order, order.repeat(math.ceil(pad / max(1, n)))[:pad]])
    else:
        order = order[:sampler.total_size]
    return order


def _whole(values: Any, sampler: Any, group: Any, timeout: float) -> Any:
    what = "gather_for_metrics()"
    order = _global_order(sampler) if isinstance(values, (torch.Tensor, Mapping, tuple)) else None
    indices = list(iter(sampler)) if order is None else None
    count = len(indices) if indices is not None else len(sampler)
    is_tensor = isinstance(values, (torch.Tensor, Mapping, tuple))
    failed: Optional[BaseException] = None
    if is_tensor:
        try:
            leaves = _leaves(values, what)
        except TypeError as exc:
            leaves, failed = [], exc
        n_values = leaves[0].shape[0] if leaves and leaves[0].ndim else -1
        if failed is None and any(t.ndim == 0 or t.shape[0] != n_values for t in leaves):
            failed = ValueError(f"{what}: pass one row per sample in every tensor (got {_describe(values, _shape_text)})")
    else:
        values = list(values)
        n_values = len(values)
    problem = _sampler_problem(sampler, group)
    if problem and failed is None:
        failed = ValueError(problem)
    elif failed is None and n_values != count:
        failed = ValueError(f"{n_values} results but the sampler yielded {count} indices; pass one result "
                            f"per sample in sampler order (DataLoader(drop_last=False), the same sampler epoch)")
    if _local_world(what, group) is None and failed is not None:
        raise failed
    dataset = getattr(sampler, "dataset", None)
    size = len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None
    if order is not None:
        # The order is computed, not sent: the ranks agree on everything it is computed from.
        tag = (f"sampler n={size} seed={sampler.seed} epoch={sampler.epoch} shuffle={sampler.shuffle} "
               f"drop_last={sampler.drop_last}")
        whole, _ = _gather_tree(what, values, dst=None, group=group, timeout=timeout, failed=failed, tag=tag)
        keep = _dataset_order(order, size, sampler.num_replicas, sampler.num_samples)
        covered = keep.numel()
    else:
        idx = torch.tensor(indices, dtype=torch.int64)
        if is_tensor:
            both, _ = _gather_tree(what, (idx, values), dst=None, group=group, timeout=timeout, failed=failed,
                                   tag="tensors")
            all_idx, whole = both
        else:
            parts = _gather_pickled(what, (indices, values), dst=None, group=group, timeout=timeout, failed=failed)
            all_idx = torch.tensor([i for p in parts for i in p[0]], dtype=torch.int64)
            whole = [v for p in parts for v in p[1]]
        ranked_order = torch.argsort(all_idx, stable=True)
        ranked = all_idx[ranked_order]
        first = torch.ones_like(ranked, dtype=torch.bool)
        first[1:] = ranked[1:] != ranked[:-1]
        keep = ranked_order[first]
        covered = int(first.sum())
    if size is not None and covered < size and dist.is_initialized() and dist.get_rank() == group_ranks(group)[0]:
        logger.warning("gather_for_metrics: the sampler never yielded %s of %s samples (drop_last=True?); "
                       "evaluate with DistributedSampler(drop_last=False), the padding is removed here",
                       size - covered, size)
    if is_tensor:
        return _rebuild(whole, [t.index_select(0, keep.to(t.device)) for t in _leaves(whole, what)])
    return [whole[p] for p in keep.tolist()]


def _dataset_order(order: torch.Tensor, size: int, world: int, per_rank: int) -> torch.Tensor:
    """Rows of the rank-major gather, in dataset order, each dataset index once."""
    m = min(size, order.numel())
    # position q of the order sits on rank q % world, row q // world: rank-major row (q % world) * per_rank + q // world
    src = torch.arange(per_rank * world).view(world, per_rank).t().reshape(-1)[:m]
    keys = order[:m]
    if m == size:  # every index once (no drop_last): invert the permutation instead of sorting
        inverse = torch.empty(size, dtype=torch.int64).index_copy_(0, keys, torch.arange(m))
        return src.index_select(0, inverse)
    return src.index_select(0, torch.argsort(keys))


def _per_batch_sampler(values: Any, sampler: Any, group: Any, timeout: float) -> Any:
    what = "gather_for_metrics()"
    epoch = getattr(sampler, "epoch", None)
    last_epoch, seen = _seen.get(sampler, (epoch, 0))
    if last_epoch != epoch:  # a new epoch (set_epoch) after a loop that stopped early starts over
        seen = 0
    problem = _sampler_problem(sampler, group)
    dataset = getattr(sampler, "dataset", None)
    total = len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None
    failed = ValueError(problem) if problem else None
    if failed is None and total is None:
        failed = ValueError("the sampler has no dataset with a length; pass total= instead")
    whole, sizes = _gather_tree(what, values, dst=None, group=group, timeout=timeout, failed=failed,
                                tag=f"batch|{seen}")
    rows = sizes[0]
    world = len(rows)
    keep = [j * world + r < total for r in range(world) for j in range(seen, seen + rows[r])]
    mine = rows[group_ranks(group).index(dist.get_rank())] if dist.is_initialized() else rows[0]
    seen += mine
    if seen >= len(sampler):
        _seen.pop(sampler, None)
    else:
        _seen[sampler] = (epoch, seen)
    if all(keep):
        return whole
    rows = torch.tensor(keep).nonzero().view(-1)
    return _rebuild(whole, [t.index_select(0, rows.to(t.device)) for t in _leaves(whole, what)])


def _per_batch_total(values: Any, total: int, group: Any, timeout: float) -> Any:
    what = "gather_for_metrics()"
    failed = None
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        failed = ValueError(f"{what}: total={total!r}: give the number of samples in the whole dataset")
        total = 0
    state = group_state(group) if dist.is_available() and dist.is_initialized() else None
    extra = state.extra if state is not None else _LOCAL_EXTRA
    seen = extra.get(("metrics", total), 0)
    whole, sizes = _gather_tree(what, values, dst=None, group=group, timeout=timeout, tag=f"total|{total}|{seen}",
                                failed=failed)
    gathered = sum(sizes[0])
    keep = max(0, min(gathered, total - seen))
    seen += gathered
    if seen >= total:
        extra.pop(("metrics", total), None)
    else:
        extra[("metrics", total)] = seen
    if keep == gathered:
        return whole
    return _rebuild(whole, [t[:keep] for t in _leaves(whole, what)])


_LOCAL_EXTRA: dict[Any, Any] = {}


# --- pad_across_processes --------------------------------------------------------------------------

def pad_across_processes(data: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False, *,
                         group: Any = None, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """accelerate's ``pad_across_processes``: pad every tensor along ``dim`` to the largest size of any rank.

    ``data`` may be nested; 0-d tensors and tensors with fewer than ``dim + 1`` dimensions are
    returned as they are. ``pad_first`` puts the padding before the values.

    Raises:
        CollectiveMismatchError: on every rank, when ranks pass different structures or ndims.
    """
    what = "pad_across_processes()"
    timeout = check_timeout(what, timeout)
    ranks = _local_world(what, group)
    failed = None
    leaves: list[torch.Tensor] = []
    try:
        leaves = _leaves(data, what)
    except TypeError as exc:
        if ranks is None:
            raise
        failed = exc
    if ranks is None:
        return data
    sizes = torch.tensor([t.shape[dim] if -t.ndim <= dim < t.ndim and t.ndim else -1 for t in leaves],
                         dtype=torch.int64)
    structure = _describe(data, lambda t: f"{t.ndim}d") if failed is None else "?"
    _, _, out = _gather_bytes(what, sizes.view(torch.uint8), group=group, timeout=timeout, ranks=ranks,
                                         digest=f"{structure}|{dim}", text=_describe(data, _shape_text)
                                         if failed is None else "", failed=failed)
    table = out.view(len(ranks), -1).view(torch.int64) if out.numel() else out.view(len(ranks), 0)
    most = table.max(dim=0).values.tolist() if len(leaves) else []
    padded = []
    for t, m in zip(leaves, most):
        if m < 0 or t.shape[dim] == m:
            padded.append(t)
            continue
        shape = list(t.shape)
        shape[dim] = m
        new = t.new_full(shape, pad_index)
        d = dim % t.ndim
        index = [slice(None)] * t.ndim
        index[d] = slice(m - t.shape[d], m) if pad_first else slice(0, t.shape[d])
        new[tuple(index)] = t
        padded.append(new)
    return _rebuild(data, padded)


# --- reductions ------------------------------------------------------------------------------------

def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.bool or not (dtype.is_floating_point or dtype.is_complex):
        return torch.int64
    if dtype in (torch.float64, torch.complex128, torch.complex64):
        return dtype
    return torch.float32


def _is_python_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Integer sums travel as two int64 limbs per element (t == high * 2**32 + low, low in [0, 2**32)): each
# limb's sum over any world below 2**31 ranks fits int64, so the exact sum is known and an overflow of
# the result's dtype is seen, never wrapped.
_LOW_BITS = (1 << 32) - 1


def _limbs(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t & _LOW_BITS, t >> 32])


def _is_limbed(dtype: torch.dtype, reduction: str) -> bool:
    return dtype == torch.int64 and reduction in ("sum", "mean")


def _from_limbs(limbs: torch.Tensor, dtype: torch.dtype, what: str, name: str, world: int) -> torch.Tensor:
    """The exact sum from its summed limbs; OverflowError when it does not fit ``dtype``.

    Every rank holds the same limbs (reduced in rank order from one exchange, or by all_reduce), so
    every rank raises the same error after the same collectives: the next call starts aligned.
    """
    n = limbs.numel() // 2
    low, high = limbs[:n], limbs[n:]
    high = high + (low >> 32)
    low = low & _LOW_BITS
    info = torch.iinfo(dtype) if dtype != torch.bool else torch.iinfo(torch.int64)
    # exact = high * 2**32 + low lies in [info.min, info.max] iff (high, low) does, compared limb-wise
    too_big = (high > info.max >> 32) | ((high == info.max >> 32) & (low > info.max & _LOW_BITS))
    too_small = (high < info.min >> 32) | ((high == info.min >> 32) & (low < info.min & _LOW_BITS))
    bad = (too_big | too_small).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        exact = int(high[i]) * (1 << 32) + int(low[i])
        where = name if n == 1 else f"{name} (element {i})"
        raise OverflowError(f"{what}: the sum of {where} over {world} ranks is {exact}, outside "
                            f"{_dtype_name(dtype)}'s range [{info.min}, {info.max}]; reduce it as a Python int "
                            f"(exact at any size) or in float64")
    return (high << 32) | low


def _int_bytes(values: Sequence[int]) -> bytes:
    """Python ints as length-prefixed two's-complement bytes: exact at any size."""
    out = bytearray()
    for v in values:
        b = v.to_bytes(v.bit_length() // 8 + 1, "little", signed=True)
        out += len(b).to_bytes(4, "little") + b
    return bytes(out)


def _ints_from(raw: bytes) -> list[int]:
    out, i = [], 0
    while i < len(raw):
        k = int.from_bytes(raw[i:i + 4], "little")
        out.append(int.from_bytes(raw[i + 4:i + 4 + k], "little", signed=True))
        i += 4 + k
    return out


def _reduce_ints(values: list[int], reduction: str, world: int) -> Union[int, float]:
    """One Python int leaf over the ranks, exactly (a mean is the correctly rounded quotient)."""
    if reduction == "max":
        return max(values)
    if reduction == "min":
        return min(values)
    return sum(values) / world if reduction == "mean" else sum(values)


def _reduce_leaves(what: str, data: Any, reduction: str, group: Any, timeout: float, tag: str = "") -> Any:
    """Reduce every tensor / number of a nested structure; integer sums exact, structure kept.

    Python ints travel as bytes and are reduced as Python ints (exact at any size); Python floats in
    float64; integer tensors as exact int64 limbs, so a sum outside the result's dtype raises
    OverflowError on every rank instead of wrapping.
    """
    ranks = _local_world(what, group)
    failed: Optional[BaseException] = None
    leaves: list[Any] = []
    try:
        if reduction not in _REDUCTIONS:
            raise ValueError(f"{what}: reduction={reduction!r}: use one of {', '.join(_REDUCTIONS)}")
        leaves = _leaves(data, what, numbers=True)
    except (TypeError, ValueError) as exc:
        if ranks is None:
            raise
        failed = exc
    paths = _paths(data, _shape_text) if failed is None else None
    names = list(paths) if paths else ["the input"] * len(leaves)
    exact = [i for i, v in enumerate(leaves) if _is_python_int(v)]
    numeric = [i for i, v in enumerate(leaves) if not _is_python_int(v)]
    tensors = {i: torch.as_tensor(leaves[i], dtype=torch.float64 if isinstance(leaves[i], float) else None)
               for i in numeric}
    divided = False  # floating buckets already divided by the world size (large means)
    reduced: dict[int, Any] = {}
    if ranks is None:
        world = 1
        reduced = {i: t.detach().to(_compute_dtype(t.dtype), copy=True) for i, t in tensors.items()}
        reduced.update({i: _reduce_ints([leaves[i]], reduction, 1) for i in exact})
    else:
        world = len(ranks)
        device = rank_device()
        work = {i: t.detach().reshape(-1).to(device, _compute_dtype(t.dtype)) for i, t in tensors.items()}
        buckets: dict[torch.dtype, list[int]] = {}
        for i in numeric:
            buckets.setdefault(work[i].dtype, []).append(i)
        order = sorted(buckets, key=str)
        flats = [torch.cat([work[i] for i in buckets[d]]) for d in order]
        nbytes = sum(f.numel() * f.element_size() for f in flats)
        structure = _describe(data, _shape_text) if failed is None else "?"
        cap = group_state(group).capacity
        eager = nbytes <= cap
        parts = [f.view(-1).view(torch.uint8) for f in flats] if eager else []
        if exact:
            parts.append(torch.frombuffer(bytearray(_int_bytes([leaves[i] for i in exact])), dtype=torch.uint8))
        payload = torch.cat(parts).to(device) if parts else None
        _, lengths, out = _gather_bytes(what, payload, group=group, timeout=timeout, ranks=ranks,
                                        digest=f"{reduction}|{structure}|{tag}", text=f"{reduction} of {tag or structure}",
                                        failed=failed, detail=None if failed is not None or tag else paths)
        offsets = [0, *itertools.accumulate(lengths)]
        segments = [out[offsets[r]:offsets[r + 1]] for r in range(world)]
        head = nbytes if eager else 0
        if eager:  # every rank's values came with the agreement: reduce here, in rank order, alike everywhere
            results, start = [], 0
            for b, d in enumerate(order):
                k = flats[b].numel() * flats[b].element_size()
                per_rank = [segments[r][start:start + k].clone().view(d) for r in range(world)]
                results.append(_combine(per_rank, reduction))
                start += k
        else:
            op = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                  "min": dist.ReduceOp.MIN}[reduction]
            results = [_limbs(f) if _is_limbed(f.dtype, reduction) else f for f in flats]
            for f in results:  # every collective first: an overflow raised afterwards leaves the calls aligned
                dist.all_reduce(f, op=op, group=group)
                if reduction == "mean" and f.is_floating_point():
                    f /= world
            divided = True
        for b, d in enumerate(order):
            offset, limbed = 0, _is_limbed(d, reduction)
            for i in buckets[d]:
                n = work[i].numel()
                if limbed:
                    both = torch.cat([results[b][offset:offset + n], results[b][flats[b].numel() + offset:][:n]])
                    reduced[i] = _from_limbs(both, torch.int64, what, names[i], world)
                else:
                    reduced[i] = results[b][offset:offset + n]
                reduced[i] = reduced[i].view(tensors[i].shape)
                offset += n
        if exact:
            per_rank_ints = [_ints_from(_to_bytes(segments[r][head:])) for r in range(world)]
            for j, i in enumerate(exact):
                reduced[i] = _reduce_ints([ints[j] for ints in per_rank_ints], reduction, world)
    out_leaves = [_leaf_result(v, reduced[i], reduction, world, divided, what, names[i]) for i, v in enumerate(leaves)]
    return _rebuild(data, out_leaves)


def _leaf_result(value: Any, s: Any, reduction: str, world: int, divided: bool, what: str, name: str) -> Any:
    """One reduced leaf in the caller's type: a tensor keeps its dtype (range-checked), a number its kind."""
    if _is_python_int(value):
        return s
    if reduction == "mean" and not (divided and s.is_floating_point()):
        s = (torch.div(s, world, rounding_mode="trunc") if not s.is_floating_point() and not s.is_complex()
             and isinstance(value, torch.Tensor) and value.dtype != torch.bool else s / world)
    if isinstance(value, torch.Tensor):
        dtype = value.dtype
        if value.dtype == torch.bool:
            dtype = torch.int64 if reduction == "sum" else (torch.bool if reduction != "mean" else torch.get_default_dtype())
        elif not (dtype.is_floating_point or dtype.is_complex) and dtype != torch.int64 and s.numel():
            _check_range(s, dtype, what, name, world)
        return s.to(value.device, dtype).reshape(value.shape)
    if isinstance(value, bool):
        return int(s.item()) if reduction == "sum" else (s.item() if reduction == "mean" else bool(s.item()))
    return float(s.item())


def _check_range(s: torch.Tensor, dtype: torch.dtype, what: str, name: str, world: int) -> None:
    """OverflowError when an exact int64 result does not fit the caller's narrower integer dtype."""
    info = torch.iinfo(dtype)
    bad = ((s < info.min) | (s > info.max)).reshape(-1).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        where = name if s.numel() == 1 else f"{name} (element {i})"
        raise OverflowError(f"{what}: the result for {where} over {world} ranks is {int(s.reshape(-1)[i])}, outside "
                            f"{_dtype_name(dtype)}'s range [{info.min}, {info.max}]; convert the tensor to int64 "
                            f"(or reduce it as a Python int) first")


def _combine(parts: list[torch.Tensor], reduction: str) -> torch.Tensor:
    if _is_limbed(parts[0].dtype, reduction):  # exact: the limbs' sums cannot overflow
        parts = [_limbs(p) for p in parts]
    acc = parts[0].clone()
    for p in parts[1:]:
        if reduction in ("sum", "mean"):
            acc += p
        elif reduction == "max":
            acc = torch.maximum(acc, p)
        else:
            acc = torch.minimum(acc, p)
    return acc


def reduce(data: Any, reduction: str = "mean", *, group: Any = None, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """accelerate's ``reduce`` (and mmengine's ``all_reduce``): reduce every tensor or number over the ranks.

    ``data`` is a tensor, a number, or a nested dict / list / tuple of them; the result has the same
    structure and is valid on every rank. ``reduction`` is ``"sum"``, ``"mean"``, ``"max"`` or
    ``"min"``. Integer sums are exact or raise, never wrap: Python ints are summed as Python ints
    at any size, integer tensors exactly (never through floats); Python floats in float64. Every
    tensor keeps its dtype (an integer mean rounds toward zero, as mmengine's ``all_reduce``; a bool
    sum is int64); Python ints stay ints except for a mean. Small inputs travel with the agreement step and are reduced
    in rank order on every rank (one collective, bitwise identical everywhere); large ones take one
    all_reduce per dtype.

    Raises:
        CollectiveMismatchError: on every rank, when ranks pass different structures, keys, dtypes,
            shapes or reductions; names each rank's input.
        CollectiveTimeoutError: some rank of the group did not call within ``timeout``.
        OverflowError: on every rank, when an integer tensor's sum does not fit its dtype (int64 for
            an int64 tensor); names the value and the exact sum. The next call is still aligned.
    """
    return _reduce_leaves("reduce()", data, reduction, group, check_timeout("reduce()", timeout))


def reduce_dict(d: Mapping[Any, Any], average: bool = True, *, group: Any = None,
                timeout: float = DEFAULT_TIMEOUT) -> dict[Any, Any]:
    """detectron2's ``reduce_dict``: sum (or average) a dict of numbers or tensors, nested allowed, over the ranks.

    Results are valid on every rank; dtypes and number types as :func:`reduce`.

    Raises:
        CollectiveMismatchError: on every rank, when ranks have different keys or shapes; names
            each rank's keys and shapes.
        NotInitializedError: several processes were launched but no process group exists.
        OverflowError: on every rank, when an integer tensor's sum does not fit its dtype.
    """
    what = "reduce_dict()"
    timeout = check_timeout(what, timeout)
    if not isinstance(d, Mapping):
        bad = TypeError(f"{what} takes a dict, got {type(d).__name__}")
        if _local_world(what, group) is None:
            raise bad
        d = {"?": _Unreducible(bad)}  # take part in the agreement so that no call shifts
    return _reduce_leaves(what, d, "mean" if average else "sum", group, timeout)


def all_reduce_mean(tensor: torch.Tensor, *, group: Any = None, timeout: float = DEFAULT_TIMEOUT) -> torch.Tensor:
    """The mean of ``tensor`` over all ranks, as a new tensor on every rank (floats for integer input).

    Raises:
        CollectiveMismatchError: on every rank, when ranks pass different shapes or dtypes.
        NotInitializedError: several processes were launched but no process group exists.
    """
    what = "all_reduce_mean()"
    if isinstance(tensor, torch.Tensor) and not (tensor.is_floating_point() or tensor.is_complex()):
        tensor = tensor.to(torch.get_default_dtype())
    elif not isinstance(tensor, torch.Tensor) and _local_world(what, group) is None:
        raise TypeError(f"{what} takes a torch.Tensor, got {type(tensor).__name__}")
    return _reduce_leaves(what, tensor if isinstance(tensor, torch.Tensor) else [object()], "mean", group,
                          check_timeout(what, timeout))


def all_reduce_params(params: Union[torch.nn.Module, Iterable[torch.Tensor]], *, grads: bool = True,
                      reduction: str = "mean", group: Any = None, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Average (or sum) gradients, or parameters, in place over the ranks: DDP's job, for hand-written loops.

    With ``grads=True`` (the default) each parameter's ``.grad`` is reduced, after ``backward()``
    and before ``optimizer.step()``; parameters without a gradient on every rank are skipped. With
    ``grads=False`` the parameter values themselves (e.g. to re-sync weights). One all_reduce per
    dtype of the flattened tensors.

    Raises:
        CollectiveMismatchError: on every rank, when ranks have different parameters (count, shapes,
            dtypes) or a gradient exists on some ranks only.
    """
    what = "all_reduce_params()"
    timeout = check_timeout(what, timeout)
    if isinstance(params, torch.nn.Module):
        named = list(params.named_parameters())
    else:
        named = [(str(i), p) for i, p in enumerate(params)]
    targets = [(name, p.grad if grads else p.data) for name, p in named]
    live = [t for _, t in targets if t is not None]
    if _local_world(what, group) is None:
        return
    layout = ", ".join(f"{name}: {_shape_text(t) if t is not None else 'no grad'}" for name, t in targets)
    reduced = _reduce_leaves(what, live, reduction, group, timeout, tag=layout)
    with torch.no_grad():
        for t, r in zip(live, reduced):
            t.copy_(r)


class _Unreducible:
    """A stand-in whose flattening fails with the caller's own error (so that the caller still takes part)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


#: For callers that must take part in a helper's exchange with an input they know is bad (ddpdoctor.compat).
Unreducible = _Unreducible
