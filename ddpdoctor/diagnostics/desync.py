"""Are parameters, buffers and gradients identical on every rank? Find out without gathering them.

:func:`assert_in_sync` reduces every tensor to a small fingerprint of its raw bytes, exchanges the
fingerprints in one small ``all_gather`` (a digest of them all when the ranks agree; every tensor's
when they do not), and only when fingerprints differ fetches the largest absolute difference of the
tensors concerned. In sync, a rank sends 24 bytes whatever the model; otherwise the bytes grow with
the number of tensors, never with the number of parameters.

The fingerprint (:mod:`ddpdoctor.diagnostics.fingerprint`) reads each tensor's bytes once, in
place, with no temporary larger than 4 MiB, and compares bits, not values: any change to one 32-bit
word of a tensor (one flipped bit included) always changes it, so ``-0.0`` and ``0.0`` differ, and
so do NaNs with different payloads; permutations change it unless 64-bit keys collide. For the
tensors whose fingerprints differ, the largest absolute difference is then fetched in chunks of at
most 4 MiB: NaN when some ranks hold a NaN where others hold a number, 0.0 when the values are
equal and only the bits differ (``-0.0`` against ``0.0``, or NaN payloads).
"""

from __future__ import annotations

import logging
import zlib
from typing import Any, Iterator, Optional, Sequence

import torch

from ddpdoctor.diagnostics.fingerprint import (CHUNK_BYTES, combine_fingerprints, fingerprint, fingerprint_many,
                                               flat_pieces, strided_real)
from ddpdoctor.diagnostics.wrapped import unwrap_module
from ddpdoctor.errors import DdpdoctorError

__all__ = ["assert_in_sync", "DesyncError", "TensorMismatch", "fingerprint"]

log = logging.getLogger(__name__)

_DIFF_CHUNK = CHUNK_BYTES // 32  # elements per max-difference all_reduce: 4 float64 values each


class TensorMismatch:
    """One tensor that differs across ranks.

    Attributes:
        name: qualified name, prefixed ``param:``, ``buffer:`` or ``grad:``.
        versions: one tuple of ranks per distinct version, the version of rank 0 first.
        max_abs_diff: the largest absolute element difference across ranks, or None when the
            tensors cannot be compared element-wise (shape, dtype or presence differs).
        reason: ``values`` or ``layout`` (name, shape, dtype or presence differs).
    """

    def __init__(self, name: str, versions: Sequence[tuple[int, ...]], max_abs_diff: Optional[float],
                 reason: str) -> None:
        self.name = name
        self.versions = tuple(versions)
        self.max_abs_diff = max_abs_diff
        self.reason = reason

    def describe(self) -> str:
        """One line: the tensor, which ranks hold which version, and the largest difference."""
        held = "; ".join(f"version {chr(65 + i)} on rank{'s' if len(r) > 1 else ''} "
                         f"{','.join(map(str, r))}" for i, r in enumerate(self.versions))
        if self.reason == "layout":
            return f"{self.name}: name, shape, dtype or presence differs ({held})"
        diff = self.max_abs_diff
        if diff is not None and diff != diff:
            what = "NaN on some ranks, a number on others"
        elif diff == 0.0:
            what = "values equal, bits differ (-0.0 against 0.0, or NaN payloads)"
        else:
            what = f"max abs diff {diff:.6g}"
        return f"{self.name}: {what} ({held})"

    def __repr__(self) -> str:
        return f"TensorMismatch({self.describe()!r})"


class DesyncError(DdpdoctorError):
    """Tensors that must be identical on every rank are not; raised on every rank alike.

    Attributes:
        mismatches: the :class:`TensorMismatch` of every differing tensor, in module order.
    """

    def __init__(self, mismatches: Sequence[TensorMismatch], hint: str = "", shown: int = 10) -> None:
        self.mismatches = tuple(mismatches)
        lines = [m.describe() for m in self.mismatches[:shown]]
        more = len(self.mismatches) - len(lines)
        if more > 0:
            lines.append(f"... and {more} more")
        noun = "tensor differs" if len(self.mismatches) == 1 else "tensors differ"
        message = f"{len(self.mismatches)} {noun} across ranks:\n  " + "\n  ".join(lines)
        super().__init__("param-desync", message, hint or _HINT)
        self._shown = shown

    def __reduce__(self) -> Any:
        return (type(self), (self.mismatches, self.hint, self._shown))

    def __str__(self) -> str:
        """The differing tensors and the fix: a traceback (``str``) shows both, not only ``e.hint``."""
        return f"{self.message}\nfix: {self.hint}" if self.hint else self.message


