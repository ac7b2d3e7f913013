"""``ddpdoctor run``'s watches for silent bugs, on run's side (issue 24).

Each rank's hook (:mod:`ddpdoctor.postmortem.inject._ddpdoctor_watches`) writes what it saw into the
run directory; :class:`Watches` reads it from ``run``'s loop, compares the ranks, and names each
finding once: a line on run's terminal while the job runs (the rank(s), the user's line, the fix),
then again in the final summary and in ``verdict.json``. Never a collective, never a wait on a rank:
a rank that is late or gone only makes a window be skipped.

* ``sampler-epoch``: the ranks find it themselves (``finding-<pid>-<n>.json``); here the same finding
  of several ranks becomes one line, printed when every live rank reported it or ``GRACE`` seconds
  after the first did.
* ``data-plan``: each rank writes what a pass over a loader will read (``plan-<pid>-<n>.json``, when it
  changed); once every rank's plan for a loop is in, a difference (batches, dataset length, the sampler's
  ``num_replicas``, ``seed``, ``drop_last``) is named with each rank's value.
* ``desync``: from the ranks' optimizer step counts (``desync-steps-<pid>``), the steps of one
  ``window`` (``desync-period``, written once the rate is known, again only when it changed more than
  twofold); each rank fingerprints its parameters at the start of every step whose count is a
  multiple of it (``desync-<pid>-window-<step>.json``). Also at the first step (``start``) and at the end
  (``final``). The records of one step from every rank are compared here, a tensor by its place
  (``optimizer <k> parameter <i>``), never by its name, which a rank took from its own frames; the
  first difference is the finding, with the tensors, the ranks, when it was first seen and the likely reason.
* ``solo-wait``: ranks that waited in one collective for half of the process group's timeout while
  another rank worked alone, named at once (before the timeout ends the job): :mod:`ddpdoctor.postmortem.solowait`.
* ``bn-drift``: BatchNorm running statistics compared where the ranks' drift survives, at evaluation
  and at the end (:mod:`ddpdoctor.postmortem.bndrift`).
"""

from __future__ import annotations

import glob
import json
import os
import time
from dataclasses import dataclass, field
from typing import Optional

from ddpdoctor.postmortem.solowait import SoloWait
from ddpdoctor.postmortem.bndrift import BnDrift
from ddpdoctor.postmortem.rundir import take_records
from ddpdoctor.system.stackframes import shown_where

__all__ = ["WATCHES", "Watches", "Finding", "parse_no_watch", "watch_env", "window_from_env"]

WATCHES = ("sampler-epoch", "data-plan", "desync", "bn-drift", "solo-wait")
GRACE = 10.0  # seconds to wait for the other ranks' report of the same finding before naming it
DEFAULT_WINDOW = 60.0


def _env_name(watch: str) -> str:
    return "DDPDOCTOR_WATCH_" + watch.upper().replace("-", "_")


def parse_no_watch(values: tuple) -> tuple:
    """The watch names of ``--no-watch a,b`` (repeatable).

    Raises:
        UsageError: a name that is not a watch.
    """
    from ddpdoctor.errors import UsageError

    names = []
    for value in values:
        for name in (v.strip() for v in value.split(",")):
            if not name:
                continue
            if name not in WATCHES:
                raise UsageError("bad-watch", f"--no-watch {name!r} is not a watch",
                                 f"use one or more of {','.join(WATCHES)}")
            names.append(name)
    return tuple(dict.fromkeys(names))


def watch_env(off: tuple) -> dict:
    """The job's environment variables that turn the watches ``off`` off."""
    return {_env_name(name): "0" for name in off}


def window_from_env(env: dict) -> float:
    """The desync window (seconds): ``DDPDOCTOR_WATCH_WINDOW``, else 60.

    Raises:
        UsageError: the value is not a number of seconds above 0.
    """
    from ddpdoctor.errors import UsageError

    text = env.get("DDPDOCTOR_WATCH_WINDOW", "")
    if not text:
        return DEFAULT_WINDOW
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < 1e9):
        raise UsageError("bad-watch-window", f"DDPDOCTOR_WATCH_WINDOW={text!r} is not a number of seconds above 0",
                         "set it to the seconds between parameter comparisons, e.g. 60, or unset it")
    return value


def _beat_from_env(env: dict) -> float:
    """The hook's heartbeat interval (``DDPDOCTOR_BEAT_S``, as run set it): how soon a rank answers."""
    try:
        return max(0.01, float(env.get("DDPDOCTOR_BEAT_S", "1")))
    except ValueError:
        return 1.0


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _ranks_text(ranks: list) -> str:
    ranks = sorted(set(ranks), key=lambda r: (not isinstance(r, int), r if isinstance(r, int) else 0, str(r)))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


