"""Which node, link or group of nodes makes a job slow: a plan of parallel test rounds, and the verdict.

The plan is a small state machine, pure and deterministic, so every rank of a real world computes the
same next round from the same readings, and the simulator (:mod:`ddpdoctor.locate.simulation`) runs
the very same code against a modelled network::

    INTRA    each node's own ranks together, all nodes at once (only with 2+ ranks per node):
             a bad GPU, NVLink or PCIe path shows here
    PAIRS    nodes paired (0,1), (2,3), ... one rank per node, all pairs at once
    REPAIR   each node of a slow pair (and an odd node out) paired with a node from a healthy pair:
             the node that stays slow is the suspect; when both are fine with others, the link between
             them is
    WORLD    every node not yet suspect, together: fine -> done
    HALVES   a slow group is split in two halves, tested at once; a slow half is split again; a group
             that is slow while both its halves are fine has the fault across its cut
    CROSS    each side of such a cut joined with a healthy group of its size: the side that stays slow
             is the suspect group (a switch or uplink that only fails under load)
    DONE

Readings are judged against the others of the same test (median and MAD, so one machine's normal
speed is the baseline) and against an absolute floor (``--min-busbw``); both are shown. A node that
does not answer within a round's deadline is itself the verdict.

Rounds for one fault among N nodes: at most 2 * ceil(log2 N) + 3 (PAIRS, REPAIR, WORLD, the halving,
CROSS). With several faults the plan stops after :func:`round_limit` rounds and says it stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

__all__ = ["Probe", "Reading", "Suspect", "Judge", "Locator", "Verdict", "round_limit"]

INTRA, PAIRS, REPAIR, WORLD, HALVES, CROSS, DONE = "intra", "pairs", "repair", "world", "halves", "cross", "done"


@dataclass(frozen=True)
class Probe:
    """One test of a round: the nodes that run a collective together (with ``kind`` saying why)."""

    nodes: tuple
    kind: str


@dataclass(frozen=True)
class Reading:
    """What one probe measured: bus bandwidth (GB/s) and small-message latency (us); None: no answer."""

    probe: Probe
    busbw: Optional[float]
    latency_us: Optional[float] = None
    silent: tuple = ()  # nodes that did not answer within the round's deadline
    error: str = ""  # why a member that answered has no figure (a timeout, a broken connection)

    @property
    def answered(self) -> bool:
        return self.busbw is not None and not self.silent


@dataclass(frozen=True)
class Suspect:
    """A node, a link (two nodes), a group or a cut between two groups, with the evidence."""

    kind: str  # node | link | group | cut | silent | all
    nodes: tuple
    evidence: tuple = ()
    other: tuple = ()  # the other side of a cut

    def to_dict(self) -> dict:
        return {"kind": self.kind, "nodes": list(self.nodes), "other": list(self.other),
                "evidence": list(self.evidence)}


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@dataclass(frozen=True)
class Baseline:
    """What a healthy reading looks like: the median and scaled MAD of the better half of the readings.

    Faults only ever make a reading worse (lower bandwidth, higher latency) while noise goes both
    ways, so the better half stays healthy even when up to half of the nodes are bad (a whole switch
    in a small world); its median is the reference and its MAD the noise.
    """

    median: float
    spread: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float], higher_is_better: bool = True) -> "Baseline":
        vals = sorted((v for v in values if v is not None and math.isfinite(v)), reverse=higher_is_better)
        if not vals:
            return cls(float("nan"), float("nan"), 0)
        better = vals[: (len(vals) + 1) // 2]
        m = _median(better)
        # the MAD of fewer than 4 readings says nothing about the noise: then only the relative drop counts
        spread = 1.4826 * _median([abs(v - m) for v in better]) if len(better) >= 4 else 0.0
        return cls(m, spread, len(vals))


@dataclass(frozen=True)
class Judge:
    """When a reading is slow.

    Args:
        min_busbw: absolute floor in GB/s (``--min-busbw``); None: none.
        drop: relative: slower than the median by at least this fraction ...
        mads: ... and by at least this many scaled MADs (robust to one machine's normal noise).
        latency_rise: latency above the median by at least this fraction (and ``mads`` MADs).
        size: bytes per all_reduce of the big test. Given, a test of n > 2 nodes is judged against what
            healthy pairs predict for n nodes, not against the pairs themselves: a ring all_reduce
            takes 2(n-1) steps where a pair takes 2, so its fixed cost grows with n (the pairs' small-
            message latency times n-1) while its bandwidth term stays; a healthy world of many nodes
            (or of CPU ranks sharing cores) has a lower bus bandwidth than a pair. None: no scaling.
    """

    min_busbw: Optional[float] = None
    drop: float = 0.3
    mads: float = 4.0
    latency_rise: float = 1.0
    size: Optional[int] = None

    def __post_init__(self) -> None:
        # a loose bandwidth tolerance loosens the latency one alike (0.9: ten times the median)
        object.__setattr__(self, "latency_rise", max(self.latency_rise, self.drop / (1 - self.drop)))

    def expected(self, nodes: int, bw: Baseline, lat: Baseline) -> tuple:
        """The baselines for a test of ``nodes`` nodes from the pairs' ones (unchanged for 2 or fewer,
        without ``size``, or without both baselines)."""
        if (self.size is None or nodes <= 2 or bw.count < 1 or lat.count < 1 or not bw.median > 0
                or not math.isfinite(lat.median)):
            return bw, lat
        pair_s = self.size / (bw.median * 1e9)  # a pair's big call: busbw = algbw for 2 nodes
        fixed_s = min(lat.median * 1e-6, pair_s)  # of which the fixed cost of its 2 steps
        moved = 2 * (nodes - 1) / nodes
        seconds = (nodes - 1) * fixed_s + moved * (pair_s - fixed_s)
        busbw = self.size * moved / seconds / 1e9
        k = busbw / bw.median
        return (Baseline(busbw, bw.spread * k, bw.count),
                Baseline(lat.median * (nodes - 1), lat.spread * (nodes - 1), lat.count))

    def slow(self, r: Reading, bw: Baseline, lat: Baseline) -> Optional[str]:
        """Why ``r`` is slow (a phrase for the evidence), or None when it is not.

        ``bw`` and ``lat`` are the pairs' (or the same test's) baselines; for a test of more nodes they
        are scaled first (:meth:`expected`)."""
        if not r.answered:
            return "no answer"
        if self.min_busbw is not None and r.busbw < self.min_busbw:
            return f"{r.busbw:.3g} GB/s is below --min-busbw {self.min_busbw:g}"
        n = len(r.probe.nodes)
        ebw, elat = self.expected(n, bw, lat)
        scaled = ebw is not bw
        if ebw.count >= 2 and r.busbw < ebw.median - max(self.mads * ebw.spread, self.drop * ebw.median):
            if scaled:
                return f"{r.busbw:.3g} GB/s vs {ebw.median:.3g} expected of {n} nodes (median pair {bw.median:.3g})"
            return f"{r.busbw:.3g} GB/s vs median {bw.median:.3g}"
        # latency counts only for a test whose bandwidth is not among the best (a busy CPU delays small
        # messages of healthy tests too)
        if (r.latency_us is not None and elat.count >= 2 and not (ebw.count >= 2 and r.busbw >= ebw.median)
                and r.latency_us > elat.median + max(self.mads * elat.spread, self.latency_rise * elat.median)):
            if scaled:
                return (f"latency {r.latency_us:.3g} us vs {elat.median:.3g} expected of {n} nodes "
                        f"(median pair {lat.median:.3g})")
            return f"latency {r.latency_us:.3g} us vs median {lat.median:.3g}"
        return None


def _split(lo: int, hi: int) -> int:
    """Where to halve the node range [lo, hi): at a multiple of the largest power of two that fits, so
    the halves line up with switches and racks of power-of-two size in host-name order."""
    size = hi - lo
    p = 1
    while p * 2 < size:
        p *= 2
    mid = (lo // p + 1) * p if lo % p else lo + p
    return mid if lo < mid < hi else lo + size // 2


def _halve(lo: int, hi: int, excluded: set) -> Optional[tuple]:
    """The live nodes of [lo, hi) in two halves and the halves' ranges, skipping a half with no live
    node; None when fewer than two nodes are live."""
    while hi - lo >= 2:
        mid = _split(lo, hi)
        a = tuple(n for n in range(lo, mid) if n not in excluded)
        b = tuple(n for n in range(mid, hi) if n not in excluded)
        if a and b:
            return a, b, (lo, mid), (mid, hi)
        lo, hi = (lo, mid) if a else (mid, hi)
    return None


def round_limit(nodes: int) -> int:
    """Rounds the plan may use: the single-fault bound plus room for a few more faults."""
    return 2 * max(1, math.ceil(math.log2(max(nodes, 2)))) + 3 + 4


@dataclass
class Verdict:
    """The plan's outcome: suspects, rounds used, and every reading (for the report and the JSON)."""

    suspects: list
    rounds: int
    readings: list
    baseline: Optional[Baseline]
    stopped: str = ""  # why the plan stopped early, if it did

    def to_dict(self) -> dict:
        b = self.baseline
        return {"suspects": [s.to_dict() for s in self.suspects], "rounds": self.rounds, "stopped": self.stopped,
                "baseline": None if b is None else {"median_busbw": b.median, "mad_busbw": b.spread, "count": b.count},
                "readings": [{"round": i, "kind": r.probe.kind, "nodes": list(r.probe.nodes), "busbw": r.busbw,
                              "latency_us": r.latency_us, "silent": list(r.silent),
                              **({"error": r.error} if r.error else {})} for i, r in self.readings]}


