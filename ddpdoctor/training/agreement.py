"""The agreement step every collective helper takes first: one small exchange, then one decision.

Before a helper moves any data, every rank of the group contributes one fixed-size header to a
single all-gather: which helper it is in, the group's call number, a digest of what must match
(structure, dtypes, shapes, keys, dst/src), a short text describing its input, and whether its own
input already failed validation (with the reason). The first bytes of the data may ride in the same
all-gather, so a small gather is one collective in all. Every rank then applies the same rules to
the same table, so either every rank proceeds or every rank raises the same
:class:`CollectiveMismatchError`, naming the ranks and the difference. A rank whose input is bad
still takes part in the exchange, so no later call pairs with the wrong one.

A rank that does not arrive within ``timeout`` (it raised before calling, took another path, or is
stuck) cannot be waited out in the backend: the abandoned all-gather stays pending and would pair
with the next one. So the ranks that waited raise :class:`CollectiveTimeoutError`, a late rank that
finds their headers past their deadline raises the same, and every later helper call on that group
raises at once instead of returning something built from mismatched calls.
"""

from __future__ import annotations

import ctypes
import datetime
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.distributed as dist

from ddpdoctor.training.ranks import rank_device
from ddpdoctor.errors import DdpdoctorError

__all__ = ["CollectiveMismatchError", "CollectiveTimeoutError", "DEFAULT_TIMEOUT"]

#: Seconds a collective helper waits for every rank of its group to arrive, unless told otherwise.
DEFAULT_TIMEOUT = 600.0

_MAGIC = 0xDD0C0015
_WORDS = 8                        # magic, helper, call, failed, digest, deadline, two helper ints
_HEADER = struct.Struct("<5qd2q")
_TEXT = 192                       # the rank's input described, or its failure
HEADER_BYTES = _WORDS * 8 + _TEXT  # 256, a multiple of 8
_EAGER_MIN, _EAGER_BUDGET = 4096, 128 * 1024
_GRACE = 0.5                      # after a timeout: how long to wait for the others' marks


class CollectiveMismatchError(DdpdoctorError):
    """Ranks passed incompatible arguments to the same collective; raised alike on every rank."""


class CollectiveTimeoutError(CollectiveMismatchError):
    """Not every rank reached a collective helper within its timeout; the group is unusable after it."""


# Helper names by digest, to name the helpers when ranks called different ones.
_NAMES: dict[int, str] = {}


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8", "backslashreplace"))


@dataclass
class _GroupState:
    calls: int = 0
    capacity: int = _EAGER_MIN     # eager bytes per rank in the next header exchange (same on every rank)
    poisoned: Optional[tuple[str, str]] = None
    extra: dict[Any, Any] = field(default_factory=dict)
    buffers: dict[Any, torch.Tensor] = field(default_factory=dict)

    def scratch(self, role: str, numel: int, device: torch.device) -> torch.Tensor:
        """A reused byte buffer for this group's exchanges (fresh allocations cost more than a small one).

        Per group: after a timeout the abandoned exchange may still write into its group's buffers,
        and that group is never used again. Results never alias these: helpers copy out first.
        """
        key = (role, numel, device)
        buf = self.buffers.get(key)
        if buf is None:
            if len(self.buffers) > 8:
                self.buffers.clear()
            buf = self.buffers[key] = torch.zeros(numel, dtype=torch.uint8, device=device)
        return buf


_STATES: dict[Any, _GroupState] = {}


def group_state(group: Any) -> _GroupState:
    key = dist.group.WORLD if group is None else group
    state = _STATES.get(key)
    if state is None:
        if len(_STATES) > 64:  # groups destroyed and created again and again
            _STATES.clear()
        state = _STATES[key] = _GroupState()
    return state


def group_ranks(group: Any) -> list[int]:
    """The global ranks of ``group`` (the whole world for None)."""
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def check_timeout(what: str, timeout: Any) -> float:
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"{what}: timeout={timeout!r}: give a positive number of seconds")
    return float(timeout)


def _all_gather_single() -> Any:
    # torch 2.13 renamed all_gather_into_tensor (and warns on the old name); older versions lack the new one.
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class Agreement:
    """The decided exchange: every rank's helper ints and eager bytes (table rows, header first)."""

    ints: list[tuple[int, int]]
    table: torch.Tensor
    texts: Any
    capacity: int

    def eager(self, r: int, n: int) -> torch.Tensor:
        return self.table[r, HEADER_BYTES:HEADER_BYTES + n]


