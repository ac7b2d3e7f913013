"""The Flight Recorder of a job under ``ddpdoctor run``: asking its live ranks for dumps, and reading them.

The hook ``run`` injects (:mod:`ddpdoctor.postmortem.inject.sitecustomize`) keeps a thread in every rank
that watches ``fr-request`` in the run directory. :func:`request_dumps` rewrites that file with a new
token; each live rank then writes ``flight-recorder-rank<N>`` (its Flight Recorder dump, through a
rename) and ``frdump-<pid>.json`` (the token it answered, or the error: no process group yet, a torch
without the recorder). A rank that raised or exited non-zero wrote its dump from its exit handler
(``why``: ``raised``/``exit``). :func:`read_recorder` takes, per rank, only a dump that answers this
request or was written at its end (never an older one left by an earlier ``stacks``), and names every
rank without one and why: dead (a signal leaves no dump), could not dump, or no answer in time.

Used by ``run``'s verdict (:func:`lead_lines`: the divergent collective by number, the ranks on each
side and the user's lines) and by ``ddpdoctor stacks`` (:func:`last_collectives`). When no rank could
dump (an older torch, the recorder turned off with ``TORCH_FR_BUFFER_SIZE=0``), both say nothing more
than before.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ddpdoctor.postmortem.flight_recorder import DumpSet, RankDump
from ddpdoctor.result import format_ranks
from ddpdoctor.system.redact import safe_text

__all__ = ["PREFIX", "REQUEST", "DumpRequest", "RankRef", "RecorderReading", "request_dumps", "wait_dumps",
           "read_recorder", "lead_lines", "last_collectives"]

PREFIX = "flight-recorder-rank"
REQUEST = "fr-request"
OLDEST_TORCH = (2, 11)
"""The oldest torch whose recorder ``run`` reads: checked with real dumps of torch 2.11 (gloo and NCCL,
format 2.10) and jobs under torch 2.13 (gloo). An older torch's ranks are still asked (torch 2.8 and
newer have ``_dump_fr_trace``, older ones ``_dump_nccl_trace`` on NCCL only); the verdict then says in
one line that it is below this."""


@dataclass(frozen=True)
class DumpRequest:
    """One request for dumps: its token and when it was made (``time.time()``)."""

    token: str
    t: float
    wait: float


@dataclass(frozen=True)
class RankRef:
    """A rank as the caller knows it: number, pid, alive, and how it ended (words) when it did."""

    rank: Optional[int]
    pid: int
    alive: bool
    ended: str = ""


@dataclass
class RecorderReading:
    """What the dumps say: the dump set (None when no rank's dump could be used) and, per rank, why it
    has none."""

    dumps: Optional[DumpSet] = None
    verdicts: list = field(default_factory=list)
    no_dump: dict = field(default_factory=dict)  # rank (or pid when unknown) -> why, in words
    unavailable: str = ""  # why no rank dumped at all (shown nowhere noisy)
    torch: str = ""  # the ranks' torch version, when older than OLDEST_TORCH (then one line says so)

    def to_dict(self) -> dict:
        return {"dumped": sorted(self.dumps.dumps) if self.dumps else [],
                "no_dump": {str(k): safe_text(v) for k, v in self.no_dump.items()},
                "unavailable": safe_text(self.unavailable),
                "groups": [v.to_dict() for v in self.verdicts]}


def _status(run_dir: str, pid: int) -> Optional[dict]:
    try:
        with open(os.path.join(run_dir, f"frdump-{pid}.json"), encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def request_dumps(run_dir: str, wait: float) -> Optional[DumpRequest]:
    """Ask every live rank of the run in ``run_dir`` for its dump; None when the request cannot be written."""
    token = uuid.uuid4().hex[:16]
    path = os.path.join(run_dir, REQUEST)
    tmp = os.path.join(run_dir, f".{REQUEST}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"token": token}, f)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return None
    return DumpRequest(token, time.time(), wait)


RECENT_S = 60.0
"""A rank that answered a request this recently writes no dump at its end (the hook): for a rank that
ended, a request's dump this young is its last (whoever asked)."""


def _answered(status: Optional[dict], req: Optional[DumpRequest], ended: bool = False) -> bool:
    """The status record answers ``req``, or was written at the rank's end (then it is final), or, for a
    rank that ended, answered any request in the last :data:`RECENT_S` seconds (its hook then wrote none
    at its end)."""
    if status is None:
        return False
    if status.get("why") in ("raised", "exit"):
        return True
    if req is not None and status.get("token") == req.token:
        return True
    t = status.get("t")
    return ended and isinstance(t, (int, float)) and time.time() - t < 2 * RECENT_S


def _final(status: Optional[dict]) -> bool:
    """The rank's answer is whole: its dump with stacks, or an error (no dump will follow)."""
    return status is not None and (status.get("stage") != "quick" or bool(status.get("error")))


def wait_dumps(run_dir: str, req: Optional[DumpRequest], pids: Sequence[int], deadline: float) -> None:
    """Until every pid in ``pids`` answered ``req`` with its whole dump (or ended), or ``deadline``
    (monotonic); a dump without stacks (written first, at once) is what a late rank leaves."""
    if req is None:
        return
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if os.path.exists(f"/proc/{p}") and not (
            _answered(s := _status(run_dir, p), req) and _final(s))]
        if left:
            time.sleep(0.05)


