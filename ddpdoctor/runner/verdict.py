"""The verdict of a check that went wrong: the rank that failed first is the cause, the rest its consequence.

When a rank raises, returns a failed result, crashes, is killed or exits while the other ranks are
blocked in a collective that needs it, the others never finish: their silence (and the connection
errors they may raise once its process is gone) is the consequence. The verdict leads with the cause
rank's own words (its exception and file:line, its failed finding and fix, its exit code or signal),
then says where the others were left waiting. Only when no rank failed and some are silent while the
rest completed is it a hang (TIMEOUT), named by where the silent ranks are stuck.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from ddpdoctor.causes.matcher import explain_text
from ddpdoctor.check import Check, WorldInfo
from ddpdoctor.result import CheckResult, Outcome, Status, rank_label
from ddpdoctor.runner.worker import EXIT_HINT
from ddpdoctor.system.stackframes import shown_path, where_hung

__all__ = ["CAUSE_GRACE", "WAIT_GRACE", "UNREACHABLE", "Trouble", "dead_outcome", "pick_cause", "compose"]

CAUSE_GRACE = 3.0  # the promise: the verdict comes within this many seconds of a rank's failure being known
WAIT_GRACE = 1.5  # of which the other ranks get this long to finish before they count as left waiting
UNREACHABLE = "no answer"  # a silent rank whose supervisor did not answer the stack request either

# What a rank says when another rank went away under it: a consequence, never the cause.
_CONSEQUENCE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|Failed to recv|ECONNRESET|EPIPE|"
    r"recvBytes|sendBytes|[Tt]imed? ?out|Timeout|communicator was aborted|has been aborted|DistStoreError|"
    r"DistNetworkError")
_FAULT_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


@dataclass
class Trouble:
    """What the coordinator saw for one check: every outcome (dead ranks' included), who is silent,
    who died, and when each failure was first seen (monotonic seconds)."""

    check: Check
    outcomes: dict  # rank -> Outcome (the silent ranks' TIMEOUT outcomes included)
    silent: Sequence[int]
    dead: Mapping[int, dict]
    seen: Mapping[int, float]
    world: WorldInfo


def is_failure(outcome: Outcome) -> bool:
    return outcome.status in (Status.FAIL, Status.CRASH)


def _text(outcome: Outcome) -> str:
    return "\n".join((outcome.summary, *outcome.details))


def looks_like_consequence(outcome: Outcome) -> bool:
    """A failure that reads like a lost peer or an expired wait (the consequence of another rank)."""
    if outcome.finding in ("rank-exited", "rank-killed"):
        return False
    return bool(_CONSEQUENCE.search(outcome.summary + " " + str(outcome.data.get("message", ""))))


def pick_cause(outcomes: Mapping[int, Outcome], seen: Mapping[int, float]) -> Optional[int]:
    """The rank whose failure came first, preferring own failures to lost-peer errors; None if none failed."""
    failed = [r for r, o in outcomes.items() if is_failure(o) and r in seen]
    if not failed:
        return None
    return min(failed, key=lambda r: (looks_like_consequence(outcomes[r]), seen[r], r))


def dead_outcome(rank: int, info: Mapping, check: str, duration: float = 0.0) -> Outcome:
    """A rank whose process ended before it reported this check: CRASH, in words (code 0 included)."""
    log = tuple(info.get("log", ()))
    where = _fault_place(log)
    at = f" in {where}" if where else ""
    if info.get("signal"):
        sig = info["signal"]
        verb = "was killed by" if sig in ("SIGKILL", "SIGTERM", "SIGINT") else "died of"
        summary = f"{verb} {sig}{at} during '{check}'"
        hint, finding = info.get("hint", ""), "rank-killed"
    else:
        code = info.get("code")
        summary = f"exited with code {code}{at} during '{check}'"
        hint, finding = EXIT_HINT, "rank-exited"
        if code == 0:
            summary += " (before its result: an exit 0 mid-check is not success)"
    return Outcome(rank, Status.CRASH, summary, hint=hint, finding=finding, details=log,
                   data={"exit": dict(info)}, duration=duration)


def _fault_place(log: Sequence[str]) -> str:
    """The innermost frame of a fatal-signal dump in a rank's log (``faults.py:60 in run``), if any."""
    text = "\n".join(log)
    if "Fatal Python error" not in text:
        return ""
    current = text.split("Current thread", 1)[-1]
    m = _FAULT_FRAME.search(current)
    if not m:
        return ""
    return f"{m.group('func')} ({shown_path(m.group('file'))}:{m.group('line')})"


def _own_words(o: Outcome) -> str:
    """The cause rank's own words: what it raised and where, what it found, how it ended."""
    data = o.data or {}
    if o.finding == "check-crashed" and data.get("exception"):
        where = f" ({data['where']})" if data.get("where") else ""
        return f"raised {data['exception']}: {data.get('message', '')}".rstrip(": ") + where
    if o.finding in ("rank-exited", "rank-killed"):
        return o.summary
    if o.status == Status.FAIL:
        return f"failed: {o.summary}"
    return o.summary


def _short_words(o: Outcome) -> str:
    data = o.data or {}
    if o.finding == "check-crashed" and data.get("exception"):
        return f"raised {data['exception']}"
    if o.finding == "rank-exited" and "exit" not in data:
        return f"called sys.exit({data.get('exit_code')})"
    if o.finding in ("rank-exited", "rank-killed"):
        return o.summary.split(" during ")[0].split(" in ")[0]
    return "failed" if o.status == Status.FAIL else "crashed"


def _known_cause(o: Outcome) -> tuple[str, tuple[str, ...]]:
    """The catalogue's fix for the cause's message ("" when nothing known matches), and detail lines."""
    text = "\n".join((str(o.data.get("message", "")), o.summary, *o.details))
    for match in explain_text(text):
        if match.cause.id in ("peer-closed", "killed-by-signal"):
            continue
        return match.fix, (f"known cause: {match.cause.title}: {match.meaning}",)
    return "", ()


def _where(o: Outcome) -> str:
    return str(o.data.get("where", "?"))


def _stuck_parts(outcomes: Sequence[Outcome], silent: Sequence[int], verb: str, world: WorldInfo) -> list[str]:
    by_place: dict[str, list[int]] = {}
    for o in outcomes:
        if o.rank in silent:
            by_place.setdefault(_where(o), []).append(o.rank)
    lost = by_place.pop(UNREACHABLE, [])
    parts = [f"{rank_label(ranks)} {verb} {place}" for place, ranks in sorted(by_place.items())]
    if lost:
        hosts = sorted({world.hosts.get(r, "?") for r in lost})
        parts.append(f"{rank_label(lost)} on {', '.join(hosts)} lost contact (no answer on the control channel)")
    return parts


def compose(t: Trouble, refine: Callable[[CheckResult], CheckResult] = lambda r: r) -> tuple[CheckResult, str]:
    """The merged result of a check with failed, dead or silent ranks, and the reason to skip the rest.

    ``refine`` is the check's ``explain_trouble`` (bound to the control store): it may add where the
    waiting ranks are in the check's own terms.
    """
    ordered = [t.outcomes[r] for r in sorted(t.outcomes)]
    cause = pick_cause(t.outcomes, t.seen)
    duration = max((o.duration for o in ordered), default=0.0)
    if cause is None:
        return _hang(t, ordered, duration, refine)
    c = t.outcomes[cause]
    plural = "were" if len(t.silent) != 1 else "was"
    parts = [f"rank {cause} {_own_words(c)}"]
    waiting = _stuck_parts(ordered, t.silent, f"{plural} left waiting in", t.world)
    after = [o for o in ordered if o.rank != cause and is_failure(o) and o.rank not in t.silent]
    finished = [o.rank for o in ordered if o.rank not in t.silent and not is_failure(o)]
    progress: tuple[str, ...] = ()
    if waiting:  # the check may know more about where the waiting ranks are (its own progress records)
        refined = refine(CheckResult(t.check.name, c.status, "; ".join(waiting), outcomes=tuple(ordered)))
        waiting, progress = [refined.summary], refined.details
    parts += waiting
    lost_it: dict[str, list[int]] = {}
    for o in after:
        if looks_like_consequence(o):
            lost_it.setdefault(_consequence_words(o), []).append(o.rank)
        else:
            parts.append(f"rank {o.rank} then {_own_words(o)}")
    for words, rs in lost_it.items():
        parts.append(f"{rank_label(rs)} {'were' if len(rs) > 1 else 'was'} left waiting {words}")
    if finished:
        parts.append(f"{rank_label(finished)} finished")
    fix, known = _known_cause(c)
    generic = c.finding in ("check-crashed", "rank-exited", "rank-killed")  # else the check's own fix stays
    result = CheckResult(t.check.name, c.status, "; ".join(parts), hint=(fix if generic else "") or c.hint,
                         finding=c.finding, ranks=(cause,), outcomes=tuple(ordered),
                         details=known + progress, duration=duration)
    return result, f"rank {cause} {_short_words(c)}"


def _consequence_words(o: Outcome) -> str:
    """``in all_reduce, called from run (train.py:88), then lost the connection to it (...)``."""
    text = "\n".join((o.summary, *o.details))
    m = _CONSEQUENCE.search(text)
    frames = [line.strip().replace(", in ", " in ") for line in o.details if line.strip().startswith('File "')]
    place = where_hung("Current thread 0x0:\n" + "\n".join(reversed(frames))) if frames else ""
    where = f"in {place}, " if frames and not place.startswith("an unknown place") else ""
    return f"{where}then lost the connection to it ({m.group(0) if m else o.summary[:80]})"


def _hang(t: Trouble, ordered: list[Outcome], duration: float, refine: Callable[[CheckResult], CheckResult]) -> tuple[CheckResult, str]:
    """No rank failed: the silent ranks are stuck while the others completed (TIMEOUT, as before)."""
    parts = _stuck_parts(ordered, t.silent, "stuck in", t.world)
    finished = [o.rank for o in ordered if o.rank not in t.silent]
    if finished:
        parts.append(f"{rank_label(finished)} finished")
    first = next(o for o in ordered if o.rank in t.silent)
    hint, finding = first.hint, first.finding
    lost = [o.rank for o in ordered if o.rank in t.silent and _where(o) == UNREACHABLE]
    if lost:
        hosts = sorted({t.world.hosts.get(r, "?") for r in lost})
        hint = (f"check the network path to {', '.join(hosts)} (link, switch, firewall) and that node's health; "
                "the other ranks are waiting for it")
        finding = "rank-unreachable"
    result = CheckResult(t.check.name, Status.TIMEOUT, "; ".join(parts), hint=hint, finding=finding,
                         ranks=tuple(sorted(t.silent)), outcomes=tuple(ordered), duration=duration)
    return refine(result), f"{rank_label(t.silent)} hung"