_HINT = ("wrap the model in DistributedDataParallel before training (it broadcasts rank 0's state), "
         "seed every rank identically before building the model, and never update parameters "
         "outside the optimizer on some ranks only")


def _fingerprints(tensors: list, device: torch.device) -> torch.Tensor:
    """Every tensor's fingerprint (0 for None) on ``device``, hashed a device at a time (see fingerprint_many)."""
    values = torch.zeros(len(tensors), dtype=torch.int64, device=device)
    by_device: dict = {}
    for i, t in enumerate(tensors):
        if t is not None:
            by_device.setdefault(t.device, []).append(i)
    for index in by_device.values():
        found = fingerprint_many([tensors[i] for i in index]).to(device)
        values.index_copy_(0, torch.tensor(index, device=device), found)
    return values


def _layout_hash(name: str, t: Optional[torch.Tensor]) -> int:
    text = f"{name}|none" if t is None else f"{name}|{tuple(t.shape)}|{t.dtype}"
    return zlib.crc32(text.encode())


def _tensors(module: torch.nn.Module, grads: bool, buffers: bool
             ) -> Iterator[tuple[str, Optional[torch.Tensor]]]:
    for name, p in module.named_parameters():
        yield f"param:{name}", p
    if buffers:
        for name, b in module.named_buffers():
            yield f"buffer:{name}", b
    if grads:
        for name, p in module.named_parameters():
            if p.requires_grad:
                yield f"grad:{name}", p.grad


def _versions(column: list[int]) -> list[tuple[int, ...]]:
    groups: dict[int, list[int]] = {}
    for rank, value in enumerate(column):
        groups.setdefault(value, []).append(rank)
    return [tuple(r) for r in groups.values()]


def _max_abs_diffs(tensors: list[torch.Tensor], group: Any, device: torch.device) -> list[float]:
    """Each tensor's largest element difference across ranks, for all the tensors in one stream of
    chunks of ``_DIFF_CHUNK`` elements.

    Each chunk is one all_reduce(MAX) of ``[x, -x, isnan, -isnan]`` in float64 (4 MiB) holding the
    pieces of one or more tensors, so the number of collectives depends only on the element count,
    which every rank shares: one in all for small tensors, whatever their number. A value is NaN
    when some ranks hold a NaN where others do not, and 0.0 when only the bits differ.
    """
    worst = [torch.zeros((), dtype=torch.float64, device=device) for _ in tensors]
    split_nan = [torch.zeros((), dtype=torch.bool, device=device) for _ in tensors]
    segments: list[tuple[int, torch.Tensor]] = []  # (tensor index, piece)
    filled = 0

    def reduce_chunk() -> None:
        import torch.distributed as dist

        k = sum(s.numel() for _, s in segments)
        payload = torch.empty(4 * k, dtype=torch.float64, device=device)
        values, off = payload[:k], 0
        for _, s in segments:
            values[off:off + s.numel()].copy_(s)
            off += s.numel()
        nan = torch.isnan(values)
        values.masked_fill_(nan, 0.0)
        torch.neg(values, out=payload[k:2 * k])
        payload[2 * k:3 * k].copy_(nan)
        torch.neg(payload[2 * k:3 * k], out=payload[3 * k:])
        dist.all_reduce(payload, op=dist.ReduceOp.MAX, group=group)
        hi, neg_lo = payload[:k], payload[k:2 * k]
        diff = torch.where(hi == -neg_lo, 0.0, hi + neg_lo)  # equal infinities differ by 0
        split = (payload[2 * k:3 * k] > 0) & (payload[3 * k:] == 0)
        off = 0
        for i, s in segments:
            n = s.numel()
            worst[i] = torch.maximum(worst[i], diff[off:off + n].max())
            split_nan[i] = split_nan[i] | split[off:off + n].any()
            off += n

    for i, t in enumerate(tensors):
        for piece in flat_pieces(strided_real(t)):
            pos = 0
            while pos < piece.numel():
                take = min(_DIFF_CHUNK - filled, piece.numel() - pos)
                segments.append((i, piece[pos:pos + take]))
                filled, pos = filled + take, pos + take
                if filled == _DIFF_CHUNK:
                    reduce_chunk()
                    segments, filled = [], 0
    if filled:
        reduce_chunk()
    return [float("nan") if bool(nan) else float(w) for w, nan in zip(worst, split_nan)]


def _comm_device(group: Any, fallback: torch.device) -> torch.device:
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu") if fallback.type != "cpu" else fallback