def read_recorder(run_dir: str, ranks: Sequence[RankRef], req: Optional[DumpRequest]) -> RecorderReading:
    """The dumps that answer ``req`` or were written at a rank's end, read and compared; never raises
    for a dump that cannot be read (its rank is named instead)."""
    from ddpdoctor.errors import UsageError
    from ddpdoctor.postmortem.divergence import find_divergences
    from ddpdoctor.postmortem.flight_recorder import read_dumps

    reading = RecorderReading()
    fresh: set = set()
    errors: list = []
    for r in ranks:
        status = _status(run_dir, r.pid)
        key = r.rank if r.rank is not None else f"pid {r.pid}"
        reading.torch = reading.torch or _older_torch(status)
        if _answered(status, req, not r.alive) and isinstance(status.get("rank"), int) and status.get("file"):
            fresh.add(status["rank"])
        elif _answered(status, req, not r.alive) and status.get("error"):
            reading.no_dump[key] = f"could not dump: {status['error']}"
            errors.append(status["error"])
        elif r.alive and req is not None:
            reading.no_dump[key] = f"no dump within {req.wait:g}s (busy outside Python, or stopped)"
        elif not r.alive:
            reading.no_dump[key] = "left no dump: " + (r.ended or "ended") + (
                "" if "signal" in (r.ended or "") else " (its hook wrote none)")
        else:
            reading.no_dump[key] = "left no dump"
    if not fresh:
        reading.unavailable = errors[0] if errors else "no rank wrote a dump"
        return reading
    try:
        dumps = read_dumps(run_dir, PREFIX)
    except UsageError as exc:
        reading.unavailable = exc.message if hasattr(exc, "message") else str(exc)
        return reading
    for rank in [k for k in dumps.dumps if k not in fresh]:
        del dumps.dumps[rank]  # an older dump (an earlier stacks request): not this moment's
    known = {r.rank for r in ranks if r.rank is not None}
    dumps.world = sorted(set(dumps.world) | known | set(dumps.dumps))
    dumps.world_known = dumps.world_known or bool(known)
    if not any(d.entries for d in dumps.dumps.values()):
        reading.unavailable = "no collective recorded (TORCH_FR_BUFFER_SIZE=0?)"
        return reading
    reading.dumps = dumps
    reading.verdicts = find_divergences(dumps)
    return reading


def _older_torch(status: Optional[dict]) -> str:
    """The rank's torch version (its record's ``torch``, or the one its error names) when older than
    :data:`OLDEST_TORCH`; "" otherwise."""
    import re

    if not status:
        return ""
    text = str(status.get("torch") or "")
    if not text:
        m = re.match(r"torch (\S+) ", str(status.get("error") or ""))
        text = m.group(1) if m else ""
    m = re.match(r"(\d+)\.(\d+)", text)
    return safe_text(text)[:40] if m and (int(m.group(1)), int(m.group(2))) < OLDEST_TORCH else ""


def _group_name(v) -> str:
    if v.group == "0":
        return "the default group"
    return f"process group '{v.group}'" + (f" ({v.desc})" if v.desc else "")


def _ranks(rs: Sequence[int]) -> str:
    return f"rank{'s' if len(rs) != 1 else ''} {format_ranks(list(rs))}"