@dataclass
class Locator:
    """The plan for ``nodes`` nodes. Call :meth:`plan` for the next round, :meth:`record` with its readings.

    Args:
        nodes: how many nodes (numbered 0..nodes-1 in a stable order, e.g. sorted hostnames).
        judge: when a reading is slow.
        intra: whether to run the INTRA round (every node has 2 or more ranks).
        deep: False stops after PAIRS and REPAIR (two-round pairing, for comparison).
    """

    nodes: int
    judge: Judge = field(default_factory=Judge)
    intra: bool = False
    deep: bool = True
    state: str = ""
    rounds: int = 0
    suspects: list = field(default_factory=list)
    log: list = field(default_factory=list)  # (round, Reading)
    _pending: list = field(default_factory=list)
    _good: list = field(default_factory=list)  # nodes proven healthy in some test
    _candidates: list = field(default_factory=list)
    _slow_pairs: list = field(default_factory=list)
    _repair_slow: dict = field(default_factory=dict)
    _groups: list = field(default_factory=list)  # slow groups (node index ranges) waiting to be split
    _half_plan: list = field(default_factory=list)  # (half a, half b, probe a|None, probe b|None, ranges)
    _cuts: list = field(default_factory=list)  # (side a, side b, evidence) waiting for CROSS
    _healthy_groups: list = field(default_factory=list)
    _cross_plan: list = field(default_factory=list)  # (side a, side b, why, (probe a, probe b))
    _cross_readings: dict = field(default_factory=dict)
    _bw: Optional[Baseline] = None
    _lat: Optional[Baseline] = None
    stopped: str = ""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes={self.nodes}: need at least one node")
        self.state = INTRA if self.intra else PAIRS

    # -- the plan ---------------------------------------------------------------------------------

    def plan(self) -> Optional[list]:
        """The probes of the next round (disjoint node sets, run at once), or None when done."""
        while self.state != DONE:
            if self.rounds >= round_limit(self.nodes):
                self.stopped = f"stopped after {self.rounds} round{'s' if self.rounds != 1 else ''} (the limit for {self.nodes} nodes)"
                self.state = DONE
                break
            probes = self._next()
            if probes:
                self._pending = probes
                return probes
        return None

    def record(self, readings: Sequence[Reading]) -> None:
        """The readings of the round :meth:`plan` returned (one per probe, any order)."""
        by_probe = {r.probe: r for r in readings}
        got = [by_probe.get(p) or Reading(p, None, None, silent=p.nodes) for p in self._pending]
        self.rounds += 1
        self.log += [(self.rounds, r) for r in got]
        self._pending = []
        for r in got:
            for n in r.silent:
                self._suspect("silent", (n,), f"{r.probe.kind} test {self._names(r.probe.nodes)}: "
                              f"no answer within the round's deadline")
        getattr(self, f"_after_{self.state}")(got)

    def silent(self, node: int, evidence: str) -> None:
        """Name ``node`` silent before (or between) rounds, e.g. it never said who it is: it is left out
        of every later test."""
        self._suspect("silent", (node,), evidence)

    def verdict(self) -> Verdict:
        return Verdict(list(self.suspects), self.rounds, list(self.log), self._bw, self.stopped)

    # -- helpers ------------------------------------------------------------------------------------

    def _names(self, nodes: Sequence[int]) -> str:
        return "(" + ",".join(str(n) for n in nodes) + ")"

    def _excluded(self) -> set:
        return {n for s in self.suspects if s.kind != "all" for n in s.nodes + s.other}

    def _suspect(self, kind: str, nodes: tuple, evidence: str, other: tuple = ()) -> None:
        for i, s in enumerate(self.suspects):
            if s.kind == kind and s.nodes == nodes and s.other == other:
                self.suspects[i] = Suspect(kind, nodes, s.evidence + (evidence,), other)
                return
        self.suspects.append(Suspect(kind, nodes, (evidence,), other))

    def _slow(self, r: Reading) -> Optional[str]:
        return self.judge.slow(r, self._bw or Baseline.of([]), self._lat or Baseline.of([]))

    def _next(self) -> list:
        live = [n for n in range(self.nodes) if n not in self._excluded()]
        if self.state == INTRA:
            return [Probe((n,), INTRA) for n in live]
        if self.state == PAIRS:
            if len(live) < 2:
                self.state = DONE
                return []
            return [Probe((live[i], live[i + 1]), PAIRS) for i in range(0, len(live) - 1, 2)]
        if self.state == REPAIR:
            return self._repair_round()
        if self.state == WORLD:
            if not self.deep or len(live) < 3:  # a pair was already tested as a pair
                self.state = DONE
                return []
            return [Probe(tuple(live), WORLD)]
        if self.state == HALVES:
            probes, self._half_plan = [], []
            excluded = self._excluded()
            for lo, hi in self._groups:
                split = _halve(lo, hi, excluded)
                if split is None:
                    continue
                a, b, ra, rb = split
                # a half of one node cannot be measured alone (one rank per node): it is judged by the other
                pa = Probe(a, HALVES) if len(a) >= 2 else None
                pb = Probe(b, HALVES) if len(b) >= 2 else None
                probes += [p for p in (pa, pb) if p]
                self._half_plan.append((a, b, pa, pb, ra, rb))
            self._groups = []
            if not self._half_plan:
                self.state = CROSS
            elif not probes:
                self._after_halves([])
            return probes
        if self.state == CROSS:
            return self._cross_round()
        return []

    # -- INTRA: per node -----------------------------------------------------------------------------

    def _after_intra(self, got: list) -> None:
        bw = Baseline.of([r.busbw for r in got if r.answered])
        lat = Baseline.of([r.latency_us for r in got if r.answered and r.latency_us is not None], False)
        for r in got:
            why = self.judge.slow(r, bw, lat) if r.answered else None
            if why:
                self._suspect("node", r.probe.nodes, f"inside the node: {why}")
        self.state = PAIRS

    # -- PAIRS and REPAIR --------------------------------------------------------------------------

    def _after_pairs(self, got: list) -> None:
        answered = [r for r in got if r.answered]
        self._bw = Baseline.of([r.busbw for r in answered])
        self._lat = Baseline.of([r.latency_us for r in answered if r.latency_us is not None], False)
        paired = {n for r in got for n in r.probe.nodes}
        for r in got:
            if r.silent:
                continue
            why = self._slow(r)  # no answer (a timeout, a broken link) is slow: re-pair to tell who
            if why:
                self._slow_pairs.append((r.probe.nodes, why))
                self._candidates += [n for n in r.probe.nodes if n not in self._candidates]
            else:
                self._good += list(r.probe.nodes)
        excluded = self._excluded()
        self._candidates += [n for n in range(self.nodes) if n not in paired and n not in excluded]  # the odd node out
        if self._candidates and not self._good:
            if self.judge.min_busbw is not None and all(
                    r.busbw is not None and r.busbw < self.judge.min_busbw for r in answered) and answered:
                self._suspect("all", tuple(range(self.nodes)),
                              f"every pair is below --min-busbw {self.judge.min_busbw:g} "
                              f"(median {self._bw.median:.3g} GB/s): a cause common to all nodes")
            self.state = WORLD
            self._candidates = []
            return
        self.state = REPAIR if self._candidates else WORLD

    def _repair_round(self) -> list:
        excluded = self._excluded()
        todo = [c for c in self._candidates if c not in excluded and c not in self._repair_slow]
        if not todo:
            self._conclude_pairs()
            self.state = WORLD
            return []
        partners = [g for g in self._good if g not in excluded]
        if not partners:  # nobody proven healthy to pair with: say so, and go on with the world test
            for c in todo:
                self._repair_slow[c] = None  # untested
            self._candidates = []
            self._conclude_pairs()
            self.stopped = "no healthy node to re-pair the slow pairs with"
            self.state = WORLD
            return []
        return [Probe((c, g), REPAIR) for c, g in zip(todo, partners)]

    def _after_repair(self, got: list) -> None:
        pairs = [r for _, r in self.log if r.probe.kind in (PAIRS, REPAIR) and r.answered]
        self._bw = Baseline.of([r.busbw for r in pairs])
        self._lat = Baseline.of([r.latency_us for r in pairs if r.latency_us is not None], False)
        for r in got:
            c, g = r.probe.nodes
            if not r.answered:
                self._repair_slow[c] = "no answer"
                continue
            why = self._slow(r)
            self._repair_slow[c] = why or ""
            if not why:
                self._good.append(c)
        self._candidates = [c for c in self._candidates if c not in self._repair_slow]
        if not self._candidates:
            self._conclude_pairs()
            self.state = WORLD

    def _conclude_pairs(self) -> None:
        for nodes, why in self._slow_pairs:
            bad = [n for n in nodes if self._repair_slow.get(n)]
            if bad:
                for n in bad:
                    self._suspect("node", (n,), f"paired with {self._names([m for m in nodes if m != n])}: {why}; "
                                  f"with a healthy node: {self._repair_slow[n]}")
            elif any(self._repair_slow.get(n, None) is None for n in nodes):
                self._suspect("link", tuple(nodes), f"together: {why}; no healthy node to tell which one it is")
            else:
                self._suspect("link", tuple(nodes), f"together: {why}; each is fine with a healthy node")
        for n, why in self._repair_slow.items():
            if why and not any(n in nodes for nodes, _ in self._slow_pairs):
                self._suspect("node", (n,), f"(unpaired) with a healthy node: {why}")
        self._group_runs()

    def _group_runs(self) -> None:
        """Three or more neighbouring nodes each slow with every partner: name them as one group."""
        bad = sorted(n for s in self.suspects if s.kind == "node" for n in s.nodes)
        runs, run = [], []
        for n in bad:
            if run and n == run[-1] + 1:
                run.append(n)
            else:
                if len(run) >= 3:
                    runs.append(run)
                run = [n]
        if len(run) >= 3:
            runs.append(run)
        for run in runs:
            evidence = tuple(e for s in self.suspects if s.kind == "node" and s.nodes[0] in run for e in s.evidence)
            self.suspects = [s for s in self.suspects if not (s.kind == "node" and s.nodes[0] in run)]
            self.suspects.append(Suspect("group", tuple(run), ("each node is slow with every partner: "
                                                               "a shared switch, uplink or setting",) + evidence[:3]))

    # -- WORLD, HALVES, CROSS ----------------------------------------------------------------------

    def _after_world(self, got: list) -> None:
        r = got[0]
        why = self._slow(r) if r.answered else None
        if why:
            self._groups = [(0, self.nodes)]
            self.state = HALVES
        else:
            self._healthy_groups.append(list(r.probe.nodes))
            self.state = DONE

    def _after_halves(self, got: list) -> None:
        by_probe = {r.probe: r for r in got}
        for a, b, pa, pb, ra, rb in self._half_plan:
            slow = {}
            for side, probe, span in ((a, pa, ra), (b, pb, rb)):
                if probe is None:
                    continue
                why = self._slow(by_probe[probe])
                slow[side] = why
                if not why:
                    self._healthy_groups.append(list(side))
                else:
                    self._groups.append(span)
            together = f"{self._names(a + b)} together: slow"
            if pa and pb and not slow[a] and not slow[b]:
                self._cuts.append((a, b, f"{together}; each half alone: fine"))
            elif bool(pa) != bool(pb):
                single, other = (b, a) if pa else (a, b)
                if not slow[other]:
                    self._suspect("node", single, f"{together}; {self._names(other)} alone: fine")
            elif not pa and not pb:
                self._cuts.append((a, b, f"{together}; fine as a pair before"))
        self._half_plan = []
        self.state = HALVES

    def _cross_round(self) -> list:
        if not self._cross_plan and self._cuts:
            self._plan_cross()
        # as many of the planned probes as can run at once (disjoint); the rest in the next round
        used: set = set()
        probes = []
        for _, _, _, planned in self._cross_plan:
            for p in planned:
                if p not in self._cross_readings and not used & set(p.nodes):
                    probes.append(p)
                    used.update(p.nodes)
        if not probes:
            self._conclude_cross()
            self.state = DONE
        return probes

    def _plan_cross(self) -> None:
        used: set = set()
        for a, b, why in self._cuts:
            pool = [n for g in self._healthy_groups for n in g if n not in a and n not in b and n not in used]
            if len(pool) >= len(a) + len(b):
                # each side with as many healthy nodes from elsewhere
                fa, fb = tuple(pool[:len(a)]), tuple(pool[len(a):len(a) + len(b)])
                used.update(fa + fb)
                planned = (Probe(tuple(sorted(a + fa)), CROSS), Probe(tuple(sorted(b + fb)), CROSS))
            else:
                # each side with one node of the other (two rounds): the side slow with a stranger is the one
                planned = (Probe(tuple(sorted(a + b[:1])), CROSS), Probe(tuple(sorted(b + a[:1])), CROSS))
            self._cross_plan.append((a, b, why, planned))
        self._cuts = []

    def _after_cross(self, got: list) -> None:
        for r in got:
            self._cross_readings[r.probe] = r

    def _conclude_cross(self) -> None:
        for a, b, why, (pa, pb) in self._cross_plan:
            ra, rb = self._cross_readings.get(pa), self._cross_readings.get(pb)
            slow_a = self._slow(ra) if ra else None
            slow_b = self._slow(rb) if rb else None
            if slow_a and not slow_b:
                self._suspect("group", a, f"{why}; {self._names(a)} with other nodes: {slow_a}")
            elif slow_b and not slow_a:
                self._suspect("group", b, f"{why}; {self._names(b)} with other nodes: {slow_b}")
            else:
                self._suspect("cut", a, why + "; with other nodes each side is " + ("slow" if slow_a else "fine"), b)
        self._cross_plan = []