def agree(what: str, *, group: Any, timeout: float, digest: str, text: str,
          failed: Optional[BaseException] = None, ints: tuple[int, int] = (0, 0),
          payload: Optional[torch.Tensor] = None, eager: bool = False,
          detail: Optional[dict[str, str]] = None) -> Agreement:
    """Exchange headers (and, with ``eager``, the first bytes of ``payload``); raise alike on disagreement.

    Args:
        what: the helper, e.g. ``"gather()"``.
        digest: what must be identical on every rank (only its CRC travels).
        text: this rank's input, described for an error message (cut to fit).
        failed: this rank's own validation error; every rank then raises, naming it.
        ints: two helper-specific numbers every rank sees (e.g. payload length, rows).
        payload: this rank's bytes (uint8, 1-d); with ``eager`` up to the group's eager capacity ride along.
        detail: this rank's input as {path: description}; when the digests differ, every rank
            exchanges these (only then: one more exchange) so the error names the exact keys and entries.

    Raises:
        CollectiveMismatchError: on every rank, when ranks called different helpers, some rank's
            input failed, or the digests differ.
        CollectiveTimeoutError: not every rank arrived within ``timeout``; the group is unusable after it.
    """
    state = group_state(group)
    if state.poisoned is not None:
        raise CollectiveTimeoutError("collective-timeout", f"{what}: {state.poisoned[0]}", state.poisoned[1])
    ranks = group_ranks(group)
    world = len(ranks)
    device = rank_device()
    call = state.calls
    state.calls += 1
    helper = _crc(what)
    _NAMES[helper] = what
    capacity = state.capacity
    entered = time.time()
    message = f"{type(failed).__name__}: {failed}" if failed is not None else text
    raw = message.encode("utf-8", "backslashreplace")[:_TEXT]
    header = _HEADER.pack(_MAGIC, helper, call, int(failed is not None), _crc(digest), entered + timeout,
                          int(ints[0]), int(ints[1])) + raw.ljust(_TEXT, b"\0")
    buf = state.scratch("send", HEADER_BYTES + capacity, device)
    buf[:HEADER_BYTES] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
    if eager and payload is not None and failed is None and payload.numel():
        k = min(capacity, payload.numel())
        buf[HEADER_BYTES:HEADER_BYTES + k] = payload[:k]
    table = state.scratch("receive", world * buf.numel(), device)
    try:
        work = _all_gather_single()(table, buf, group=group, async_op=True)
        work.wait(timeout=datetime.timedelta(seconds=timeout))
    except RuntimeError as exc:
        _abandon(what, state, group, ranks, call, timeout, late=False, cause=exc)
    table = table.view(world, -1)
    heads = table[:, :_HEADER.size].cpu().contiguous() if table.device.type != "cpu" else table
    row = heads.stride(0)
    words = [list(_HEADER.unpack(ctypes.string_at(heads.data_ptr() + r * row, _HEADER.size))) for r in range(world)]
    texts = _Texts(table)
    me = dist.get_rank()
    if any(entered > words[r][5] for r in range(world) if ranks[r] != me):
        _abandon(what, state, group, ranks, call, timeout, late=True, cause=None)
    try:
        _decide(what, words, texts, ranks, call)
    except _Differ:
        _explain(what, group, ranks, detail, texts)
    except CollectiveMismatchError as err:
        if failed is not None:
            raise err from failed
        raise
    return Agreement([(row[6], row[7]) for row in words], table, texts, capacity)


