"""Checks ``collectives`` and ``collectives-bench``: exact results on every rank, bandwidth, stragglers.

``collectives`` (default, under a second on 2 CPU ranks; its work adapts to the world, see
:func:`work_shrink`) runs every operation a DDP job uses on
rank-encoded data whose exact result is known: in float32 at three sizes (small, odd, and large
enough to leave the small-message path), in every other dtype the backend supports at the odd size
(all_reduce also at the large one); over the whole world and, when there are several nodes, within
each node and across nodes separately, so a bad node or link is isolated. It then times the main
operations at 1 MiB and reports nccl-tests' algbw and busbw, names a rank that is consistently late
(a straggler) and, with ``--min-busbw``, fails when the bandwidth is below a floor.

``collectives-bench`` (on request: ``ddpdoctor bench``) sweeps sizes from bytes to a maximum and
prints a table like nccl-tests'.

Test seams: :meth:`CollectivesCheck.collective` (runs one operation and records progress),
:meth:`CollectivesCheck.received` (sees each result before it is compared) and
:meth:`CollectivesCheck.arrive` (runs before each timed call); tests subclass the check and override
them on one rank to skip, perturb or slow it. Production code has no fault hooks.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import replace
from typing import Any, Optional, Sequence

from ddpdoctor.check import Check, CheckResult, RankContext, Requirements, WorldInfo
from ddpdoctor.diagnostics.collective_plan import (DTYPES, OPS, Group, Step, bandwidth, build_step, compare,
                                                   format_bytes, render_table, select_ops, support, time_step,
                                                   unsupported_reason)
from ddpdoctor.result import Outcome, Status, count, format_ranks, merge_outcomes, rank_label

__all__ = ["CollectivesCheck", "CollectivesBenchCheck", "bench_rows", "progress_key"]

SIZES = (8, 1531, 65539)  # elements per rank: small, odd, large (256 KiB in float32: past NCCL's LL protocol)
TIMED_COUNT = 262147  # elements per rank in the timed pass (1 MiB in float32)
TIMED = ("all_reduce(sum)", "all_gather(tensor)", "reduce_scatter", "all_to_all", "broadcast(root=last)",
         "send_recv(ring)")
CPU_SLACK = 4.0  # a CPU world may spend this many times the 2-rank world's collective work before shrinking
CROWDED = 4.0  # work_shrink from which a CPU world checks fewer cases and times fewer calls (see cases)
PACKED = 256.0  # work_shrink from which a CPU world checks each operation once (see cases)
TIMED_SHARE = 0.5  # the timed pass runs only if it is projected to end within this share of the deadline
CHECKED_SHARE = 0.5  # a crowded world's later tiers of exact-result cases must fit this share of the deadline
CROWDED_LARGE = ("all_reduce(sum)", "all_gather(tensor)", "reduce_scatter")  # DDP's and FSDP's operations
STRAGGLER_FLOOR_US = 2000.0  # a rank must be this much later than the median (or one call) to count

WRONG_HINT = ("{ranks} received wrong data: rerun with NCCL_DEBUG=INFO, check that node's GPUs for ECC/Xid "
              "errors (nvidia-smi -q -d ECC) and isolate the transport with NCCL_P2P_DISABLE=1 or "
              "NCCL_SHM_DISABLE=1; exclude the node if it repeats")
STRAGGLER_HINT = ("look at rank {rank}'s host: CPU or GPU contention (top, nvidia-smi), throttled clocks, "
                  "a noisy neighbour; confirm with `ddpdoctor bench`")
BUSBW_HINT = ("the interconnect is slower than --min-busbw: check the transport NCCL picked "
              "(NCCL_DEBUG=INFO: NET/IB vs NET/Socket), NCCL_SOCKET_IFNAME/NCCL_IB_HCA, and run `ddpdoctor bench`")


def work_shrink(world_size: int, ranks_per_core: float, device: str) -> float:
    """How much smaller than ``SIZES[2]`` and ``TIMED_COUNT`` this world's large buffers must be.

    Every rank's share of a world's collective work grows with the world: a gather-type buffer
    holds ``count * n`` elements, and each rank computes its expected result from all ``n`` ranks'
    patterns. On CPU ranks that share cores, the world's total, about ``n * n * count``, runs on
    ``min(cores, n)`` cores: unscaled, 32 ranks on 2 cores spent more than the 30 s deadline in the
    default check. So on CPU the counts shrink by ``n^2 / (2 * CPU_SLACK * min(cores, n))`` (1 up to
    4 ranks on 2 cores, 8 ranks on 16; 4 at 8 ranks on 2 cores, 64 at 32), and on GPUs,
    where each rank has its own device, only past 16 Mi elements of expected values per rank.
    ``ranks_per_core`` is the most crowded node's ranks per core (the ranks agree on it first).
    """
    n = max(world_size, 1)
    if device != "cpu":
        return max(1.0, n * SIZES[2] / float(1 << 24))
    cores = max(1.0, n / max(ranks_per_core, 1.0))  # the cores a node of n ranks shares
    return max(1.0, n * n / (2.0 * CPU_SLACK * min(cores, float(n))))


def scaled_count(count: int, shrink: float, floor: int) -> int:
    """``count / shrink``, odd (no power-of-two alignment), at least ``floor``."""
    return max(floor, int(count / shrink) | 1)


def progress_key(check: str, rank: int) -> str:
    """Control-store key where ``rank`` records the last operation it entered (for hang reports)."""
    return f"ddpdoctor/coll/progress/{check}/{rank}"


class CollectivesCheck(Check):
    """Every collective returns the exact result on every rank; bandwidth; stragglers."""

    name = "collectives"
    description = ("all_reduce/broadcast/all_gather/reduce_scatter/all_to_all/send-recv/barrier exact on every "
                   "rank; busbw; stragglers")
    requires = Requirements(min_world_size=2, process_group=True)
    iters = 5
    warmup = 2
    shrink = 1.0  # set per run from the world (work_shrink)
    _seq = 0  # operations entered on this rank, in run order (progress for hang reports)
    _last = 0  # the last operation this rank finished

    # -- seams ------------------------------------------------------------------------------------

    def collective(self, ctx: RankContext, step: Step) -> None:
        """Record that this rank entered ``step`` (control store), then run it once."""
        self._seq += 1
        self._record(ctx, step.label, step.group.label)
        step.run()
        self._last = self._seq

    def received(self, ctx: RankContext, step: Step) -> None:
        """Called with each result before it is compared (tests perturb it here)."""

    def arrive(self, ctx: RankContext, step: Step) -> None:
        """Called before each timed call, outside the timed window (tests slow a rank here)."""

    # -- rank side --------------------------------------------------------------------------------

    def _record(self, ctx: RankContext, op: str, group: str) -> None:
        """Control store: this rank now enters operation number ``_seq`` (``prev``: the last it finished)."""
        value = {"seq": self._seq, "prev": self._last, "op": op, "group": group}
        ctx.store.set(progress_key(self.name, ctx.rank), json.dumps(value))

    def _decide(self, ctx: RankContext, yes: bool, what: str) -> bool:
        """Rank 0's ``yes`` on every rank (a broadcast, recorded as progress like any operation)."""
        self._seq += 1
        self._record(ctx, f"broadcast(plan: {what})", "world")
        yes = _rank0_says(ctx, yes)
        self._last = self._seq
        return yes

    def cases(self, group: Group) -> list[tuple[str, str, int]]:
        """(op, dtype, count) in run order. In the world: every op in float32 at all 3 sizes, in the
        other dtypes at the odd size, and all_reduce(sum) at the large size in every dtype. In the
        intra-/inter-node groups: float32 at the small and odd sizes.

        A crowded CPU world (``shrink >= CROWDED``: e.g. 8 or more ranks on 2 cores, 32 on 16), where every
        collective's latency is the time for its ranks to get a core in turn, checks fewer cases:
        float32 at the odd size (the small size exercises the same path), at the large size only in
        the operations DDP and FSDP use (all_reduce(sum), all_gather(tensor), reduce_scatter), and
        the other dtypes in all_reduce(sum) and all_gather(tensor) only. A packed one
        (``shrink >= PACKED``: e.g. 64 ranks or more on 2 cores) checks every operation once in
        float32 at the odd size and the other dtypes in all_reduce(sum) only. In both, the cases run
        in tiers (:meth:`tiers`) and a later tier runs only if it fits the deadline.
        """
        world = group.label == "world"
        crowded = self.shrink >= CROWDED
        packed = self.shrink >= PACKED
        small, odd, large = SIZES
        large = scaled_count(large, self.shrink, odd)
        out = []
        for op, family in OPS.items():
            if family == "barrier":
                out.append((op, "float32", 0))
                continue
            for dtype in DTYPES if world else ("float32",):
                if dtype == "float32":
                    counts = [small, odd, large] if world else [small, odd]
                    if crowded:
                        counts = counts[1:2] if packed or op not in CROWDED_LARGE else counts[1:]
                elif packed and op != "all_reduce(sum)":
                    counts = []
                elif packed:
                    counts = [odd]
                elif crowded and op not in ("all_reduce(sum)", "all_gather(tensor)"):
                    counts = []
                else:
                    counts = [odd, large] if op == "all_reduce(sum)" else [odd]
                out.extend((op, dtype, count) for count in counts)
        return out

    def tiers(self, cases: Sequence[tuple[str, str, int]]) -> list[list[tuple[str, str, int]]]:
        """The cases in the order they run, in tiers: one tier (``cases`` as given) in a world that is
        not crowded; in a crowded one, every operation once in float32 at the odd size, then the
        other dtypes, then the other sizes. A later tier runs only if it is projected to fit."""
        if self.shrink < CROWDED:
            return [list(cases)]
        odd = SIZES[1]
        first = [c for c in cases if c[1] == "float32" and c[2] in (odd, 0)]
        dtypes = [c for c in cases if c[1] != "float32"]
        sizes = [c for c in cases if c not in first and c not in dtypes]
        return [t for t in (first, dtypes, sizes) if t]

    def run(self, ctx: RankContext) -> Outcome:
        ctx.process_group()
        started = time.monotonic()
        self._seq = self._last = 0
        world = Group(tuple(range(ctx.world_size)), ctx.rank)
        per_core = ctx.ranks_per_core if ctx.ranks_per_core is not None else _agreed_max(ctx, _ranks_per_core(ctx))
        self.shrink = work_shrink(ctx.world_size, per_core, ctx.device)
        found: dict[str, Any] = {"checked": 0, "wrong": [], "skipped": [], "timings": [], "groups": ["world"],
                                 "shrink": self.shrink}
        tiers = self.tiers(self.cases(world))
        for n, tier in enumerate(tiers):
            if n > 0:  # rank 0 decides from its own progress (the ranks move in lockstep) and says so
                spent = time.monotonic() - started
                projected = spent + spent / max(self._seq, 1) * len(tier)
                if not self._decide(ctx, projected <= CHECKED_SHARE * ctx.deadline, "next tier"):
                    left = sum(len(t) for t in tiers[n:])
                    found["skipped"].append(f"{count(left, 'case')} in other dtypes and sizes: the "
                                            f"{ctx.world_size} ranks' collectives take {spent / max(self._seq, 1):.2f}s "
                                            f"each, more would not fit the {ctx.deadline:g}s deadline")
                    break
            self._correctness(ctx, world, tier, found)
        for group in self._node_groups(ctx, found):
            found["groups"].append(group.label)
            self._correctness(ctx, group, self.cases(group), found)
        found["collective_seconds"] = round((time.monotonic() - started) / max(self._seq, 1), 4)
        # Measured progress decides the timed pass: the time per collective so far, times the calls
        # the pass makes, must end within TIMED_SHARE of the deadline (rank 0 decides for everyone).
        # A crowded CPU world skips it unless --min-busbw asks for the bandwidth: its ranks take turns
        # on shared cores, so the time measures the scheduler, not the link, and it gets no straggler
        # verdict (they are late by turns); the pass would only add collectives.
        iters, warmup = (self.iters, self.warmup) if self.shrink < CROWDED else (3, 1)
        spent = time.monotonic() - started
        projected = spent + spent / max(self._seq, 1) * len(TIMED) * (iters + warmup + 1)
        if ctx.device == "cpu" and self.shrink >= CROWDED and ctx.options.get("min_busbw") is None:
            found["skipped"].append(f"timed pass: {ctx.world_size} ranks share the CPU cores, so a collective's time "
                                    "measures their turns on the cores, not the link (--min-busbw runs it)")
        elif self._decide(ctx, projected <= TIMED_SHARE * ctx.deadline, "timed pass"):
            self._timings(ctx, world, found, iters, warmup)
        else:
            found["skipped"].append(f"timed pass: projected to end at {projected:.1f}s of the {ctx.deadline:g}s "
                                    f"deadline ({ctx.world_size} ranks; the exact-result passes took {spent:.1f}s)")
        if found["wrong"]:
            first = found["wrong"][0]
            return ctx.failed(_wrong_text(first, [ctx.rank]), hint=WRONG_HINT.format(ranks=f"rank {ctx.rank}"),
                              finding="collective-wrong-result", data=found)
        return ctx.passed(f"{count(found['checked'], 'result')} exact", data=found)

    def _correctness(self, ctx: RankContext, group: Group, cases: Sequence[tuple[str, str, int]],
                     found: dict) -> None:
        for op, dtype, elements in cases:
            reason = support(ctx.backend, op, dtype, group.n)
            if reason is None:
                step = build_step(op, dtype, elements, group, ctx.device)
                try:
                    self.collective(ctx, step)
                except (RuntimeError, ValueError) as exc:
                    reason = unsupported_reason(exc)
                    if reason is None:
                        raise
            if reason is not None:
                entry = f"{op} {dtype} ({group.label}): {reason}"
                if entry not in found["skipped"]:
                    found["skipped"].append(entry)
                continue
            self.received(ctx, step)
            bad = compare(step)
            found["checked"] += 1
            if bad is not None:
                found["wrong"].append({"seq": self._seq, "label": step.label, "group": group.label, "op": op,
                                       "dtype": dtype, "count": elements, **bad})

    def _node_groups(self, ctx: RankContext, found: dict) -> list[Group]:
        """This rank's intra-node and inter-node groups (created on every rank in the same order).

        The option ``fake_local_world_size`` (testing aid) pretends that many ranks per node.
        """
        import torch.distributed as dist

        n = ctx.world_size
        fake = ctx.options.get("fake_local_world_size")
        if fake:
            nodes = [r // int(fake) for r in range(n)]
        elif len(ctx.hosts) == n and all(ctx.hosts):  # the runner told every rank (no collective)
            order = list(dict.fromkeys(ctx.hosts))
            nodes = [order.index(h) for h in ctx.hosts]
        else:
            from ddpdoctor.training.gathering import gather_object  # torch's all_gather_object needs numpy

            self._seq += 1
            self._record(ctx, "all_gather_object(hostnames)", "world")
            hosts: list[Any] = gather_object(ctx.hostname)
            self._last = self._seq
            order = list(dict.fromkeys(hosts))
            nodes = [order.index(h) for h in hosts]
        members: dict[int, list[int]] = {}
        for r, node in enumerate(nodes):
            members.setdefault(node, []).append(r)
        found["nodes"] = len(members)
        if len(members) < 2:
            found["skipped"].append("intra-/inter-node passes: one node, no inter-node link to check")
            return []
        wanted: list[tuple[list[int], str]] = []
        for node, ranks in sorted(members.items()):
            wanted.append((ranks, f"intra-node (node {node}: ranks {format_ranks(ranks)})"))
        for j in range(max(len(v) for v in members.values())):
            ranks = [v[j] for _, v in sorted(members.items()) if len(v) > j]
            wanted.append((ranks, f"inter-node (local rank {j}: ranks {format_ranks(ranks)})"))
        groups = []
        for ranks, label in wanted:
            if len(ranks) < 2:
                continue
            pg = dist.new_group(ranks)
            if ctx.rank in ranks:
                groups.append(Group(tuple(ranks), ranks.index(ctx.rank), pg, label))
        return groups

    def _timings(self, ctx: RankContext, world: Group, found: dict, iters: int, warmup: int) -> None:
        for op in TIMED:
            step = build_step(op, "float32", scaled_count(TIMED_COUNT, self.shrink, SIZES[1]), world, ctx.device)
            self._seq += 1
            self._record(ctx, step.label, "world, timed")
            t = time_step(step, iters, warmup, lambda s: self.arrive(ctx, s), ctx.device)
            self._last = self._seq
            found["timings"].append({"op": op, "family": OPS[op], "dtype": step.dtype, "count": step.count,
                                     "size": step.size_bytes, "elements": step.size_bytes // step.element_size,
                                     **t})

    # -- coordinator side -------------------------------------------------------------------------

    def merge(self, outcomes: Sequence[Outcome], world: WorldInfo) -> CheckResult:
        merged = merge_outcomes(self.name, outcomes)
        data = {o.rank: o.data for o in outcomes if "checked" in o.data}
        if len(data) != len(outcomes) or not data:
            return merged
        n = world.world_size
        rows = bench_rows(outcomes, n)
        details = (_wrong_lines(data) + render_table(rows) + _per_rank_lines(data)
                   + [f"skipped: {s}" for s in _skips(data)])
        base = dict(outcomes=merged.outcomes, duration=merged.duration, details=tuple(details))
        crowded = any(d.get("shrink", 1.0) >= CROWDED for d in data.values())
        # ranks that take turns on shared cores are late by turns: no straggler verdict there
        verdict = (_wrong_verdict(data) or _busbw_verdict(rows, world)
                   or (None if crowded else _straggler_verdict(data)))
        if verdict is not None:
            status, summary, hint, finding, ranks = verdict
            return CheckResult(self.name, status, summary, hint=hint, finding=finding, ranks=ranks, **base)
        return CheckResult(self.name, merged.status, self._pass_summary(data, rows, n), **base)

    def _pass_summary(self, data: dict, rows: list[dict], n: int) -> str:
        any_rank = data[min(data)]
        checked = sum(d["checked"] for d in data.values())
        skipped = len(_skips(data))
        where = "every rank" + (f", within and across {any_rank.get('nodes', 1)} nodes"
                                if any_rank.get("nodes", 1) > 1 else "")
        text = f"{count(checked, 'result')} exact on {where} ({count(n, 'rank')}"
        text += f", {skipped} skipped)" if skipped else ")"
        ar = next((r for r in rows if r["op"] == "all_reduce(sum)"), None)
        if ar is not None:
            text += f"; all_reduce busbw {ar['busbw']:.2f} GB/s at {format_bytes(ar['size'])}"
        return text

    def explain_trouble(self, result: CheckResult, store: Any, world: WorldInfo) -> CheckResult:
        """Add which ranks never reached which operation, from the progress each rank recorded."""
        progress: dict[int, dict] = {}
        try:
            for r in range(world.world_size):
                key = progress_key(self.name, r)
                if store.check([key]):
                    progress[r] = json.loads(store.get(key))
        except Exception:  # noqa: BLE001 - the plain hang report is still right
            return result
        if not progress:
            return result
        labels = {p["seq"]: p["op"] for p in progress.values()}
        skipped = [f"rank {r} skipped " + ", ".join(f"#{k}" + (f" {labels[k]}" if k in labels else "")
                                                   for k in range(p.get("prev", p["seq"] - 1) + 1, p["seq"]))
                   for r, p in sorted(progress.items()) if p.get("prev", p["seq"] - 1) < p["seq"] - 1]
        furthest = max(p["seq"] for p in progress.values())
        ahead = sorted(r for r, p in progress.items() if p["seq"] == furthest)
        behind: dict[str, list[int]] = {}
        for r in range(world.world_size):
            if r in ahead:
                continue
            p = progress.get(r)
            last = f"last entered #{p['seq']} {p['op']}" if p else "entered no collective"
            behind.setdefault(last, []).append(r)
        if not behind and not skipped:
            return result
        top = progress[ahead[0]]
        parts = skipped + [f"{rank_label(rs)} never reached #{furthest} {top['op']} in {top['group']} ({last})"
                 for last, rs in behind.items()]
        if behind:
            parts.append(f"{rank_label(ahead)} entered it")
        lines = tuple(f"progress: rank {r}: #{p['seq']} {p['op']} ({p['group']})" for r, p in sorted(progress.items()))
        return replace(result, summary="; ".join(parts) + "; " + result.summary, details=result.details + lines)


class CollectivesBenchCheck(CollectivesCheck):
    """The full sweep for ``ddpdoctor bench``: sizes from bytes to a maximum, every operation."""

    name = "collectives-bench"
    description = "nccl-tests-like sweep of every collective over sizes (ddpdoctor bench)"
    slow = True
    on_request = True

    def run(self, ctx: RankContext) -> Outcome:
        ctx.process_group()
        self._seq = self._last = 0
        opts = dict(ctx.options.get("bench") or {})
        ops = select_ops(opts.get("ops") or [op for op in OPS if op != "barrier"])
        dtype = opts.get("dtype", "float32")
        iters, warmup = int(opts.get("iters", 20)), int(opts.get("warmup", 5))
        world = Group(tuple(range(ctx.world_size)), ctx.rank)
        found: dict[str, Any] = {"checked": 0, "wrong": [], "skipped": [], "timings": [], "groups": ["world"]}
        for size in _sizes(int(opts.get("min_bytes", 8)), int(opts.get("max_bytes", 16 << 20))):
            for op in ops:
                self._bench_one(ctx, world, op, dtype, size, iters, warmup, found)
        if found["wrong"]:
            return ctx.failed(_wrong_text(found["wrong"][0], [ctx.rank]), finding="collective-wrong-result",
                              hint=WRONG_HINT.format(ranks=f"rank {ctx.rank}"), data=found)
        return ctx.passed(count(len(found['timings']), 'row'), data=found)

    def _bench_one(self, ctx: RankContext, world: Group, op: str, dtype: str, size: int, iters: int,
                   warmup: int, found: dict) -> None:
        reason = support(ctx.backend, op, dtype, world.n)
        if reason is not None:
            if f"{op} {dtype}: {reason}" not in found["skipped"]:
                found["skipped"].append(f"{op} {dtype}: {reason}")
            return
        probe = build_step(op, dtype, 1, world, "cpu")
        whole = OPS[op] in ("all_gather", "reduce_scatter", "all_to_all")
        count = size // (probe.element_size * (world.n if whole else 1))
        if count < 1 and OPS[op] != "barrier":
            return
        step = build_step(op, dtype, count, world, ctx.device)
        self.collective(ctx, step)
        self.received(ctx, step)
        bad = compare(step)
        found["checked"] += 1
        if bad is not None:
            found["wrong"].append({"seq": self._seq, "label": step.label, "group": "world", "op": op,
                                   "dtype": dtype, "count": count, **bad})
        t = time_step(step, iters, warmup, lambda s: self.arrive(ctx, s), ctx.device)
        entry = {"op": op, "family": OPS[op], "dtype": dtype, "count": count, "size": step.size_bytes,
                 "elements": step.size_bytes // step.element_size, "wrong": bad["wrong"] if bad else 0, **t}
        # for the table printed as it is measured (measured(), on the supervisor): outside the timed calls
        ctx.store.set(row_key(self.name, len(found["timings"]), ctx.rank), json.dumps(entry))
        found["timings"].append(entry)

    def measured(self, store: Any, world: WorldInfo) -> list:
        """The rows every rank has timed since the last call, in sweep order (``bench`` prints each at once)."""
        rows = []
        n = world.world_size
        shown = getattr(self, "_rows_shown", 0)
        while n:
            keys = [row_key(self.name, shown, r) for r in range(n)]
            if not store.check(keys):  # not every rank timed this row yet: never waits
                break
            entries = {r: json.loads(store.get(k)) for r, k in enumerate(keys)}
            rows.append(bench_row(entries[0], entries, n))
            shown += 1
        self._rows_shown = shown
        return rows

    def merge(self, outcomes: Sequence[Outcome], world: WorldInfo) -> CheckResult:
        result = super().merge(outcomes, world)
        rows = bench_rows(outcomes, world.world_size)
        if result.status == Status.PASS and rows:
            peak = max((r for r in rows if r["op"] == "all_reduce(sum)"), key=lambda r: r["busbw"], default=None)
            avg = statistics.mean(r["busbw"] for r in rows if r["family"] != "barrier") if any(
                r["family"] != "barrier" for r in rows) else 0.0
            text = f"{count(len(rows), 'row')} exact on every rank; avg busbw {avg:.3f} GB/s"
            if peak is not None:
                text += f"; peak all_reduce busbw {peak['busbw']:.3f} GB/s at {format_bytes(peak['size'])}"
            result = replace(result, summary=text)
        return result


def _sizes(lo: int, hi: int) -> list[int]:
    """Powers of two from ``lo`` to ``hi`` bytes (nccl-tests' ``-b lo -e hi -f 2``)."""
    out, size = [], max(1, lo)
    while size <= hi:
        out.append(size)
        size *= 2
    return out


def bench_rows(outcomes: Sequence[Outcome], n: int) -> list[dict]:
    """One row per timed case: the time averaged over ranks (as nccl-tests), algbw, busbw, wrong count,
    and each rank's own time and lag."""
    per_rank = {o.rank: o.data.get("timings", []) for o in outcomes}
    if not per_rank or not all(per_rank.values()):
        return []
    first = per_rank[min(per_rank)]
    return [bench_row(case, {r: t[i] for r, t in per_rank.items() if len(t) > i}, n) for i, case in enumerate(first)]


def bench_row(case: dict, entries: dict, n: int) -> dict:
    """One row of the table from each rank's timing of one case (``entries``: rank -> its timing)."""
    times = {r: e["time_us"] for r, e in entries.items()}
    lags = {r: e["lag_us"] for r, e in entries.items()}
    mean = statistics.mean(times.values())
    algbw, busbw = bandwidth(case["size"], mean, case["family"], n)
    return {"size": case["size"], "count": case["elements"], "dtype": case["dtype"], "op": case["op"],
            "family": case["family"], "time_us": mean, "algbw": algbw, "busbw": busbw,
            "wrong": sum(e.get("wrong", 0) for e in entries.values()),
            "rank_time_us": {str(r): round(v, 2) for r, v in sorted(times.items())},
            "rank_lag_us": {str(r): round(v, 2) for r, v in sorted(lags.items())}}


def row_key(check: str, row: int, rank: int) -> str:
    """Control-store key where ``rank`` puts its timing of row number ``row`` of the bench sweep."""
    return f"ddpdoctor/coll/row/{check}/{row}/{rank}"


def _skips(data: dict) -> list[str]:
    out: list[str] = []
    for d in data.values():
        out.extend(s for s in d["skipped"] if s not in out)
    return out


def _per_rank_lines(data: dict) -> list[str]:
    ranks = sorted(data)
    lines = []
    for i, case in enumerate(data[ranks[0]]["timings"]):
        times = " ".join(f"r{r}={data[r]['timings'][i]['time_us']:.0f}" for r in ranks)
        lags = " ".join(f"r{r}={data[r]['timings'][i]['lag_us']:.0f}" for r in ranks)
        lines.append(f"{case['op']}: per-rank time us {times}; lag us {lags}")
    return lines


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _wrong_text(entry: dict, ranks: Sequence[int]) -> str:
    return (f"{entry['label']} wrong on {rank_label(ranks)} ({entry['group']}): first wrong index "
            f"{entry['index']}: expected {_fmt(entry['expected'])}, got {_fmt(entry['actual'])} "
            f"({entry['wrong']} of {count(entry['of'], 'element')} wrong)")


def _wrong_lines(data: dict) -> list[str]:
    """Every wrong result, one line per rank and operation, in run order."""
    entries = sorted((w["seq"], r, w) for r, d in data.items() for w in d["wrong"])
    return [f"wrong: {_wrong_text(w, [r])}" for _, r, w in entries]


def _wrong_verdict(data: dict) -> Optional[tuple]:
    cases: dict[tuple, dict[int, dict]] = {}
    for r, d in sorted(data.items()):
        for w in d["wrong"]:
            cases.setdefault((w["seq"], w["label"], w["group"]), {})[r] = w
    if not cases:
        return None
    first = min(cases)
    ranks = sorted(cases[first])
    summary = _wrong_text(cases[first][ranks[0]], ranks)
    if len(cases) > 1:
        summary += f" (+{len(cases) - 1} more wrong operation{'s' if len(cases) > 2 else ''})"
    every = sorted({r for by_rank in cases.values() for r in by_rank})
    return (Status.FAIL, summary, WRONG_HINT.format(ranks=rank_label(every)), "collective-wrong-result",
            tuple(every))


def _busbw_verdict(rows: Sequence[dict], world: WorldInfo) -> Optional[tuple]:
    floor = world.options.get("min_busbw")
    if floor is None:
        return None
    low = [r for r in rows if r["family"] != "barrier" and r["busbw"] < float(floor)]
    if not low:
        return None
    worst = min(low, key=lambda r: r["busbw"])
    summary = (f"busbw below --min-busbw {float(floor):g} GB/s: {worst['op']} {worst['busbw']:.3f} GB/s at "
               f"{format_bytes(worst['size'])}")
    if len(low) > 1:
        summary += f" (+{len(low) - 1} more operation{'s' if len(low) > 2 else ''} below)"
    return Status.FAIL, summary, BUSBW_HINT, "busbw-below-minimum", ()


def _straggler_verdict(data: dict) -> Optional[tuple]:
    """A rank that reaches the timed collectives late in most timed operations (the others wait)."""
    ranks = sorted(data)
    cases = len(data[ranks[0]]["timings"])
    if cases == 0 or len(ranks) < 2:
        return None
    late: dict[int, list[tuple[float, float]]] = {}
    for i in range(cases):
        lags = {r: data[r]["timings"][i]["lag_us"] for r in ranks}
        fastest_call = min(data[r]["timings"][i]["time_us"] for r in ranks)
        median = statistics.median(lags.values())
        for r, lag in lags.items():
            if lag > median + max(STRAGGLER_FLOOR_US, fastest_call):
                late.setdefault(r, []).append((lag, median))
    needed = max(1, math.ceil(2 * cases / 3))
    slow = sorted(r for r, hits in late.items() if len(hits) >= needed)
    if not slow:
        return None
    r = max(slow, key=lambda k: statistics.mean(lag for lag, _ in late[k]))
    lag = statistics.mean(x for x, _ in late[r]) / 1000
    median = statistics.mean(m for _, m in late[r]) / 1000
    summary = (f"rank {r} is a straggler: it reaches each collective {lag:.1f} ms after the iteration starts "
               f"(median rank {median:.1f} ms) in {len(late[r])}/{cases} timed operations; the others wait for it")
    if len(slow) > 1:
        summary += f" (also late: {rank_label([s for s in slow if s != r])})"
    return Status.WARN, summary, STRAGGLER_HINT.format(rank=r), "collective-straggler", tuple(slow)


def _ranks_per_core(ctx: RankContext) -> float:
    """This node's ranks per CPU core available to this process."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(ctx.local_world_size, 1) / max(cores, 1)


def _rank0_says(ctx: RankContext, yes: bool) -> bool:
    """Rank 0's ``yes`` on every rank (one broadcast of one integer: a plan every rank shares).

    A broadcast rather than an all_reduce: on a crowded world an all_reduce is a ring of 2(n-1)
    turns on the cores (seconds at 128 ranks on 2 cores), a broadcast one turn per rank."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 if yes else 0], dtype=torch.int64, device=ctx.device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def _agreed_max(ctx: RankContext, value: float) -> float:
    """The largest ``value`` over the world (one small all_reduce): a plan every rank shares."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(value)], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())