@dataclass
class Finding:
    """One silent bug, as named: once, with every rank that saw it."""

    watch: str
    key: str
    what: str
    fix: str
    where: str = ""
    ranks: list = field(default_factory=list)
    when: str = ""
    first_at: float = 0.0
    printed: bool = False

    def line(self) -> str:
        where = f" ({shown_where(self.where)})" if self.where and self.where not in self.what else ""
        return f"[{self.watch}] {_ranks_text(self.ranks)}: {shown_where(self.what)}{where}; fix: {self.fix}"

    def to_dict(self) -> dict:
        return {"watch": self.watch, "ranks": sorted(self.ranks, key=str), "what": shown_where(self.what),
                "where": shown_where(self.where), "fix": self.fix, "when": self.when}


class Watches:
    """Reads the ranks' watch files every poll of ``run``; lines to print as findings are made."""

    def __init__(self, run_dir: str, window: float, env: dict) -> None:
        self.run_dir = run_dir
        self.window = window
        self.on = {name: env.get(_env_name(name), "1") != "0" for name in WATCHES}
        self.findings: list = []
        self.by_key: dict = {}
        self.read: set = set()
        self.started = time.monotonic()
        self.next_at: Optional[float] = None
        self.period = 0  # optimizer steps per window, as last written to desync-period
        self.seen_steps: dict = {}  # pid -> [(time, step count)], the last few seconds: the step rate
        self.groups: dict = {}  # (kind, step) -> {pid: record}
        self.group_at: dict = {}
        self.compared: set = set()
        self.where_of: dict = {}  # pid -> the last optimizer.step line seen
        self.start_diff: set = set()
        self.desync_found = False
        self.plans: dict = {}  # loop line -> {pid: the latest plan record}
        self.solo = SoloWait(run_dir, _beat_from_env(env), self._add) if self.on["solo-wait"] else None
        self.bn = BnDrift(run_dir, window)

    # --- the loop ------------------------------------------------------------------------------

    def poll(self, now: float, procs: list) -> list:
        """Read what the ranks wrote; the lines of findings to name now. ``procs``: run's rank records."""
        if not self._active:
            return []
        self._read(procs, now, end=False)
        if self.on["desync"]:
            self._window(now, [p for p in procs if p.alive])
        lines = []
        if self.solo is not None:  # named at once: the timeout may end the job before GRACE
            for f in self.solo.poll(now, [p for p in procs if p.alive], self._solo_rank):
                if not f.printed:
                    f.printed = True
                    lines.append(f.line())
        return lines + self._due(now, [p for p in procs if p.alive])

    def _solo_rank(self, proc, record: dict):
        return proc.rank if proc.rank is not None else self._rank_of({}, proc.pid, record)

    def finish(self, procs: list) -> list:
        """After the job ended: compare what is left (the end's fingerprints); every finding not yet named."""
        if not self._active:
            return []
        now = time.monotonic()
        self._read(procs, now, end=True)
        return self._due(now, [], final=True)

    @property
    def _active(self) -> bool:
        return (self.on["sampler-epoch"] or self.on["desync"] or self.on["data-plan"] or self.on["solo-wait"]
                or self.on["bn-drift"])

    def _read(self, procs: list, now: float, end: bool) -> None:
        """The ranks' findings, plans and fingerprint records; compare the complete fingerprint sets."""
        ranks = {p.pid: p for p in procs}
        self._read_findings(ranks, now)
        if self.on["data-plan"]:
            self._read_plans(ranks, now)
            self._read_counts(ranks, now)
        if self.on["desync"]:
            self._read_records(ranks, now)
            self._compare_complete(ranks, now, end=end)
        if self.on["bn-drift"]:
            self.bn.read(ranks, now, end, self._rank_of, self._add)

    # --- data-plan -------------------------------------------------------------------------------

    def _read_plans(self, ranks: dict, now: float) -> None:
        """The latest plan of each rank per loop; a loop whose ranks' plans differ is a finding."""
        new = []
        for path in glob.glob(os.path.join(glob.escape(self.run_dir), "plan-*.json")):
            if path in self.read:
                continue
            try:
                with open(path) as f:
                    new.append(json.load(f))
            except (OSError, ValueError):
                continue
            self.read.add(path)
        changed: dict = {}  # loop lines in the order the ranks reached them (a rank's records are numbered)
        for record in sorted(new, key=lambda r: r.get("n", 0)):
            pid, where = int(record.get("pid", 0)), record.get("where", "")
            latest = self.plans.setdefault(where, {})
            if pid not in latest or latest[pid]["n"] < record.get("n", 0):
                record["rank"] = self._rank_of(ranks, pid, record)
                latest[pid] = record
                changed[where] = True
        for where in changed:
            latest = self.plans[where]
            if ("data-plan", where) in self.by_key or len(ranks) < 2 or not set(ranks) <= set(latest):
                continue
            records = sorted(latest.values(), key=lambda r: str(r["rank"]))
            fields = []
            for name in dict.fromkeys(k for r in records for k in r["plan"]):
                values = [(r["rank"], r["plan"].get(name)) for r in records]
                if len({v for _, v in values}) > 1:
                    fields.append(f"{name}: " + ", ".join(f"rank {rank} {value}" for rank, value in values))
            if not fields:
                continue
            batches = {r["plan"].get("batches") for r in records}
            what = (f"the ranks read different data plans at the loop at {where}: " + "; ".join(fields) +
                    ("; the ranks run different numbers of batches this epoch: the epoch's end will hang (a rank "
                     "with more batches waits in a collective the others never join) or pair collectives of "
                     "different steps" if len(batches) > 1 else
                     "; the ranks' shards overlap or leave samples out"))
            fix = ("give every rank the same dataset and the same DistributedSampler settings (it pads the shards to "
                   "equal length), or drop_last=True; for uneven inputs on purpose, DDP's join() context manager")
            f = self._add("data-plan", where, what, fix, where, records[0]["rank"], now)
            for r in records[1:]:
                f.ranks.append(r["rank"])

    def _read_counts(self, ranks: dict, now: float) -> None:
        """Loaders without len(): the same training pass (the n-th over a loop line) read different numbers of
        batches on different ranks, once one rank's pass ended and another's count differs from it."""
        passes: dict = {}  # (loop line, pass number) -> {rank: (batches, ended)}
        training: set = set()  # the passes during which an optimizer stepped on some rank
        for path in glob.glob(os.path.join(glob.escape(self.run_dir), "count-[0-9]*.json")):
            try:
                with open(path) as f:
                    record = json.load(f)
                pid = int(record.get("pid", 0))
                rows = [(str(w), int(n), int(b), bool(e), bool(t)) for w, n, b, e, t in record.get("passes", [])]
            except (OSError, ValueError, TypeError):
                continue
            for where, n, batches, ended, trained in rows:
                passes.setdefault((where, n), {})[self._rank_of(ranks, pid, record)] = (batches, ended)
                if trained:
                    training.add((where, n))
        for (where, n), counts in sorted(passes.items(), key=lambda kv: kv[0][1]):
            if ("data-plan", f"counted:{where}") in self.by_key or len(counts) < 2 or (where, n) not in training:
                continue  # an evaluation pass (no optimizer step on any rank) may read uneven shards
            ended = {b for b, e in counts.values() if e}
            if not ended or (len(ended) == 1 and not any(b > min(ended) for b, e in counts.values() if not e)):
                continue  # no rank's pass ended yet, or the others agree with it so far
            shown = "; ".join(f"rank {r} {b}" + ("" if e else " so far (still reading)")
                              for r, (b, e) in sorted(counts.items(), key=lambda kv: str(kv[0])))
            what = (f"the ranks read different numbers of batches in the same pass (the {_ordinal(n + 1)}) over the "
                    f"loader at {where}, which has no len(): batches counted: {shown}; a rank with more batches "
                    "waits in a collective the others never join (the epoch's end hangs) or pairs collectives of "
                    "different steps")
            fix = ("give every rank the same number of batches: split an IterableDataset's stream evenly by rank "
                   "(torch.utils.data.get_worker_info() for its workers too) and stop every rank at the same "
                   "count; for uneven inputs on purpose, DDP's join() context manager")
            ranks_sorted = sorted(counts, key=str)
            f = self._add("data-plan", f"counted:{where}", what, fix, where, ranks_sorted[0], now)
            for r in ranks_sorted[1:]:
                if r not in f.ranks:
                    f.ranks.append(r)

    def to_json(self) -> list:
        return [f.to_dict() for f in self.findings]

    def summary(self) -> list:
        return [f.line() for f in self.findings]

    # --- findings of single ranks --------------------------------------------------------------

    def _rank_of(self, ranks: dict, pid: int, record: dict):
        p = ranks.get(pid)
        if p is not None and p.rank is not None:
            return p.rank
        return record.get("rank") if record.get("rank") is not None else f"pid {pid}"

    def _read_findings(self, ranks: dict, now: float) -> None:
        for path in sorted(glob.glob(os.path.join(glob.escape(self.run_dir), "finding-*.json"))):
            if path in self.read:
                continue
            try:
                with open(path) as f:
                    record = json.load(f)
            except (OSError, ValueError):
                continue
            self.read.add(path)
            self._add(record.get("watch", "?"), record.get("key", ""), record.get("what", ""),
                      record.get("fix", ""), record.get("where", ""),
                      self._rank_of(ranks, int(record.get("pid", 0)), record), now)

    def _add(self, watch: str, key: str, what: str, fix: str, where: str, rank, now: float, when: str = "") -> Finding:
        f = self.by_key.get((watch, key))
        if f is None:
            f = self.by_key[(watch, key)] = Finding(watch, key, what, fix, where, [], when, now)
            self.findings.append(f)
        if rank not in f.ranks:
            f.ranks.append(rank)
        return f

    def _due(self, now: float, live: list, final: bool = False) -> list:
        lines = []
        live_ranks = {p.rank for p in live if p.rank is not None}
        for f in self.findings:
            if f.printed:
                continue
            if final or now - f.first_at >= GRACE or (live_ranks and live_ranks <= set(f.ranks)):
                f.printed = True
                lines.append(f.line())
        return lines

    # --- desync ----------------------------------------------------------------------------------

    def _steps(self, pid: int) -> Optional[int]:
        try:
            with open(os.path.join(self.run_dir, f"desync-steps-{pid}"), "rb") as f:
                return int(f.read(32).split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _window(self, now: float, live: list) -> None:
        """Once the step rate is known, the period: the optimizer steps of one window, so that every rank
        fingerprints at the same step counts (its multiples) with no round trip per window. Written
        again only when the rate changed more than twofold, and only while steps move."""
        rate, span = 0.0, 0.0
        for p in live:
            count = self._steps(p.pid)
            if count is None:
                continue
            seen = self.seen_steps.setdefault(p.pid, [])
            seen.append((now, count))
            while len(seen) > 2 and now - seen[1][0] >= self.window:
                seen.pop(0)
            if now - seen[0][0] > 0:
                rate = max(rate, (count - seen[0][1]) / (now - seen[0][0]))
                span = max(span, now - seen[0][0])
        if self.next_at is None:
            self.next_at = now + self.window
        if now < self.next_at or len(live) < 2 or rate <= 0 or span < min(self.window, 1.0):
            return
        self.next_at = now + self.window
        period = max(1, round(rate * self.window))
        if self.period and self.period / 2 <= period <= self.period * 2:
            return
        self.period = period
        path = os.path.join(self.run_dir, "desync-period")
        tmp = os.path.join(self.run_dir, ".desync-period.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{period}\n")
        os.replace(tmp, path)

    def _read_records(self, ranks: dict, now: float) -> None:
        for record in take_records(self.run_dir, "desync-[0-9]*-*.json"):
            pid = int(record.get("pid", 0))
            record["rank"] = self._rank_of(ranks, pid, record)
            if record.get("where"):
                self.where_of[pid] = record["where"]
            key = (record.get("kind", ""), int(record.get("step", 0)))
            if key in self.compared:
                continue
            self.groups.setdefault(key, {})[pid] = record
            self.group_at.setdefault(key, now)

    def _compare_complete(self, ranks: dict, now: float, end: bool) -> None:
        expected = set(ranks)
        for key in sorted(self.groups, key=lambda k: (k[1], k[0] != "start")):
            group = self.groups[key]
            if len(expected) < 2 or not expected <= set(group):
                if end or now - self.group_at.get(key, now) > 2 * self.window + 10:
                    self.groups.pop(key, None)  # a rank never wrote it (gone, or past the step): skipped
                continue
            self.groups.pop(key)
            self.compared.add(key)
            self._compare(key, [group[pid] for pid in sorted(group, key=lambda q: str(group[q]["rank"]))], now)
        if end:
            self.groups.clear()

    def _compare(self, key: tuple, records: list, now: float) -> None:
        kind, step = key
        values: dict = {}  # a tensor's place (the same on every rank) -> {rank: its fingerprint}
        flags: dict = {}
        names: dict = {}  # place -> the name shown: the first rank's
        for rec in records:
            for entry in rec.get("tensors", []):
                name, value, flag = entry[:3]
                place = entry[3] if len(entry) > 3 else name
                values.setdefault(place, {})[rec["rank"]] = value
                flags.setdefault(place, set()).add(flag)
                names.setdefault(place, name)
        diff = [n for n, by_rank in values.items() if len(by_rank) == len(records) and len(set(by_rank.values())) > 1]
        taken = [names[n] for n in values]
        for n in values:  # two tensors of one name (``model`` in the training function, for two models): told apart
            if taken.count(names[n]) > 1 and names[n] != n:
                names[n] = f"{names[n]} ({n})"
        if kind == "start":
            self.start_diff = set(diff)
        if not diff or self.desync_found:
            return
        self.desync_found = True
        by_value: dict = {}
        for rank, value in values[diff[0]].items():
            by_value.setdefault(value, []).append(rank)
        groups = sorted(by_value.values(), key=lambda g: (-len(g), min(str(r) for r in g)))
        if len(groups[0]) > 1 and len(groups) > 1:
            odd = [r for g in groups[1:] for r in g]
            who = f"{_ranks_text(odd)} {'differs' if len(odd) == 1 else 'differ'} from {_ranks_text(groups[0])}"
        else:
            who = f"{_ranks_text([r for g in groups for r in g])} all hold different values"
        when = {"start": "at the first optimizer step",
                "final": f"at the end (after {step} optimizer steps)"}.get(kind, f"at optimizer step {step} "
                                                                            f"({now - self.started:.0f} s in)")
        shown = ", ".join(names[n] for n in diff[:4]) + (f" and {len(diff) - 4} more" if len(diff) > 4 else "")
        reason, fix, where = self._reason(diff, flags, records, names)
        what = (f"{len(diff)} parameter tensor{'s' if len(diff) != 1 else ''} differ across ranks ({who}), first "
                f"seen {when}: {shown}; likely reason: {reason}")
        rank_list = sorted({r for rec in records for r in [rec["rank"]]}, key=str)
        f = self._add("desync", "desync", what, fix, where, rank_list[0], now, when)
        for r in rank_list[1:]:
            f.ranks.append(r)

    def _reason(self, diff: list, flags: dict, records: list, shown_as: dict) -> tuple:
        """(likely reason, fix, the user's line) from what the hooks saw. ``diff``: the tensors' places;
        ``shown_as``: place -> the name shown."""
        step_where = next((rec.get("where") for rec in records if rec.get("where")), "") or \
            next(iter(self.where_of.values()), "")
        ddp_where = next((w for rec in records for w in rec.get("ddp", []) if w), "")
        no_ddp = all(not rec.get("ddp") for rec in records)
        seeded = bool(self.start_diff & set(diff))
        if any("attached" in flags.get(n, ()) for n in diff):
            names = [shown_as[n] for n in diff if "attached" in flags.get(n, ())]
            return (f"{', '.join(names[:3])} {'was' if len(names) == 1 else 'were'} attached to the model after "
                    f"DistributedDataParallel was built (at {ddp_where}): DDP broadcasts and averages only the "
                    f"parameters it saw when it was built",
                    "attach every module before wrapping: build the whole model, then DistributedDataParallel(model)",
                    ddp_where)
        if no_ddp:
            reason = ("the model is never wrapped in DistributedDataParallel: each rank steps with its own "
                      "gradients" + (", and the ranks were seeded differently (their parameters differ from the "
                                     "first step: no DDP broadcast made them equal)" if seeded else ""))
            return (reason, "wrap the model in DistributedDataParallel before building the optimizer (it "
                    "broadcasts rank 0's parameters and averages the gradients), or all-reduce the gradients "
                    "yourself and seed every rank alike", step_where)
        if any("ddp" not in flags.get(n, ()) for n in diff):
            names = [shown_as[n] for n in diff if "ddp" not in flags.get(n, ())]
            return (f"{', '.join(names[:3])} {'is' if len(names) == 1 else 'are'} stepped by an optimizer but "
                    "in no DistributedDataParallel model: nothing averages its gradients" +
                    (" and the ranks were seeded differently" if seeded else ""),
                    "put the module that owns it inside the model before wrapping it in DistributedDataParallel, "
                    "or wrap it in DDP too", step_where)
        off = next((w for rec in records for w in rec.get("init_sync_off", []) if w), "")
        if off:
            return (f"DistributedDataParallel was built with init_sync=False (at {off}): rank 0's parameters "
                    "were never broadcast", "drop init_sync=False, or load the same weights on every rank before "
                    "wrapping", off)
        return ("not one the hook could tell: the tensors are in a DDP model; something changed them on some "
                "ranks only (an update outside backward, a rank-dependent load)",
                "look for code that changes parameters on some ranks only (under no_grad, in a rank check)",
                step_where)