def assert_in_sync(module: torch.nn.Module, *, grads: bool = False, buffers: bool = True,
                   atol: float = 0.0, group: Any = None) -> None:
    """Check that every rank holds the same parameters (and buffers, and gradients).

    Call it on every rank at the same point of the training loop (it is a collective). Each
    tensor is fingerprinted locally; one ``all_gather`` of 24 bytes per rank (the tensor count, a
    layout hash and a digest of all fingerprints) settles the common case, in sync. Only when the
    ranks differ do the fingerprints of all tensors travel, in a second ``all_gather`` (16 bytes
    per tensor). The tensors themselves are never gathered: only for tensors whose fingerprints
    differ is the largest absolute difference fetched, with one ``all_reduce`` per 4 MiB of their
    elements (one in all for small tensors).

    Args:
        module: the model; a DistributedDataParallel wrapper is looked through.
        grads: also compare ``.grad`` of every parameter that requires grad (None counts as a
            version of its own).
        buffers: also compare buffers (BatchNorm running stats included).
        atol: with 0, any bitwise difference is a mismatch; otherwise tensors whose elements
            differ by at most ``atol`` are accepted.
        group: the process group; the default group when None.

    Returns:
        None when everything is in sync, or when there is no process group (a no-op).

    Raises:
        DesyncError: on every rank, naming the tensors that differ, which ranks hold which
            version, and the largest absolute difference.
        ValueError: ``atol`` is negative.
    """
    import torch.distributed as dist

    if atol < 0:
        raise ValueError(f"atol must be >= 0, got {atol!r}; pass atol=0.0 for a bitwise comparison")
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size(group)
    if world < 2:
        return None
    module = unwrap_module(module)
    entries = list(_tensors(module, grads=grads, buffers=buffers))
    local_device = next((t.device for _, t in entries if t is not None), torch.device("cpu"))
    device = _comm_device(group, local_device)

    layout = zlib.crc32("\n".join(f"{n}:{_layout_hash(n, t)}" for n, t in entries).encode())
    shapes = torch.tensor([_layout_hash(n, t) for n, t in entries], dtype=torch.int64, device=device)
    values = _fingerprints([t for _, t in entries], device)
    # One exchange when the ranks agree: the tensor count, the layout and a digest of every fingerprint
    # (24 bytes per rank); the per-tensor fingerprints travel only when some rank's differ.
    header = torch.stack([torch.tensor(len(entries), dtype=torch.int64, device=device),
                          torch.tensor(layout, dtype=torch.int64, device=device), combine_fingerprints(values)])
    headers = [torch.empty_like(header) for _ in range(world)]
    dist.all_gather(headers, header, group=group)
    counts = [int(h[0]) for h in headers]
    if len(set(counts)) > 1:
        versions = _versions(counts)
        raise DesyncError([TensorMismatch(
            f"<module structure: {' vs '.join(str(counts[v[0]]) for v in versions)} tensors>",
            versions, None, "layout")],
            hint="build the same model on every rank: the ranks disagree on the number of "
                 "parameters and buffers")
    if not entries or all(torch.equal(h, headers[0]) for h in headers[1:]):
        return None

    fps = torch.stack([shapes, values], dim=1).reshape(-1)
    gathered = [torch.empty_like(fps) for _ in range(world)]
    dist.all_gather(gathered, fps, group=group)
    table = torch.stack(gathered).cpu()  # world x (2 * tensors)
    differ = (table != table[0]).any(dim=0).view(-1, 2).any(dim=1).nonzero().flatten().tolist()

    mismatches: list[TensorMismatch] = []
    # the tensors whose values differ: their largest differences in one stream of all_reduces
    valued = [i for i in differ if len(set(table[:, 2 * i].tolist())) == 1 and entries[i][1] is not None]
    diffs = dict(zip(valued, _max_abs_diffs([entries[i][1] for i in valued], group, device))) if valued else {}
    for i in differ:
        name = entries[i][0]
        layouts = table[:, 2 * i].tolist()
        if len(set(layouts)) > 1:
            mismatches.append(TensorMismatch(name, _versions(layouts), None, "layout"))
            continue
        diff = diffs.get(i, 0.0)
        if atol > 0 and diff <= atol:
            continue
        mismatches.append(TensorMismatch(name, _versions(table[:, 2 * i + 1].tolist()), diff, "values"))
    if mismatches:
        log.debug("desync: %s", "; ".join(m.describe() for m in mismatches))
        raise DesyncError(mismatches)
    return None
