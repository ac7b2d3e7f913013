"""Check outcomes: the closed set of statuses and the records that cross process boundaries.

A rank runs a check and produces an :class:`Outcome`; the coordinator merges the outcomes of every
rank into one :class:`CheckResult` (every rank is kept; a failed rank leads over the ranks that timed out
waiting for it: merging is about causality, not severity). Both are frozen and
round-trip through JSON, because they travel over the control channel between processes and hosts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["Status", "Outcome", "CheckResult", "merge_outcomes", "format_ranks", "format_seconds", "rank_label",
           "count"]


class Status(enum.IntEnum):
    """How a check ended, ordered from best to worst (for sorting and exit codes).

    The order is severity, not causality: when one rank FAILed or CRASHed and others hit TIMEOUT
    waiting for it, the failure is the verdict (see :func:`merge_outcomes`).
    """

    PASS = 0
    SKIP = 1
    WARN = 2
    FAIL = 3
    TIMEOUT = 4
    CRASH = 5

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def is_failure(self) -> bool:
        """True for the statuses that make the job fail (exit code 1)."""
        return self >= Status.FAIL

    @classmethod
    def parse(cls, value: str) -> "Status":
        return cls[value.upper()]


@dataclass(frozen=True)
class Outcome:
    """What one rank found when it ran one check.

    Attributes:
        rank: global rank that ran the check (-1 for the supervising process).
        status: the verdict.
        summary: one line, what was found.
        hint: imperative fix; required for WARN and worse.
        finding: stable kebab-case id of the finding (``port-in-use``), empty when it passed.
        details: extra lines shown with ``-v``.
        data: JSON-able facts the check's ``merge`` compares across ranks.
        duration: seconds the check took on this rank.
    """

    rank: int
    status: Status
    summary: str
    hint: str = ""
    finding: str = ""
    details: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)
    duration: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "status": self.status.label,
            "summary": self.summary,
            "hint": self.hint,
            "finding": self.finding,
            "details": list(self.details),
            "data": dict(self.data),
            "duration": round(self.duration, 4),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Outcome":
        return cls(
            rank=int(d["rank"]),
            status=Status.parse(d["status"]),
            summary=str(d["summary"]),
            hint=str(d.get("hint", "")),
            finding=str(d.get("finding", "")),
            details=tuple(d.get("details", ())),
            data=dict(d.get("data", {})),
            duration=float(d.get("duration", 0.0)),
        )

    def with_rank(self, rank: int) -> "Outcome":
        return replace(self, rank=rank)


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict over the whole world.

    Attributes:
        name: the check's CLI name.
        status: the worst status of any rank (or the check's own cross-rank verdict).
        summary: one line for the report.
        hint: imperative fix for WARN and worse.
        finding: kebab-case id of the worst finding.
        ranks: the ranks the summary concerns (those with the worst status).
        outcomes: every rank's outcome, in rank order.
        duration: the slowest rank's duration.
    """

    name: str
    status: Status
    summary: str
    hint: str = ""
    finding: str = ""
    ranks: tuple[int, ...] = ()
    outcomes: tuple[Outcome, ...] = ()
    details: tuple[str, ...] = ()
    duration: float = 0.0
    #: the world it ran in ({"world_size", "backend", "device"}), when a run used several worlds
    world: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.label,
            "summary": self.summary,
            "hint": self.hint,
            "finding": self.finding,
            "ranks": list(self.ranks),
            "details": list(self.details),
            "duration": round(self.duration, 4),
            "outcomes": [o.to_dict() for o in self.outcomes],
            "world": dict(self.world) or None,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CheckResult":
        return cls(
            name=d["name"],
            status=Status.parse(d["status"]),
            summary=d["summary"],
            hint=d.get("hint", ""),
            finding=d.get("finding", ""),
            ranks=tuple(d.get("ranks", ())),
            details=tuple(d.get("details", ())),
            duration=float(d.get("duration", 0.0)),
            outcomes=tuple(Outcome.from_dict(o) for o in d.get("outcomes", ())),
            world=dict(d.get("world") or {}),
        )


def format_ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``: compact rank lists for one-line summaries."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for r in ordered:
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def format_seconds(seconds: float) -> str:
    """``0.0042`` -> ``"4 ms"``, ``2.5`` -> ``"2.50s"``: durations people read at a glance."""
    if seconds < 1.0:
        return f"{seconds * 1000:.0f} ms" if seconds >= 0.001 else f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f}s"


def count(n: int, noun: str, plural: str = "") -> str:
    """``count(1, "tensor")`` -> ``"1 tensor"``; ``count(3, "tensor")`` -> ``"3 tensors"``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def rank_label(ranks: Iterable[int]) -> str:
    """``"rank 3"`` or ``"ranks 0-2,5"``."""
    ordered = sorted(set(ranks))
    return f"rank{'s' if len(ordered) != 1 else ''} {format_ranks(ordered)}"


def merge_outcomes(name: str, outcomes: Sequence[Outcome]) -> CheckResult:
    """Merge per-rank outcomes: the worst status leads, every rank is kept.

    Causality before severity: when some ranks FAILed or CRASHed and others hit TIMEOUT, the
    timeouts are the consequence (they waited for the failed ranks), so the failure leads.
    When all ranks with the leading status say the same thing, the summary is theirs; otherwise
    the first such rank's summary is shown with the ranks it concerns.
    """
    ordered = tuple(sorted(outcomes, key=lambda o: o.rank))
    if not ordered:
        return CheckResult(name, Status.SKIP, "no rank ran this check")
    statuses = {o.status for o in ordered}
    causes = statuses & {Status.FAIL, Status.CRASH}
    worst = max(causes) if causes and Status.TIMEOUT in statuses else max(statuses)
    concerned = [o for o in ordered if o.status == worst]
    first = concerned[0]
    ranks = tuple(o.rank for o in concerned)
    same = all(o.summary == first.summary for o in concerned)
    if len(ordered) == 1 or (same and len(concerned) == len(ordered)):
        summary = first.summary
    elif same:
        summary = f"{rank_label(ranks)}: {first.summary}"
    else:
        others = len(concerned) - 1
        summary = f"rank {first.rank}: {first.summary}"
        if others:
            summary += f" (and {others} more rank{'s' if others > 1 else ''})"
    return CheckResult(
        name=name,
        status=worst,
        summary=summary,
        hint=first.hint,
        finding=first.finding,
        ranks=ranks,
        outcomes=ordered,
        duration=max(o.duration for o in ordered),
    )
