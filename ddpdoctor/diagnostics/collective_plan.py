"""The collectives a DDP job uses, with inputs whose exact results are known on every rank.

Shared by the ``collectives`` check and ``ddpdoctor bench``. For each operation there is a builder
that makes rank-encoded inputs, a function that runs the collective once, and the exact output every
rank must see. Values are small integers stored in the dtype under test, chosen so that every sum
(including every partial sum a ring or tree may form) is exact: a result that differs in any bit is
wrong, and the first wrong index with its expected and actual values is reported.

Timing follows NVIDIA's nccl-tests: per rank, the mean time of one call after warm-up (CUDA events
on GPU, a monotonic clock after a barrier on CPU); ``algbw = size / time`` and
``busbw = algbw * factor`` with nccl-tests' factors (:data:`BUS_FACTORS`).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

__all__ = [
    "BUS_FACTORS", "DTYPES", "OPS", "Group", "Step", "bandwidth", "build_step", "compare", "format_bytes",
    "ints_by_rank", "reduced_ints", "render_table", "select_ops", "support", "time_step", "unsupported_reason",
]

DTYPES = ("float32", "bfloat16", "float16", "int64")
# Largest integer up to which every integer is exact in the dtype.
_EXACT = {"float32": 2 ** 24, "bfloat16": 2 ** 8, "float16": 2 ** 11, "int64": 2 ** 62}
_SPREAD = 4  # values are (i + rank) % m + 1 + i % _SPREAD: they vary along the index too

# nccl-tests' bus bandwidth factors (doc/PERFORMANCE.md), by operation family.
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
    "barrier": lambda n: 0.0,
}

# name -> family; the run order of the correctness pass (barrier last).
OPS: dict[str, str] = {
    "all_reduce(sum)": "all_reduce",
    "all_reduce(max)": "all_reduce",
    "all_reduce(min)": "all_reduce",
    "all_reduce(avg)": "all_reduce",
    "broadcast(root=0)": "broadcast",
    "broadcast(root=last)": "broadcast",
    "all_gather(list)": "all_gather",
    "all_gather(tensor)": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "all_to_all": "all_to_all",
    "send_recv(ring)": "send_recv",
    "barrier": "barrier",
}


@dataclass(frozen=True)
class Group:
    """Where an operation runs: the global ranks in group order, this rank's index, the group handle.

    Attributes:
        ranks: global ranks, in group-rank order.
        me: this rank's index in ``ranks``.
        pg: the ``torch.distributed`` group (None for the whole world).
        label: for reports, e.g. ``world`` or ``inter-node (local rank 1: ranks 1,3)``.
    """

    ranks: tuple[int, ...]
    me: int
    pg: Any = None
    label: str = "world"

    @property
    def n(self) -> int:
        return len(self.ranks)


@dataclass
class Step:
    """One operation on one dtype and count, ready to run on this rank.

    Attributes:
        op: the operation's name (a key of :data:`OPS`).
        dtype: dtype name.
        count: elements each rank contributes.
        group: where it runs.
        run: performs the collective once.
        outputs: the tensors to compare with ``expected`` (empty for a barrier).
        expected: builds the exact flat expected output (on the CPU).
        reset: restores the inputs (in-place operations overwrite them).
        tolerance: relative tolerance (only AVG, where a backend may divide as it sums).
    """

    op: str
    dtype: str
    count: int
    group: Group
    run: Callable[[], None]
    outputs: Callable[[], list]
    expected: Callable[[], Any]
    reset: Callable[[], None] = lambda: None
    tolerance: float = 0.0
    element_size: int = 4

    @property
    def family(self) -> str:
        return OPS[self.op]

    @property
    def size_bytes(self) -> int:
        """The buffer size nccl-tests reports: the total buffer for gather/scatter/all_to_all."""
        whole = self.family in ("all_gather", "reduce_scatter", "all_to_all")
        return self.count * self.element_size * (self.group.n if whole else 1)

    @property
    def label(self) -> str:
        return self.op if self.family == "barrier" else f"{self.op} {self.dtype} x{self.count}"


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
            "int64": torch.int64}[name]


def _modulus(n: int, dtype: str, reduces: bool) -> int:
    """How many distinct rank patterns keep every value (and, for reductions, every sum) exact."""
    limit = _EXACT[dtype]
    if reduces:
        return min(n, limit // n - _SPREAD)
    return min(n, limit - _SPREAD)


def _ints(rank: int, count: int, m: int, offset: int = 0) -> Any:
    """Rank ``rank``'s values at indices ``offset..offset+count``: ``(i + rank) % m + 1 + i % 4``.

    The pattern is periodic, so one period is computed and tiled (a copy, not arithmetic per element).
    """
    period = m * _SPREAD // math.gcd(m, _SPREAD)
    start = offset % period
    return _tiled(rank, m, period, (start + count + period - 1) // period)[start:start + count]


def reduced_ints(kind: str, n: int, count: int, m: int, offset: int = 0) -> Any:
    """The elementwise sum, max or min over ranks ``0..n-1`` of :func:`_ints`, in O(count).

    A rank's value at index ``i`` is ``(i + rank) % m + 1 + i % _SPREAD`` with ``m <= n``, so the
    ``n`` consecutive ranks cover every residue: max and min are ``m - 1`` and ``0`` plus the rest,
    and the sum is ``n // m`` whole cycles plus the first ``n % m`` residues from ``i % m``. Looping
    over the ranks instead costs O(n * count) on every rank: at 128 ranks on 2 cores the
    collectives check spent its deadline there.
    """
    import torch

    if not 1 <= m <= n:
        raise ValueError(f"need 1 <= m <= n, got m={m}, n={n}")
    i = torch.arange(offset, offset + count, dtype=torch.int64)
    rest = 1 + i % _SPREAD
    if kind == "max":
        return rest + (m - 1)
    if kind == "min":
        return rest
    if kind != "sum":
        raise ValueError(f"unknown reduction {kind!r}")
    cycles, left = divmod(n, m)
    a = i % m
    first = left * a + left * (left - 1) // 2 - m * (a + left - m).clamp(min=0)
    return cycles * (m * (m - 1) // 2) + first + n * rest


def ints_by_rank(n: int, count: int, m: int, offset: int = 0) -> Any:
    """Every rank's :func:`_ints` at indices ``offset..offset+count``, one row per rank, in one
    vectorized step (a loop of ``n`` calls per rank was the 128-rank world's bottleneck)."""
    import torch

    r = torch.arange(n, dtype=torch.int64).unsqueeze(1)
    i = torch.arange(offset, offset + count, dtype=torch.int64).unsqueeze(0)
    return (i + r) % m + 1 + i % _SPREAD


@functools.lru_cache(maxsize=32)
def _tiled(rank: int, m: int, period: int, reps: int) -> Any:
    """One rank's periodic pattern repeated ``reps`` times (cached: never modify the result)."""
    import torch

    i = torch.arange(period, dtype=torch.int64)
    return ((i + rank) % m + 1 + i % _SPREAD).repeat(max(reps, 1))


def support(backend: str, op: str, dtype: str, n: int) -> Optional[str]:
    """Why ``op`` on ``dtype`` cannot be checked exactly in a group of ``n`` ranks, or None."""
    if op == "all_reduce(avg)" and dtype == "int64":
        return "AVG needs a floating dtype"
    if op == "all_reduce(avg)" and backend not in ("gloo", "nccl"):
        return f"AVG is not implemented by {backend}"
    if OPS[op] != "barrier" and _modulus(n, dtype, OPS[op] in ("all_reduce", "reduce_scatter")) < 1:
        return f"sums over {n} ranks are not exact in {dtype}"
    return None


def unsupported_reason(exc: BaseException) -> Optional[str]:
    """The backend's own "not supported" message from an exception, or None if it is a real error."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    low = text.lower()
    if any(k in low for k in ("not supported", "unsupported", "not implemented", "cannot use reduceop")):
        return text[:160]
    return None


def build_step(op: str, dtype: str, count: int, group: Group, device: str) -> Step:
    """Rank-encoded inputs for ``op`` on this rank, the call, and the exact expected output."""
    import torch
    import torch.distributed as dist

    family = OPS[op]
    n, me, pg = group.n, group.me, group.pg
    tdt = _torch_dtype(dtype)
    m = max(_modulus(n, dtype, family in ("all_reduce", "reduce_scatter")), 1)

    def make(rank: int, k: int, offset: int = 0) -> Any:
        return _ints(rank, k, m, offset).to(device=device, dtype=tdt, copy=True)

    esize = torch.empty((), dtype=tdt).element_size()
    common = dict(op=op, dtype=dtype, count=count, group=group, element_size=esize)
    if family == "all_reduce":
        kind = op[len("all_reduce("):-1]
        x = make(me, count)
        src = x.clone()
        red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
               "avg": dist.ReduceOp.AVG}[kind]

        def expected() -> Any:
            acc = reduced_ints("sum" if kind == "avg" else kind, n, count, m)
            return (acc.double() / n).to(tdt) if kind == "avg" else acc.to(tdt)

        eps = torch.finfo(tdt).eps if tdt.is_floating_point else 0.0
        return Step(run=lambda: dist.all_reduce(x, op=red, group=pg), outputs=lambda: [x], expected=expected,
                    reset=lambda: x.copy_(src), tolerance=eps if kind == "avg" else 0.0, **common)
    if family == "broadcast":
        root = 0 if op.endswith("=0)") else n - 1
        x = make(me, count)
        src = x.clone()
        return Step(run=lambda: dist.broadcast(x, src=group.ranks[root], group=pg), outputs=lambda: [x],
                    expected=lambda: _ints(root, count, m).to(tdt), reset=lambda: x.copy_(src), **common)
    if family == "all_gather":
        x = make(me, count)
        whole = lambda: ints_by_rank(n, count, m).reshape(-1).to(tdt)  # noqa: E731
        if op == "all_gather(list)":
            outs = [torch.zeros(count, dtype=tdt, device=device) for _ in range(n)]
            return Step(run=lambda: dist.all_gather(outs, x, group=pg), outputs=lambda: outs, expected=whole,
                        **common)
        out = torch.zeros(count * n, dtype=tdt, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return Step(run=lambda: gather(out, x, group=pg), outputs=lambda: [out], expected=whole, **common)
    if family == "reduce_scatter":
        x = make(me, count * n)
        out = torch.zeros(count, dtype=tdt, device=device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

        def expected_rs() -> Any:
            return reduced_ints("sum", n, count, m, me * count).to(tdt)

        return Step(run=lambda: scatter(out, x, group=pg), outputs=lambda: [out], expected=expected_rs, **common)
    if family == "all_to_all":
        x = make(me, count * n)  # chunk c goes to group rank c
        out = torch.zeros(count * n, dtype=tdt, device=device)
        return Step(run=lambda: dist.all_to_all_single(out, x, group=pg), outputs=lambda: [out],
                    expected=lambda: ints_by_rank(n, count, m, me * count).reshape(-1).to(tdt),
                    **common)
    if family == "send_recv":
        x = make(me, count)
        out = torch.zeros(count, dtype=tdt, device=device)
        nxt, prev = group.ranks[(me + 1) % n], group.ranks[(me - 1) % n]

        def ring() -> None:
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt, pg), dist.P2POp(dist.irecv, out, prev, pg)])
            for w in works:
                w.wait()

        return Step(run=ring, outputs=lambda: [out], expected=lambda: _ints((me - 1) % n, count, m).to(tdt), **common)
    if family == "barrier":
        return Step(run=lambda: dist.barrier(group=pg), outputs=lambda: [], expected=lambda: None,
                    **{**common, "count": 0})
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


def _number(value: Any) -> Any:
    v = value.item()
    return int(v) if isinstance(v, int) else float(v)


def compare(step: Step) -> Optional[dict]:
    """None when every element of the output is exact, else where and how it is wrong.

    Returns:
        ``{"index", "expected", "actual", "wrong", "of"}``: the first wrong flat index of the
        output (list outputs are concatenated), both values, and how many elements are wrong.
    """
    import torch

    outs = step.outputs()
    if not outs:
        return None
    actual = torch.cat([o.reshape(-1) for o in outs]).cpu()
    expected = step.expected()
    if step.tolerance:
        a, e = actual.double(), expected.double()
        bad = ~((a - e).abs() <= step.tolerance * e.abs())
    else:
        bad = actual != expected
    if not bool(bad.any()):
        return None
    index = int(bad.nonzero()[0])
    return {"index": index, "expected": _number(expected[index]), "actual": _number(actual[index]),
            "wrong": int(bad.sum()), "of": int(actual.numel())}


def time_step(step: Step, iters: int, warmup: int, arrive: Callable[[Step], None], device: str) -> dict:
    """Time ``iters`` calls of ``step``: ``warmup`` untimed calls, a barrier, then the timed calls.

    ``arrive`` runs before each call (outside the timed window); the time it takes is this rank's
    lag: a rank that is consistently late makes every other rank wait inside the collective.

    Returns:
        ``{"time_us": mean time of one call, "lag_us": mean time to reach the call}``.
    """
    import torch
    import torch.distributed as dist

    cuda = device.startswith("cuda")
    events: list[tuple[Any, Any]] = []
    op_seconds = lag_seconds = 0.0
    for _ in range(warmup):
        arrive(step)
        step.run()
    dist.barrier(group=step.group.pg)
    for _ in range(iters):
        t_a = time.perf_counter()
        arrive(step)
        t_b = time.perf_counter()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step.run()
            end.record()
            events.append((start, end))
        else:
            step.run()
            op_seconds += time.perf_counter() - t_b
        lag_seconds += t_b - t_a
    if cuda:
        torch.cuda.synchronize()
        op_seconds = sum(s.elapsed_time(e) for s, e in events) / 1000.0
    return {"time_us": op_seconds / iters * 1e6, "lag_us": lag_seconds / iters * 1e6}


def bandwidth(size_bytes: int, time_us: float, family: str, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes per second), as nccl-tests computes them."""
    if time_us <= 0:
        return 0.0, 0.0
    algbw = size_bytes / (time_us * 1e-6) / 1e9
    return algbw, algbw * BUS_FACTORS[family](n)


def select_ops(names: Sequence[str]) -> list[str]:
    """Operation names from ``--ops`` entries, each an operation (``all_reduce(max)``) or a family.

    Raises:
        ValueError: an entry that names neither, with the known names.
    """
    out: list[str] = []
    for name in names:
        hits = [op for op, fam in OPS.items() if name in (op, fam)]
        if not hits:
            raise ValueError(f"no collective named {name!r}; use one of: {', '.join(sorted(set(OPS.values())))}")
        out.extend(h for h in hits if h not in out)
    return [op for op in OPS if op in out]


def format_bytes(n: int) -> str:
    """``1048576`` -> ``"1.0 MiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover


def render_table(rows: Sequence[dict]) -> list[str]:
    """nccl-tests-like lines: size, count, type, op, time, algbw, busbw, #wrong."""
    head = [f"{'size':>12} {'count':>12} {'type':>9} {'op':<21} {'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}",
            f"{'(B)':>12} {'(elements)':>12} {'':>9} {'':<21} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}"]
    body = [f"{r['size']:>12} {r['count']:>12} {r['dtype']:>9} {r['op']:<21} {r['time_us']:>10.1f} "
            f"{r['algbw']:>8.3f} {r['busbw']:>8.3f} {r['wrong']:>7}" for r in rows]
    return [line.rstrip() for line in head] + body
