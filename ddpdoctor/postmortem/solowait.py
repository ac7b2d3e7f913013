"""``solo-wait``, on ``run``'s side: ranks that wait in one collective while another rank works alone (issue 24).

A rank's hook writes ``solo-<pid>.json`` when the rank has waited in one collective for a quarter of the
process group's timeout (state ``waiting``) and again at half (state ``long``), and removes it when the
wait ends (:mod:`ddpdoctor.postmortem.inject._ddpdoctor_watches`). From the first ``waiting`` on,
``run`` asks every rank where it is (``solo-ask``, a new token, again every eighth of the timeout while
the wait lasts; each rank's heartbeat answers in ``solo-where-<pid>.json`` with its main thread's user
frame), so that a recent answer is in when the wait reaches half. At ``long`` it names the finding at
once, before the timeout ends the job: who waits, in which collective and at which line, how long of how
long, and where the ranks that do not wait are (their latest complete answer), with both fixes; with no
answer yet, a few beats later, naming the ranks that did not answer as such.

Named once per collective line (the same save before the same barrier every epoch is one finding); no
finding while every live rank waits (nobody works alone: a hang, which the hang detector names). Nothing
here waits: a rank that does not answer is named as not answering.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Callable, Optional

__all__ = ["SoloWait"]


def _duration(seconds: float) -> str:
    """``8 s``, ``4.5 s``, ``10 min``: a time as a user writes a timeout."""
    if seconds < 120 or seconds % 60:
        return f"{seconds:.0f} s" if seconds >= 10 or seconds == int(seconds) else f"{seconds:.1f} s"
    return f"{seconds / 60:g} min"


def _read(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


class SoloWait:
    """Reads the ranks' long waits every poll; asks where the ranks are; names a long wait once.

    Args:
        run_dir: the run directory.
        beat: the hook's heartbeat interval (seconds): how soon a rank answers.
        add: the watches' ``_add(watch, key, what, fix, where, rank, now)``: returns the finding.
    """

    def __init__(self, run_dir: str, beat: float, add: Callable) -> None:
        self.run_dir = run_dir
        self.beat = beat
        self.add = add
        self.token = 0
        self.asked_at: Optional[float] = None
        self.answered_at: Optional[float] = None  # when the last complete answer came
        self.named: set = set()  # collective lines already named
        self.pending: dict = {}  # pid -> when its long record was first seen waiting for a fresh answer
        self.last_answers: dict = {}  # pid -> the last complete set of answers

    def poll(self, now: float, live: list, rank_of: Callable) -> list:
        """The findings to name now (``Finding`` objects). ``live``: run's live rank records."""
        waits = {}
        for path in glob.glob(os.path.join(glob.escape(self.run_dir), "solo-[0-9]*.json")):
            name = os.path.basename(path)[5:-5]
            if not name.isdigit():
                continue
            record = _read(path)
            if record is not None and isinstance(record.get("timeout"), (int, float)):
                waits[int(name)] = record
        live_pids = {p.pid for p in live}
        waits = {pid: r for pid, r in waits.items() if pid in live_pids}
        if not waits:  # no wait now: the next one asks afresh
            self.pending.clear()
            self.asked_at = self.answered_at = None
            self.last_answers = {}
            return []
        others = [p for p in live if p.pid not in waits]
        answers = self._answers(others)
        every = max(2 * self.beat, min(float(r["timeout"]) for r in waits.values()) / 8)
        if self.asked_at is None or now - self.asked_at >= every:
            self._ask(now)
        found = []
        for pid, record in sorted(waits.items()):
            where = str(record.get("where", ""))
            if record.get("state") != "long" or where in self.named or not others:
                continue  # no rank left that does not wait: nobody works alone (a hang: the hang detector's)
            if self.answered_at is None:
                first = self.pending.setdefault(pid, now)
                if now - first < max(3.0, 4 * self.beat):
                    continue  # the answer is on its way
            self.pending.pop(pid, None)
            self.named.add(where)
            by_pid = {q.pid: q for q in live}
            waiting = sorted((rank_of(by_pid[q], r) for q, r in waits.items() if str(r.get("where", "")) == where),
                             key=str)
            found.append(self._finding(record, waiting, others, answers, rank_of, now))
        return found

    def _ask(self, now: float) -> None:
        """A new question for every rank: where is your main thread?"""
        self.token += 1
        path = os.path.join(self.run_dir, "solo-ask")
        tmp = os.path.join(self.run_dir, ".solo-ask.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f"{self.token}\n")
            os.replace(tmp, path)
        except OSError:
            return
        self.asked_at = now

    def _answers(self, others: list) -> dict:
        """pid -> the answer of each rank that does not wait, to the latest question (kept from earlier)."""
        got = {}
        for p in others:
            record = _read(os.path.join(self.run_dir, f"solo-where-{p.pid}.json"))
            if record is not None and str(record.get("token", "")) == str(self.token):
                got[p.pid] = record
        if others and len(got) == len(others) and self.asked_at is not None and self.answered_at != self.asked_at:
            self.answered_at = self.asked_at  # every rank answered the question asked then
            self.last_answers = got
        return got if len(got) == len(others) else self.last_answers

    def _finding(self, record: dict, waiting: list, others: list, answers: dict, rank_of: Callable, now: float):
        timeout = float(record["timeout"])
        waited = float(record.get("waited", timeout / 2))
        what = str(record.get("what", "a collective"))
        where = str(record.get("where", ""))
        late = []
        for p in sorted(others, key=lambda q: str(rank_of(q, {}))):
            answer = answers.get(p.pid)
            label = f"rank {rank_of(p, answer or {})}"
            if answer is None:
                late.append(f"{label} (whose hook did not answer)")
            elif answer.get("waiting"):
                late.append(f"{label}, which was in {answer.get('what') or 'another collective'} at "
                            f"{answer.get('where', '')}")
            else:
                late.append(f"{label}, which was still in {answer.get('where') or 'code the hook could not name'}, "
                            "outside any collective")
        who = "rank" if len(waiting) == 1 else "ranks"
        text = (f"{who} {', '.join(str(r) for r in waiting)} waited {_duration(waited)} of {_duration(timeout)} (the "
                f"process group's timeout: {record.get('timeout_from') or 'its default'}) in {what} at {where} "
                f"for {'; and for '.join(late)}: a wait that reaches {_duration(timeout)} ends the job")
        fix = (f"raise timeout= in init_process_group (now {_duration(timeout)}) above the longest solo work, or "
               "move that work out from between the collectives (after the last one, or into a background thread) "
               "or make it collective (every rank takes part)")
        f = self.add("solo-wait", where, text, fix, where, waiting[0], now)
        for r in waiting[1:]:
            if r not in f.ranks:
                f.ranks.append(r)
        return f
