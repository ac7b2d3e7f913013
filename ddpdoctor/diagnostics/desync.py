"""Are parameters, buffers and gradients identical on every rank? Find out without gathering them.

:func:`assert_in_sync` reduces every tensor to a small fingerprint of its raw bytes, exchanges the
fingerprints of all tensors in one ``all_gather``, and only when fingerprints differ fetches the
largest absolute difference of the tensors concerned. The bytes exchanged grow with the number of
tensors, not with the number of parameters.

The fingerprint of a tensor reads its bytes as 32-bit words laid out in rows of 256, hashes each
row with one integer matrix-vector product against fixed odd weights (modulo 2**32), and combines
the row hashes with fixed odd 64-bit keys (modulo 2**64). Weights and keys are the same on every
rank, and integer arithmetic makes the result independent of the reduction order (thread counts
may differ between ranks). Guarantees:

* a change to any single element (one flipped bit included) always changes the fingerprint: an odd
  weight times a non-zero 32-bit difference is non-zero modulo 2**32, and so is its product with an
  odd key modulo 2**64;
* elements moved to another row (any permutation of a large tensor) change it unless 64-bit keys
  collide; elements swapped within one row change it unless 32-bit weights collide. The one blind
  spot of 32-bit weights: swapping two elements of the same row that differ only in the top bit of
  their word (``x`` and ``-x`` in float32) is not seen.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any, Iterator, Optional, Sequence

import torch

from ddpdoctor.diagnostics.wrapped import unwrap_module
from ddpdoctor.errors import DdpdoctorError

__all__ = ["assert_in_sync", "DesyncError", "TensorMismatch", "fingerprint"]

log = logging.getLogger(__name__)

_ROW = 256  # 32-bit words per row: each row is hashed with one matrix-vector product
_SEED = 0x5EED_D0C
_MASK64 = (1 << 64) - 1
_weights: dict[torch.device, torch.Tensor] = {}
_keys: dict[torch.device, torch.Tensor] = {}


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
        return f"{self.name}: max abs diff {self.max_abs_diff:.6g} ({held})"

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


_HINT = ("wrap the model in DistributedDataParallel before training (it broadcasts rank 0's state), "
         "seed every rank identically before building the model, and never update parameters "
         "outside the optimizer on some ranks only")


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _weights_for(device: torch.device) -> torch.Tensor:
    """The fixed odd int32 column weights, identical on every rank, cached per device."""
    w = _weights.get(device)
    if w is None:
        gen = torch.Generator().manual_seed(_SEED)
        w = torch.randint(-(1 << 31), 1 << 31, (_ROW,), generator=gen, dtype=torch.int64)
        w = _weights[device] = (w | 1).to(torch.int32).to(device)
    return w


def _mix(z: torch.Tensor) -> torch.Tensor:
    """A splitmix64-style finalizer in wrapping int64 arithmetic: a fixed function of the index."""
    z = z * _signed(0x9E3779B97F4A7C15) + _signed(0x632BE59BD9B4E019)
    z = (z ^ (z >> 30)) * _signed(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> 27)) * _signed(0x94D049BB133111EB)
    return z ^ (z >> 31)


def _row_keys(rows: int, device: torch.device) -> torch.Tensor:
    """Odd pseudo-random int64 keys for rows ``0..rows-1``; key ``i`` depends on ``i`` only."""
    keys = _keys.get(device)
    if keys is None or keys.numel() < rows:
        size = max(rows, 4096, 2 * (keys.numel() if keys is not None else 0))
        keys = _keys[device] = _mix(torch.arange(size, dtype=torch.int64, device=device)) | 1
    return keys[:rows]


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bytes as a flat int32 tensor (zero-padded to a multiple of 4 bytes)."""
    flat = t.detach()
    if flat.layout != torch.strided:  # sparse gradients (nn.Embedding(sparse=True))
        flat = flat.to_dense()
    if flat.is_complex():
        flat = torch.view_as_real(flat)
    flat = flat.contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    raw = flat.view(torch.uint8)
    if raw.numel() % 4 == 0:
        try:
            return raw.view(torch.int32)
        except RuntimeError:  # storage offset not 4-byte aligned
            pass
    padded = torch.zeros((raw.numel() + 3) // 4 * 4, dtype=torch.uint8, device=raw.device)
    padded[: raw.numel()] = raw
    return padded.view(torch.int32)


def _row_hashes(rows: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``wrap32(sum_k rows[r, k] * w[k])`` for every row: int32 arithmetic modulo 2**32."""
    if rows.device.type == "cpu":
        return torch.mv(rows, w)  # fused multiply-add: one read of the data
    return torch.mul(rows, w).sum(dim=1, dtype=torch.int32)  # same value; CUDA has no integer mv


def _fingerprint_tensor(t: torch.Tensor) -> torch.Tensor:
    """The fingerprint as a 0-dim int64 tensor on the tensor's device (no host sync).

    The words are laid out in rows of ``_ROW``; row ``r`` hashes to
    ``R[r] = wrap32(sum_k x[r, k] * w[k])`` with odd weights ``w``, and the rows combine as
    ``sum_r R[r] * key[r]`` modulo 2**64 with odd keys, so an element's position counts both
    within and across rows.
    """
    words = _words(t)
    w = _weights_for(words.device)
    full, tail = divmod(words.numel(), _ROW)
    parts = [_row_hashes(words[: full * _ROW].view(full, _ROW), w)]
    if tail:
        last = torch.zeros(1, _ROW, dtype=torch.int32, device=words.device)
        last[0, :tail] = words[full * _ROW:]
        parts.append(_row_hashes(last, w))
    rows = torch.cat(parts).to(torch.int64)
    return (rows * _row_keys(rows.numel(), words.device)).sum()


def fingerprint(t: torch.Tensor) -> int:
    """An order-sensitive 64-bit fingerprint of the tensor's bytes, as a signed int64 value.

    Equal on every rank for bitwise-equal tensors; different for any single-element change.
    """
    return int(_fingerprint_tensor(t))


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


def _max_abs_diff(t: torch.Tensor, group: Any, device: torch.device) -> float:
    """Largest element difference across ranks: one all_reduce(MAX) of ``[x, -x]`` in float64."""
    import torch.distributed as dist

    x = t.detach()
    if x.layout != torch.strided:
        x = x.to_dense()
    x = x.reshape(-1)
    if x.is_complex():
        x = torch.view_as_real(x).reshape(-1)
    x = x.to(device=device, dtype=torch.float64)
    both = torch.cat([x, -x])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    if x.numel() == 0:
        return 0.0
    hi, neg_lo = both[: x.numel()], both[x.numel():]
    return float((hi + neg_lo).max())


def _comm_device(group: Any, fallback: torch.device) -> torch.device:
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu") if fallback.type != "cpu" else fallback


def assert_in_sync(module: torch.nn.Module, *, grads: bool = False, buffers: bool = True,
                   atol: float = 0.0, group: Any = None) -> None:
    """Check that every rank holds the same parameters (and buffers, and gradients).

    Call it on every rank at the same point of the training loop (it is a collective). Each
    tensor is fingerprinted locally; the fingerprints of all tensors travel in one ``all_gather``
    (after an agreement on the tensor count of 16 bytes per rank). The tensors themselves are
    never gathered: only for tensors whose fingerprints differ is the largest absolute difference
    fetched, with one ``all_reduce`` each.

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
    header = torch.tensor([len(entries), layout], dtype=torch.int64, device=device)
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
    if not entries:
        return None

    shapes = torch.tensor([_layout_hash(n, t) for n, t in entries], dtype=torch.int64, device=device)
    zero = torch.zeros((), dtype=torch.int64, device=device)
    values = torch.stack([zero] + [zero if t is None else _fingerprint_tensor(t).to(device)
                                   for _, t in entries])[1:]
    fps = torch.stack([shapes, values], dim=1).reshape(-1)
    gathered = [torch.empty_like(fps) for _ in range(world)]
    dist.all_gather(gathered, fps, group=group)
    table = torch.stack(gathered).cpu()  # world x (2 * tensors)
    differ = (table != table[0]).any(dim=0).view(-1, 2).any(dim=1).nonzero().flatten().tolist()

    mismatches: list[TensorMismatch] = []
    for i in differ:
        name, t = entries[i]
        layouts = table[:, 2 * i].tolist()
        if len(set(layouts)) > 1:
            mismatches.append(TensorMismatch(name, _versions(layouts), None, "layout"))
            continue
        diff = _max_abs_diff(t, group, device) if t is not None else 0.0
        if atol > 0 and diff <= atol:
            continue
        mismatches.append(TensorMismatch(name, _versions(table[:, 2 * i + 1].tolist()), diff, "values"))
    if mismatches:
        log.debug("desync: %s", "; ".join(m.describe() for m in mismatches))
        raise DesyncError(mismatches)
    return None