def lead_lines(reading: RecorderReading, places: Optional[dict] = None) -> list:
    """The verdict's first finding: per process group that diverged, the collective by number, the ranks
    on each side and the lines that issued each call; then the ranks with no dump. Nothing when no dump
    could be used (the recorder is unavailable: the verdict is as before).

    ``places``: rank -> where its stack is (``describe_place``), shown for a call whose dump came without
    stacks (the rank's stack dump was still being written)."""
    from ddpdoctor.postmortem.divergence import describe_entry

    places = places or {}

    def call(ranks: Sequence[int], e) -> str:
        text = describe_entry(e)
        if e.frames:
            return text
        where = places.get(ranks[0]) if len(ranks) == 1 or all(places.get(r) == places.get(ranks[0])
                                                                 for r in ranks) else None
        return text + (safe_text(f" (stack: {where})") if where else "")

    oldest = f"{OLDEST_TORCH[0]}.{OLDEST_TORCH[1]}"
    if reading.dumps is None:
        return [f"Flight Recorder: not read: the ranks run torch {reading.torch}; ddpdoctor reads the recorder of "
                f"torch {oldest} and newer"] if reading.torch else []
    out: list = []
    for v in reading.verdicts:
        if v.kind == "none":
            continue
        where = _group_name(v)
        if v.kind == "mismatch":
            sides = ", ".join(f"{_ranks(rs)} called {e.op}" for rs, e in v.variants)
            out.append(f"Flight Recorder: collective #{v.seq} of {where}: {sides}")
        elif v.kind == "absent":
            entered = sorted(r for rs, _ in v.variants for r in rs)
            absent = [r for r, _ in v.absent]
            out.append(f"Flight Recorder: collective #{v.seq} of {where}: {_ranks(entered)} entered, "
                       f"{_ranks(absent)} never did")
        else:  # waiting on ranks with no dump
            entered = sorted(r for rs, _ in v.variants for r in rs)
            out.append(f"Flight Recorder: collective #{v.seq} of {where}: {_ranks(entered)} entered, waiting for "
                       f"{_ranks(v.missing)} (no dump)")
        for rs, e in v.variants:
            out.append(f"  {_ranks(rs)}: #{v.seq} {call(rs, e)}")
        for r, e in v.absent:
            last = f"last entered #{e.seq} {describe_entry(e)}" if e else "entered nothing in this group"
            out.append(f"  rank {r}: {last}" + (safe_text(f"; now at {places[r]}") if places.get(r) else ""))
        if v.cause:
            out.append(safe_text(f"  cause: {v.cause}"))
    if not out:
        n = len(reading.dumps.dumps)
        if not reading.no_dump:
            out.append(f"Flight Recorder: no divergence in the collectives of the {n} rank{'s' if n != 1 else ''} "
                       "that dumped (the ranks agree on every recorded call)")
        for v in reading.verdicts if reading.no_dump else ():
            last = _last_call(reading.dumps, v.group, v.last_seq)
            if last is not None:
                rs, e = last
                out.append(f"Flight Recorder: no divergence among the ranks that dumped; {_group_name(v)}'s last "
                           f"collective: #{e.seq} {describe_entry(e)}, entered by {_ranks(rs)}")
    for key, why in sorted(reading.no_dump.items(), key=lambda kv: str(kv[0])):
        who = f"rank {key}" if isinstance(key, int) else key
        out.append(safe_text(f"  {who}: {why}"))
    if reading.torch:
        out.insert(0, f"Flight Recorder: the ranks run torch {reading.torch}, older than {oldest} (the oldest whose "
                      "recorder ddpdoctor reads): what follows is read as it is, unchecked")
    return out


def _last_call(dumps: DumpSet, group: str, seq: int) -> Optional[tuple]:
    """(ranks, entry) of the ranks whose dump holds collective ``seq`` of ``group``; None when none does."""
    found = [(r, e) for r, d in sorted(dumps.dumps.items()) for e in d.entries if e.group == group and e.seq == seq
             and not e.is_p2p]
    return ([r for r, _ in found], found[0][1]) if found else None


def _state(d: RankDump, e) -> str:
    """An entry's state in words: completed (``pg_status`` says so on gloo, whose entries all stay
    ``scheduled``; the entry's own state elsewhere), started, or entered and not completed."""
    if e.state == "completed" or (e.pg_id >= 0 and e.seq <= d.completed(e.pg_id)):
        return "completed"
    started = d.status.get(e.pg_id, {}).get("last_started_collective")
    try:
        if e.state == "started" or (started is not None and e.seq <= int(started) and e.backend != "gloo"):
            return "started, not completed"
    except (TypeError, ValueError):
        pass
    return "entered, not completed"


def last_collectives(d: RankDump, count: int = 3) -> list:
    """The rank's last ``count`` recorded collectives: ``#4 all_reduce [4] Float (default group): completed``."""
    out = []
    for e in d.entries[-count:]:
        group = "default group" if e.group == "0" else f"group '{e.group}'"
        sizes = " ".join("[" + ",".join(map(str, s)) + "]" for s in e.input_sizes)
        dtypes = ",".join(sorted(set(e.input_dtypes)))
        call = " ".join(p for p in (e.op, sizes, dtypes) if p)
        out.append(safe_text(f"#{e.seq} {call} ({group}): {_state(d, e)}"))
    return out
