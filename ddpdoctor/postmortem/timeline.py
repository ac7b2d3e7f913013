"""The run's timeline: each rank's steps and collectives (from the hook's ``coll-<pid>.txt``), the hang or
death marked, and its Chrome trace-event form (``trace.json``: what ui.perfetto.dev and
``chrome://tracing`` open).

The hook writes, per rank, ``start end op bytes n`` for every timed collective (``n``: the rank's own
count of them; ``ddp_backward_sync``: DDP's backward and gradient all-reduce), ``step start n`` when
its ``n``-th optimizer step began, and ``open start op bytes n`` for a call still running at a
heartbeat (one that never completes is drawn up to the hang or death, named "not completed"); times are ``CLOCK_MONOTONIC`` seconds, which every process of one
host shares with ``ddpdoctor run`` itself, so the ranks line up with each other and with the moment
run saw the hang or the death. Ranks on other hosts keep their own clock (a multi-host job shows each
host's ranks aligned among themselves).

Bounded: only the last :data:`TAIL_BYTES` of each rank's file are read (the last few thousand events;
a hang or a death is the end of the file, so the window around it is always in).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ddpdoctor.system.redact import safe_text

__all__ = ["Slice", "Mark", "RankLine", "read_rank", "trace_events", "TAIL_BYTES", "LIMIT"]

LIMIT = 5000  # events per rank kept for the report and the trace
TAIL_BYTES = LIMIT * 64  # a line is ~40 bytes: the last LIMIT lines fit


@dataclass(frozen=True)
class Slice:
    """One step or collective of one rank (seconds, monotonic)."""

    kind: str  # "step" or "collective"
    name: str
    start: float
    end: float
    n: int = 0
    nbytes: int = 0


@dataclass(frozen=True)
class Mark:
    """What happened to a rank at one moment: ``hung`` (where run saw no progress), ``died``, ``interrupted``."""

    kind: str
    at: float
    text: str


@dataclass
class RankLine:
    """One rank's row: its slices (steps first, then collectives, each by start) and its mark."""

    rank: object  # the rank number, or "pid N" for a process that never learnt one
    pid: int
    host: str = ""
    slices: list = field(default_factory=list)
    mark: Optional[Mark] = None

    @property
    def label(self) -> str:
        who = f"rank {self.rank}" if isinstance(self.rank, int) else str(self.rank)
        return safe_text(f"{who} on {self.host} (pid {self.pid})" if self.host else f"{who} (pid {self.pid})")


def _tail_lines(path: str, limit: int) -> list:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read(limit)
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > limit:
        lines = lines[1:]  # the first one was cut
    return [line.decode("ascii", "replace") for line in lines[:-1]]  # the last: complete lines end in "\n"


def read_rank(run_dir: str, pid: int, rank: object, host: str = "", end: Optional[float] = None,
              limit: int = LIMIT) -> RankLine:
    """The rank's last ``limit`` events from ``coll-<pid>.txt``: its collectives and its steps (step ``n``:
    from its ``n``-th optimizer step to the next one; the last ends at ``end``, or at the rank's last
    recorded moment). A line that cannot be read is skipped."""
    colls, steps, opened = [], [], {}
    for line in _tail_lines(os.path.join(run_dir, f"coll-{pid}.txt"), TAIL_BYTES)[-limit:]:
        parts = line.split()
        try:
            if parts[0] == "step":
                steps.append((float(parts[1]), int(parts[2])))
            elif parts[0] == "open":
                opened[int(parts[4])] = (float(parts[1]), safe_text(parts[2][:64]), int(parts[3]))
            elif len(parts) >= 5:
                colls.append(Slice("collective", safe_text(parts[2][:64]), float(parts[0]), float(parts[1]),
                                   int(parts[4]), int(parts[3])))
            else:  # the hook before operations were recorded: start and end only
                colls.append(Slice("collective", "collective", float(parts[0]), float(parts[1])))
        except (ValueError, IndexError):
            continue
    last = max([c.end for c in colls] + [t for t, _ in steps] + [t for t, _, _ in opened.values()], default=None)
    stop = end if end is not None else last
    done = {c.n for c in colls}
    for n, (t, op, size) in opened.items():  # still running when the rank hung or died: until then
        if n not in done and stop is not None and stop >= t:
            colls.append(Slice("collective", op + " (not completed)", t, stop, n, size))
    out = []
    for (t, n), nxt in zip(steps, steps[1:] + [(stop, None)]):
        if nxt[0] is not None and nxt[0] >= t:
            out.append(Slice("step", f"step {n}", t, nxt[0], n))
    return RankLine(rank, pid, host, out + sorted(colls, key=lambda c: c.start))


def _lanes(slices: Sequence[Slice]) -> list:
    """(lane, slice): slices that overlap without nesting go to the next lane, so every lane nests."""
    lanes: list = []  # per lane: the end of its last slice
    out = []
    for s in sorted(slices, key=lambda s: (s.start, -s.end)):
        for i, busy in enumerate(lanes):
            if s.start >= busy:
                lanes[i] = s.end
                break
        else:
            i = len(lanes)
            lanes.append(s.end)
        out.append((i, s))
    return out


def trace_events(lines: Sequence[RankLine], origin: Optional[float] = None) -> dict:
    """The Chrome trace-event document: one process per rank (named with its rank and host), a thread of
    steps and one of collectives (more when calls overlap), each slice a complete event (``X``) with
    its number, operation and size as arguments; a hang or death an instant event on its rank."""
    starts = [s.start for line in lines for s in line.slices] + [line.mark.at for line in lines if line.mark]
    t0 = origin if origin is not None else min(starts, default=0.0)

    def us(t: float) -> float:
        return round((t - t0) * 1e6, 1)

    events: list = []
    for order, line in enumerate(lines):
        pid = line.pid
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
                       "args": {"name": line.label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                       "args": {"sort_index": order}})
        named = set()
        for kind, base in (("step", 1), ("collective", 10)):
            for lane, s in _lanes([s for s in line.slices if s.kind == kind]):
                tid = base + lane
                if tid not in named:
                    named.add(tid)
                    events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
                                   "args": {"name": "steps" if kind == "step" else f"collectives {lane + 1}"}})
                args = {"step": s.n} if kind == "step" else {"n": s.n, "op": s.name, "bytes": s.nbytes}
                events.append({"ph": "X", "name": s.name, "cat": kind, "pid": pid, "tid": tid, "ts": us(s.start),
                               "dur": round(max(0.0, s.end - s.start) * 1e6, 1), "args": args})
        if line.mark is not None:
            events.append({"ph": "i", "s": "p", "name": line.mark.kind, "cat": "verdict", "pid": pid, "tid": 1,
                           "ts": us(line.mark.at), "args": {"what": safe_text(line.mark.text)}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"tool": "ddpdoctor run", "clock": "CLOCK_MONOTONIC seconds, from the earliest event"}}


def write_trace(path: str, lines: Sequence[RankLine]) -> None:
    """``trace.json`` in the run directory (user-only, never through a link).

    Raises:
        OSError: it cannot be written (a full disk).
    """
    from ddpdoctor.postmortem.rundir import write_private

    write_private(path, json.dumps(trace_events(lines), separators=(",", ":")) + "\n")
