"""Collective progress as the Flight Recorder records it: which collectives a rank has completed, and
whether it is waiting in one. ``ddpdoctor run``'s hang detector asks it one question: is this rank's CPU
time progress?

Why: on NCCL a rank waiting in a collective spins in a CUDA synchronisation (``loss.item()``,
``cudaStreamSynchronize``): its CPU time grows while nothing moves, and counted as progress it would keep
a hung job alive until NCCL's own watchdog (10 minutes). The recorder says what the CPU cannot: a rank
whose main thread stays in one place, with a collective entered and not completed, and none completed
since the last look, is waiting, however busy its CPU. A rank busy on its own work (saving, evaluating)
moves its main thread, or has no collective in flight, and is not.

The injected hook writes the reading (``frprog-<pid>.json``: the backend, ``pg_status``, the active
entries on NCCL) from its own thread, at a bounded rate (see
:mod:`ddpdoctor.postmortem.inject._ddpdoctor_recorder`). What is read, per backend (the schema is torch's
``FlightRecorder.hpp``: ``pg_status`` holds ``last_enqueued_collective``, ``last_started_collective``,
``last_completed_collective`` per group; an entry's ``state`` is ``scheduled``, ``started`` or
``completed``, and ``retired`` without ``completed`` means it timed out):

* **gloo**: ``pg_status`` only. gloo's entries stay ``scheduled`` after they complete; its completions
  show in ``last_completed_collective``.
* **nccl** (and any other backend): ``pg_status`` and the entries: a collective counts as completed
  when ``pg_status`` or its entry's state says so; an entry neither completed nor retired is in flight;
  a retired one that never completed (timed out) is neither completed nor in flight.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["CollectiveState", "read_state", "read_reading", "waiting", "READING", "FRESH_S"]

READING = "frprog-{pid}.json"
"""The hook's reading in the run directory, per rank process."""
FRESH_S = 5.0
"""A reading older than this (and older than a few of the hook's periods) is not trusted: a rank whose
hook fell silent has its CPU time counted as before, never a hang it did not show."""


def _int(value, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class CollectiveState:
    """One rank's collectives at one moment.

    Args:
        backend: ``gloo``, ``nccl``, ... as the rank's process group said.
        completed: pg_id -> the last collective of that group seen complete (-1: none).
        enqueued: pg_id -> the last collective of that group entered (-1: none).
        active: collectives entered, neither completed nor retired (NCCL's entries; 0 on gloo).
        timed_out: entries retired without completing (NCCL's "retired but not completed").
    """

    backend: str
    completed: dict = field(default_factory=dict)
    enqueued: dict = field(default_factory=dict)
    active: int = 0
    timed_out: int = 0

    @property
    def in_flight(self) -> bool:
        """The rank has entered a collective that has not completed."""
        return self.active > 0 or any(n > self.completed.get(pg, -1) for pg, n in self.enqueued.items())


def read_state(doc: dict, backend: str) -> CollectiveState:
    """The state in a Flight Recorder dump (or the hook's reading, which keeps a dump's ``pg_status`` and
    active ``entries``) of a rank whose process group runs ``backend``."""
    completed: dict = {}
    enqueued: dict = {}
    for key, status in (doc.get("pg_status") or {}).items():
        if isinstance(status, dict):
            pg = _int(key)
            completed[pg] = _int(status.get("last_completed_collective"))
            enqueued[pg] = _int(status.get("last_enqueued_collective"))
    active = timed_out = 0
    if backend != "gloo":  # gloo's entries stay "scheduled" after they complete: pg_status alone says
        for e in doc.get("entries") or []:
            if not isinstance(e, dict) or e.get("is_p2p"):
                continue
            pg, seq = _int(e.get("pg_id")), _int(e.get("collective_seq_id"))
            if seq < 0:
                continue
            enqueued[pg] = max(enqueued.get(pg, -1), seq)
            if e.get("state") == "completed":
                completed[pg] = max(completed.get(pg, -1), seq)
            elif e.get("retired"):
                timed_out += 1  # retired, never completed: it timed out (FlightRecorder.hpp)
            else:
                active += 1
    return CollectiveState(backend=backend, completed=completed, enqueued=enqueued, active=active,
                           timed_out=timed_out)


def read_reading(run_dir: str, pid: int, period: float, now: Optional[float] = None) -> Optional[CollectiveState]:
    """The hook's latest reading for ``pid``, or None when there is none, it cannot be read, or it is
    stale (older than ``max(FRESH_S, 4 * period)`` seconds: the hook's thread stalled or ended)."""
    path = os.path.join(run_dir, READING.format(pid=pid))
    try:
        if (now if now is not None else time.time()) - os.stat(path).st_mtime > max(FRESH_S, 4 * period):
            return None
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("backend"), str):
        return None
    return read_state(doc, doc["backend"])


def waiting(before: Optional[CollectiveState], now: Optional[CollectiveState]) -> bool:
    """Is the rank waiting in a collective (its CPU time then is not progress)? Yes when ``now`` has a
    collective in flight and no collective completed since ``before``; no without a reading."""
    if now is None or not now.in_flight:
        return False
    return before is None or not completed_since(before, now)


def completed_since(before: Optional[CollectiveState], now: Optional[CollectiveState]) -> bool:
    """A collective completed between the two readings (in any group): progress."""
    if before is None or now is None:
        return False
    return any(n > before.completed.get(pg, -1) for pg, n in now.completed.items())
