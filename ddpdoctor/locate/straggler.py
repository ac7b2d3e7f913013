"""The straggler inside a running job: which rank's own work is slowest, window after window.

Each rank records, per collective, when it entered (``start``) and when the collective completed
for it (``end``); nothing is synchronised. The time from one collective's end to the next one's start
is the rank's own work (compute, data loading); the time inside a collective is mostly waiting for
the others. The rank whose own work is slowest is the straggler, and it is also the one that waits
least inside collectives. Scored as nvidia-resiliency-ext scores ranks: per window, each rank's score
is the fastest rank's median own work over this rank's (1.0: as fast as the fastest); a rank whose
score stays under ``threshold`` for ``windows`` (3) consecutive windows is flagged. The threshold is
0.8, not nvidia-resiliency-ext's 0.75: a rank 30% slower scores 1/1.3 = 0.77, which 0.75 would miss.
Clocks are per rank: only differences on one rank are used, so nodes need no synchronised clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

__all__ = ["Event", "own_work", "window_scores", "StragglerTracker", "Flag"]


@dataclass(frozen=True)
class Event:
    """One collective on one rank: when it entered and when it completed (seconds, the rank's clock)."""

    start: float
    end: float


def own_work(events: Sequence[Event]) -> list:
    """The gaps between one collective's end and the next one's start (overlapped gaps count as 0)."""
    ordered = sorted(events, key=lambda e: e.start)
    return [max(0.0, b.start - a.end) for a, b in zip(ordered, ordered[1:])]


def _median(values: Sequence[float]) -> Optional[float]:
    s = sorted(values)
    if not s:
        return None
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def window_scores(per_rank: Mapping[int, Sequence[Event]]) -> dict:
    """rank -> (score, median own work, median wait) for one window; ranks with too few events are left out."""
    medians, waits = {}, {}
    for rank, events in per_rank.items():
        m = _median(own_work(events))
        if m is not None:
            medians[rank] = m
            waits[rank] = _median([e.end - e.start for e in events]) or 0.0
    if not medians:
        return {}
    fastest = min(medians.values())
    return {r: ((fastest / m) if m > 0 else 1.0, m, waits[r]) for r, m in medians.items()}


@dataclass(frozen=True)
class Flag:
    """A rank flagged in a window: its score, own work against the fastest rank's, and its wait."""

    rank: int
    window: int
    score: float
    own_work: float
    fastest: float
    wait: float
    streak: int


@dataclass
class StragglerTracker:
    """Feeds windows of events; remembers each rank's streak of low scores; reports flags."""

    threshold: float = 0.8
    windows: int = 3
    streak: dict = field(default_factory=dict)
    history: list = field(default_factory=list)  # per window: {rank: (score, own, wait)}

    def add_window(self, per_rank: Mapping[int, Sequence[Event]]) -> list:
        """Score one window; the flags raised in it (ranks low for ``windows`` windows in a row)."""
        scores = window_scores(per_rank)
        self.history.append(scores)
        if not scores:
            return []
        fastest = min(own for _, own, _ in scores.values())
        flags = []
        for rank, (score, own, wait) in sorted(scores.items()):
            self.streak[rank] = self.streak.get(rank, 0) + 1 if score < self.threshold else 0
            if self.streak[rank] >= self.windows:
                flags.append(Flag(rank, len(self.history), score, own, fastest, wait, self.streak[rank]))
        return flags

    def describe(self, flag: Flag, where: Optional[Mapping[int, str]] = None) -> str:
        place = f" on {where[flag.rank]}" if where and flag.rank in where else ""
        return (f"rank {flag.rank}{place} is a straggler: score {flag.score:.2f} for {flag.streak} windows in a row "
                f"(own work {flag.own_work * 1e3:.1f} ms per step vs {flag.fastest * 1e3:.1f} ms on the fastest "
                f"rank; it waits {flag.wait * 1e3:.1f} ms per collective)")