class _Texts:
    """Every rank's header text, decoded only when an error message needs it."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def __getitem__(self, r: int) -> str:
        raw = bytes(self.table[r, _WORDS * 8:HEADER_BYTES].cpu().tolist())
        return raw.rstrip(b"\0").decode("utf-8", "replace")


def _decide(what: str, words: list[list[int]], texts: Any, ranks: list[int], call: int) -> None:
    """The same table gives the same verdict on every rank."""
    if any(row[0] != _MAGIC for row in words) or len({row[2] for row in words}) > 1:
        raise CollectiveMismatchError(
            "collective-out-of-step", f"{what}: ranks are out of step: " + ", ".join(
                f"rank {ranks[r]}: call #{row[2]}" for r, row in enumerate(words)),
            "every rank of the group must make the same helper calls in the same order")
    if len({row[1] for row in words}) > 1:
        raise CollectiveMismatchError(
            "collective-mismatch", f"call #{call}: ranks called different helpers: " + ", ".join(
                f"rank {ranks[r]}: {_NAMES.get(row[1], 'another helper')}" for r, row in enumerate(words)),
            "make every rank of the group call the same helpers in the same order")
    bad = [r for r, row in enumerate(words) if row[3]]
    if bad:
        raise CollectiveMismatchError(
            "collective-input", f"{what}: bad input on rank(s) {[ranks[r] for r in bad]}: " + "; ".join(
                f"rank {ranks[r]}: {texts[r]}" for r in bad),
            "fix the input on those ranks; every rank stopped here instead of waiting for them")
    if len({row[4] for row in words}) > 1:
        raise _Differ("collective-mismatch", "")


_HINT = "pass the same structure, keys, dtypes and shapes (beyond dim 0 for gathers) on every rank"


class _Differ(CollectiveMismatchError):
    """The digests differ; :func:`_explain` turns it into the error every rank raises."""


def _all_gather_pickled(obj: Any, group: Any, n: int) -> list[Any]:
    """Every rank's ``obj``: torch's ``all_gather_object`` without its numpy (a CPU torch wheel has none)."""
    import pickle

    device = rank_device()
    data = pickle.dumps(obj)
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(n)]
    dist.all_gather(lengths, length, group=group)
    sizes = [int(t.item()) for t in lengths]
    mine = torch.zeros(max(sizes), dtype=torch.uint8)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out = [torch.zeros_like(mine, device=device) for _ in range(n)]
    dist.all_gather(out, mine.to(device), group=group)
    return [pickle.loads(bytes(t[:size].cpu().tolist())) for t, size in zip(out, sizes)]


def _explain(what: str, group: Any, ranks: list[int], detail: Optional[dict[str, str]], texts: Any) -> None:
    """Raise the mismatch error: each rank's input, or with ``detail`` the exact entries that differ."""
    if detail is None:
        raise CollectiveMismatchError("collective-mismatch", f"{what}: ranks disagree: " + "; ".join(
            f"rank {ranks[r]}: {texts[r]}" for r in range(len(ranks))), _HINT)
    # Every rank saw the same differing digests, so every rank takes this second exchange.
    everyone = _all_gather_pickled(detail, group, len(ranks))
    paths = sorted(set().union(*everyone))
    lines = []
    for path in paths:
        have = [r for r in range(len(ranks)) if path in everyone[r]]
        if len(have) < len(ranks):
            lacking = [ranks[r] for r in range(len(ranks)) if r not in have]
            if len(have) < len(lacking):
                lines.append(f"{path} only on rank(s) {[ranks[r] for r in have]}")
            else:
                lines.append(f"{path} missing on rank(s) {lacking}")
        elif len({everyone[r][path] for r in have}) > 1:
            lines.append(f"{path}: " + ", ".join(f"rank {ranks[r]} {everyone[r][path]}" for r in have))
    if not lines:  # the same entries; the difference is elsewhere (dst, reduction, structure)
        lines = [f"rank {ranks[r]}: {texts[r]}" for r in range(len(ranks))]
    shown = "; ".join(lines[:8]) + (f"; and {len(lines) - 8} more" if len(lines) > 8 else "")
    raise CollectiveMismatchError("collective-mismatch", f"{what}: ranks disagree: {shown}", _HINT)


def _abandon(what: str, state: _GroupState, group: Any, ranks: list[int], call: int, timeout: float,
             late: bool, cause: Optional[BaseException]) -> None:
    """Mark the call abandoned in the store, name the ranks that did arrive, poison the group, raise."""
    me = dist.get_rank()
    arrived: list[int] = []
    try:
        store = dist.distributed_c10d._get_default_store()
        key = f"ddpdoctor/abandoned/{'-'.join(map(str, ranks))}/{call}"
        if late:
            mask = store.add(key, 0)
        else:
            mask = store.add(key, 1 << ranks.index(me))
            deadline = time.monotonic() + _GRACE
            while time.monotonic() < deadline:  # the others that waited mark theirs within moments
                time.sleep(0.05)
                newer = store.add(key, 0)
                if newer != mask:
                    mask, deadline = newer, time.monotonic() + _GRACE
        arrived = [r for i, r in enumerate(ranks) if mask >> i & 1]
    except Exception:  # noqa: BLE001 - the store may be gone with the rank that died
        pass
    missing = [r for r in ranks if r not in arrived] if arrived else None
    if cause is not None and "timed out" not in str(cause).lower():
        reason = (f"call #{call} failed in the backend ({str(cause).splitlines()[0][:200]}); a rank died or "
                  f"left the group")
    else:
        who = f"rank(s) {missing}" if missing else "some rank"
        reason = (f"call #{call} was abandoned: {who} did not reach it within {timeout:g}s (raised before "
                  f"calling it, took another code path, or are stuck)")
    reason += "; this process group is unusable from here (the abandoned collective would pair with the next one)"
    hint = "end the job, or destroy_process_group() and initialize again; find why those ranks did not call it"
    state.poisoned = (reason, hint)
    raise CollectiveTimeoutError("collective-timeout", f"{what}: {reason}", hint) from cause


def next_capacity(state: _GroupState, world: int, longest: Optional[int]) -> None:
    """Size the next exchange's eager part from this one's longest payload (identical on every rank)."""
    most = max(_EAGER_MIN, _EAGER_BUDGET // world // 8 * 8)
    if longest is None:
        state.capacity = _EAGER_MIN
    else:
        state.capacity = min(most, max(_EAGER_MIN, 1 << max(0, longest - 1).bit_length()))
