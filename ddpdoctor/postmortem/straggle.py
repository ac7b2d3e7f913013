"""``ddpdoctor run``'s straggler watch: every window, each rank's collective timings (written by the
injected hook as ``coll-<pid>.txt``) are scored by :class:`ddpdoctor.locate.straggler.StragglerTracker`;
a rank slow for several windows in a row is named while the job runs (once, and again only when its
score moves by :data:`RESAY` or it crosses the threshold anew), and again at the end.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from ddpdoctor.locate.straggler import Event, StragglerTracker

__all__ = ["StragglerWatch", "RESAY", "HISTORY"]

RESAY = 0.05
"""A named straggler is named again only when its score moved by this much since (or when it crosses the
threshold again after recovering): a slow rank stays slow for hours, and one line per window buried the job."""
HISTORY = 500  # windows of scores kept for the report


class StragglerWatch:
    """Reads the new timings of every rank once per ``window`` seconds and scores them."""

    def __init__(self, run_dir: str, window: float, windows: int, threshold: float = 0.8) -> None:
        self.run_dir = run_dir
        self.window = window
        self.tracker = StragglerTracker(threshold=threshold, windows=windows)
        self.offsets: dict = {}  # pid -> bytes already read
        self.next_at: Optional[float] = None
        self.flagged: dict = {}  # rank -> the latest flag
        self.said: dict = {}  # rank -> the score it was last named with, while it stays under the threshold
        self.history: list = []  # (when the window closed, monotonic; {rank: score}), the last HISTORY windows

    def poll(self, now: float, ranks: Sequence) -> list:
        """Lines to print when a window closed (``ranks``: objects with ``pid``, ``rank``, ``info``)."""
        if self.next_at is None:
            self.next_at = now + self.window
            return []
        if now < self.next_at:
            return []
        self.next_at = now + self.window
        per_rank = {}
        for p in ranks:
            if p.rank is None:
                continue
            events = self._read(p.pid)
            if len(events) >= 2:
                per_rank[p.rank] = events
        if len(per_rank) < 2:
            return []
        hosts = {p.rank: p.info.get("host") for p in ranks if p.rank is not None and p.info.get("host")}
        lines = []
        flags = {flag.rank: flag for flag in self.tracker.add_window(per_rank)}
        for rank in [r for r in self.said if r not in flags]:
            del self.said[rank]  # back over the threshold: a new crossing is news again
        for rank, flag in sorted(flags.items()):
            self.flagged[rank] = flag
            if rank in self.said and abs(flag.score - self.said[rank]) < RESAY:
                continue  # named already, and its score has not moved: every window would repeat it
            self.said[rank] = flag.score
            lines.append(self.tracker.describe(flag, hosts))
        scores = self.tracker.history[-1] if self.tracker.history else {}
        self.history.append((now, {r: round(v[0], 3) for r, v in scores.items()}))
        del self.history[:-HISTORY]
        return lines

    def summary(self) -> list:
        """One line per rank flagged at any time during the run."""
        return [self.tracker.describe(f) for _, f in sorted(self.flagged.items())]

    def _read(self, pid: int) -> list:
        path = os.path.join(self.run_dir, f"coll-{pid}.txt")
        try:
            with open(path, "rb") as f:
                f.seek(self.offsets.get(pid, 0))
                data = f.read(8 << 20)
        except OSError:
            return []
        cut = data.rfind(b"\n") + 1  # a line being written stays for the next window
        self.offsets[pid] = self.offsets.get(pid, 0) + cut
        out = []
        for line in data[:cut].splitlines():
            parts = line.split()
            try:  # "start end op bytes n" (a step's line, "step start n", is no collective)
                start, end = float(parts[0]), float(parts[1])
            except (ValueError, IndexError):
                continue
            out.append(Event(start, end))
        return out


