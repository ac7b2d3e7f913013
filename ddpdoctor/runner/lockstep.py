"""The coordinator: drives every rank through the checks in lockstep and merges what they report.

It runs in the supervising process of the local world, or in rank 0's supervisor in joined mode.
For each check it publishes a directive (run, skip, supervisor, stop), then waits for every rank's
outcome until the deadline, or until a short grace after a rank failed, crashed or ended (that rank is
the cause: the others are waiting for it, see :mod:`verdict`), or after the others reported a verdict
that names the missing ranks silent (``Check.named_silent``: ``locate``'s dead node). A rank that
ended becomes CRASH (exit code or signal, and its log); a rank still silent is stopped after its Python stack is taken. After
that the remaining checks are skipped with the reason (their collectives could not complete), and
every rank's outcome is still reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

from ddpdoctor.check import Check, WorldInfo
from ddpdoctor.report.progress import Progress
from ddpdoctor.result import CheckResult, Outcome, Status, format_ranks, rank_label
from ddpdoctor.runner.channel import Channel, pack_hosts
from ddpdoctor.runner.supervisor import StackDump, Supervisor
from ddpdoctor.runner.verdict import UNREACHABLE, WAIT_GRACE, Trouble, compose, dead_outcome, is_failure
from ddpdoctor.system.stackframes import where_hung

__all__ = ["Coordinator", "interrupted_results"]

POLL = 0.005
STACK_WAIT = 1.5  # seconds the silent ranks' supervisors get to answer a stack request (they take up to 1s:
# a worker's stack thread gets 0.6s, faulthandler's signal the rest; see supervisor.read_stacks)
MEASURED_EVERY = 0.1  # seconds between two looks at what a running check measured (Check.measured)

# A check's deadline is --timeout on a world whose collectives are quick; on a slow one (many ranks
# per core) it is scaled, never to infinity (issue 18: a healthy world must not end in a false
# TIMEOUT). The scale is the larger of the crowding (ranks per core over CROWDING_REFERENCE) and the
# measured seconds per collective (the slowest rank's, reported by the checks as
# ``collective_seconds``: process-group's first all_reduce on gloo, the collectives check's mean) over
# SCALE_REFERENCE, at most MAX_SCALE.
SCALE_REFERENCE = 0.25  # seconds per collective that an unscaled deadline has room for
CROWDING_REFERENCE = 16.0  # ranks per core from which the deadline scales before anything is measured
MAX_SCALE = 20.0
CROWDED = 4.0  # ranks per core from which a timeout says the world may just be too slow


@dataclass
class Coordinator:
    """Runs ``checks`` over the ranks that say hello on ``channel``.

    Args:
        channel: the control channel.
        checks: check instances, in order.
        world: the expected world (size, backend, mode, options).
        supervisor: this host's supervisor (polled while waiting).
        timeout: per-check deadline in seconds.
        port_outcomes: supervisor-side port outcomes already known here (rank -> outcome).
        blocked: a reason every check needing the process group must be skipped (e.g. port failed).
        progress: start/end events.
    """

    channel: Channel
    checks: Sequence[Check]
    world: WorldInfo
    supervisor: Supervisor
    timeout: float
    port_outcomes: dict = field(default_factory=dict)
    blocked: Optional[str] = None
    progress: Progress = field(default_factory=Progress)
    results: list = field(default_factory=list)
    lost: set = field(default_factory=set)
    hellos: dict = field(default_factory=dict)
    current: Optional[str] = None
    current_index: int = -1
    deaths: dict = field(default_factory=dict)  # rank -> how it died (dead/<rank>), read once
    facts: dict = field(default_factory=dict)  # what every run directive tells the ranks (greet)
    ranks_per_core: float = 0.0  # the most crowded node's ranks per usable core
    latency: float = 0.0  # the slowest measured seconds per collective so far

    # Waiting polls one counter or roll per tick (runner/channel.py), never every rank's key, so
    # the store messages per rank do not grow with the world.

    def _tick(self) -> None:
        self.supervisor.poll()
        time.sleep(POLL)

    def _dead(self, rank: int) -> Optional[dict]:
        return self.deaths.get(rank)

    def _read_deaths(self) -> None:
        if self.channel.count("dead") > len(self.deaths):
            for r in self.channel.roll("dead"):
                if r not in self.deaths:
                    self.deaths[r] = self.channel.get(f"dead/{r}")

    def greet(self) -> None:
        """Wait for every rank's hello until the deadline; ranks that never arrive are remembered."""
        expected = range(self.world.world_size)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.channel.count("hello") > len(self.hellos):
                for r in self.channel.roll("hello"):
                    if r not in self.hellos and r in expected:
                        self.hellos[r] = self.channel.get(f"hello/{r}")
            self._read_deaths()
            if len(self.hellos) == self.world.world_size:
                break
            if all(r in self.hellos or self._dead(r) for r in expected):
                break
            self._tick()
        hosts = {r: h["host"] for r, h in self.hellos.items()}
        gpus = min((h.get("gpus", 0) for h in self.hellos.values()), default=0)
        self.world = replace(self.world, hosts=hosts, gpus=gpus, arrived=tuple(sorted(self.hellos)))
        per_host: dict[str, list[dict]] = {}
        for h in self.hellos.values():
            per_host.setdefault(h["host"], []).append(h)
        self.ranks_per_core = max((len(hs) / max(1, min(h.get("cpus", 1) for h in hs))
                                   for hs in per_host.values()), default=0.0)
        self.facts = {"hosts": pack_hosts(hosts, self.world.world_size),
                      "ranks_per_core": round(self.ranks_per_core, 4)}

    @property
    def scale(self) -> float:
        """How many times --timeout a check of this world gets (see SCALE_REFERENCE)."""
        return min(MAX_SCALE, max(1.0, self.ranks_per_core / CROWDING_REFERENCE, self.latency / SCALE_REFERENCE))

    @property
    def deadline(self) -> float:
        return self.timeout * self.scale

    def _measured(self, result: CheckResult) -> None:
        """Keep the slowest seconds per collective that a rank of ``result`` reported."""
        for o in result.outcomes:
            value = o.data.get("collective_seconds") if isinstance(o.data, dict) else None
            if isinstance(value, (int, float)) and value > self.latency:
                self.latency = float(value)

    @property
    def missing(self) -> list[int]:
        return [r for r in range(self.world.world_size) if r not in self.hellos]

    def run(self) -> list[CheckResult]:
        """Run every check; returns (and keeps in ``results``) one merged result per check."""
        self.greet()
        self.progress.greeted(self.world)
        aborted: Optional[str] = None
        pg_broken: Optional[str] = self.blocked
        if self.missing:
            pg_broken = pg_broken or (f"{rank_label(self.missing)} never arrived")
        for i, check in enumerate(self.checks):
            self.current, self.current_index = check.name, i
            reason = aborted or self._skip_reason(check, pg_broken)
            if check.runs_in == "supervisor":
                self.channel.put(f"plan/{i}", {"action": "supervisor"})
                result = self._supervisor_side(check)
            elif reason:
                self.channel.put(f"plan/{i}", {"action": "skip", "reason": reason})
                result = CheckResult(check.name, Status.SKIP, reason)
            elif check.requires.process_group and self.missing:
                self.channel.put(f"plan/{i}", {"action": "skip", "reason": "ranks missing"})
                result = self._missing_ranks_result(check)
            else:
                self.progress.started(check.name)
                self.channel.open_roll(f"result/{i}")
                deadline = self.deadline
                self.channel.put(f"plan/{i}", {"action": "run", "deadline": round(deadline, 3), "world": self.facts})
                result, trouble = self._collect(i, check, deadline)
                result = self._with_deadline(result, deadline, bool(trouble))
                self._measured(result)
                if trouble and result.finding == "world-too-slow":
                    aborted = f"not run: '{check.name}' ran out of time in a world too slow for the deadline"
                elif trouble:
                    aborted = f"not run: {trouble} during '{check.name}'"
            if check.name == "process-group" and result.status >= Status.FAIL:
                pg_broken = pg_broken or "the process-group check failed"
            if check.name == "env" and any(o.finding == "too-few-gpus" for o in result.outcomes):
                # NCCL would fail on the ranks without a GPU and the others would wait out the deadline.
                self.blocked = self.blocked or "more ranks per node than GPUs (see 'env')"
                pg_broken = pg_broken or self.blocked
            self.results.append(result)
            self.progress.finished(result)
        self.current = None
        self.channel.put(f"plan/{len(self.checks)}", {"action": "stop"})
        return self.results

    def _skip_reason(self, check: Check, pg_broken: Optional[str]) -> Optional[str]:
        unmet = check.requires.unmet(self.world)
        if unmet:
            return unmet
        if check.requires.process_group and pg_broken and check.name != "process-group":
            return f"needs a working process group: {pg_broken}"
        if check.requires.process_group and self.blocked and check.name == "process-group":
            return f"not run: {self.blocked}"
        return None

    def _missing_ranks_result(self, check: Check) -> CheckResult:
        missing = self.missing
        arrived = format_ranks(self.hellos) or "none"
        return CheckResult(
            check.name, Status.FAIL,
            f"{rank_label(missing)} never arrived within {self.timeout:g}s "
            f"(WORLD_SIZE={self.world.world_size}, arrived: {arrived})",
            hint="start every rank (check --nnodes/--nproc-per-node and that each node's launcher ran), "
                 "or make WORLD_SIZE match the ranks you launch",
            finding="ranks-missing", ranks=tuple(missing),
        )

    def _supervisor_side(self, check: Check) -> CheckResult:
        outcomes = dict(self.port_outcomes)
        for r in self.hellos:
            if r not in outcomes and self.channel.has(f"port/{r}"):
                outcomes[r] = Outcome.from_dict(self.channel.get(f"port/{r}"))
        return check.merge(list(outcomes.values()), self.world)

    def _with_deadline(self, result: CheckResult, deadline: float, trouble: bool) -> CheckResult:
        """Say so when the deadline was scaled; on a timeout in a crowded world, say that it may only
        be slow (the ranks take turns on the cores), with the numbers, instead of a bare hang."""
        scaled = deadline > self.timeout * 1.001
        measured = (f"collectives measured at up to {self.latency:.2f}s each" if self.latency >= 0.005
                    else "no collective measured yet")
        note = (f"deadline {_seconds(deadline)}: --timeout {self.timeout:g}s scaled {deadline / self.timeout:.1f}x for "
                f"this world ({self.ranks_per_core:.3g} ranks per core, {measured}; at most "
                f"{MAX_SCALE:g}x)") if scaled else ""
        if not (trouble and result.status == Status.TIMEOUT and self.ranks_per_core >= CROWDED):
            return replace(result, details=result.details + (note,)) if note else result
        cores = self.world.world_size / max(self.ranks_per_core, 1e-9)
        slow = (f"too slow to finish within {_seconds(deadline)}, perhaps not hung: {self.world.world_size} ranks "
                f"share about {cores:.0f} CPU cores ({self.ranks_per_core:.3g} per core), so every collective "
                f"waits for each rank's turn on a core")
        return replace(result, summary=f"{slow}; {result.summary}", finding="world-too-slow",
                       hint=("run fewer ranks per core (--nproc), or raise --timeout (ddpdoctor already scaled "
                             f"it {deadline / self.timeout:.1f}x, up to {MAX_SCALE:g}x); " + result.hint),
                       details=result.details + ((note,) if note else ()))

    def _collect(self, i: int, check: Check, deadline_s: Optional[float] = None) -> tuple[CheckResult, Optional[str]]:
        """Wait for every rank's outcome of check ``i``. Once a rank failed, crashed or ended, the
        others get WAIT_GRACE to finish (not the whole deadline): those still silent then were left
        waiting for it; their stacks are taken and they are halted (see :mod:`verdict`)."""
        ranks = sorted(self.hellos)
        got: dict[int, Outcome] = {}
        dead: dict[int, dict] = {}
        seen: dict[int, float] = {}
        named: frozenset = frozenset()  # ranks the check's own verdict names silent
        started = time.monotonic()
        deadline = started + (self.timeout if deadline_s is None else deadline_s)
        look = started  # when to ask the check for what it measured (MEASURED_EVERY)
        while time.monotonic() < deadline:
            if time.monotonic() >= look:
                self._show_measured(check)
                look = time.monotonic() + MEASURED_EVERY
            reported = set(self.channel.roll(f"result/{i}"))
            self._read_deaths()
            for r in ranks:
                if r in got:
                    continue
                if r in reported:
                    got[r] = Outcome.from_dict(self.channel.get(f"result/{i}/{r}"))
                    named = self._named_silent(check, got)
                    if named and all(q in got or q in named for q in ranks):
                        deadline = min(deadline, time.monotonic() + WAIT_GRACE)
                else:
                    info = self._dead(r)
                    if info is None:
                        continue
                    dead[r] = info
                    got[r] = dead_outcome(r, info, check.name, time.monotonic() - started)
                seen[r] = time.monotonic()
                if is_failure(got[r]):
                    deadline = min(deadline, seen[r] + WAIT_GRACE)
            if len(got) == len(ranks):
                self._show_measured(check)  # the last rows, before the check's own line
                break
            self._tick()
        silent = [r for r in ranks if r not in got]
        if not silent and not dead:
            return self._merged(check, got), None
        if silent and not dead and set(silent) <= named:
            # the check's verdict already names them: its own merge says it, the rest is skipped
            stacks = self._stacks(silent)
            for r in silent:
                if r not in stacks:
                    self.lost.add(r)
                got[r] = self._silent_outcome(r, stacks.get(r), time.monotonic() - started)
            self._halt(silent)
            return self._merged(check, got), f"{rank_label(silent)} did not answer"
        stacks = self._stacks(silent) if silent else {}
        for r in silent:
            if r not in stacks:
                self.lost.add(r)
            got[r] = self._silent_outcome(r, stacks.get(r), time.monotonic() - started)
        self._halt(silent)
        try:
            result, trouble = compose(Trouble(check, got, silent, dead, seen, self.world),
                                      lambda res: check.explain_trouble(res, self.channel.raw, self.world))
        except Exception as exc:  # noqa: BLE001 - a crashing merge is a result too
            result, trouble = self._merge_crashed(check, got, exc), "the merge failed"
        return result, trouble

    def _show_measured(self, check: Check) -> None:
        """Pass on what the check measured so far (bench's rows) to the progress, as it comes."""
        try:
            items = check.measured(self.channel.raw, self.world)
        except Exception:  # noqa: BLE001 - a faulty check plugin or a store hiccup: the result still comes
            return
        for item in items:
            self.progress.measured(check.name, item)

    @staticmethod
    def _named_silent(check: Check, got: dict) -> frozenset:
        try:
            return frozenset(check.named_silent([got[r] for r in sorted(got)]))
        except Exception:  # noqa: BLE001 - a faulty check plugin: wait as usual
            return frozenset()

    def _merged(self, check: Check, got: dict) -> CheckResult:
        try:
            return check.merge([got[r] for r in sorted(got)], self.world)
        except Exception as exc:  # noqa: BLE001 - a crashing merge is a result too
            return self._merge_crashed(check, got, exc)

    @staticmethod
    def _merge_crashed(check: Check, got: dict, exc: Exception) -> CheckResult:
        return CheckResult(check.name, Status.CRASH, f"merging the ranks' results raised "
                           f"{type(exc).__name__}: {exc}", finding="check-crashed",
                           hint="report this to ddpdoctor with the JSON report",
                           outcomes=tuple(got[r] for r in sorted(got)))

    def _silent_outcome(self, r: int, dump: Optional[StackDump], waited: float) -> Outcome:
        """A rank that did not answer: where it hung (its stack, and how it was read, in the details)."""
        stack = dump.text if dump is not None else None
        place = where_hung(stack) if stack is not None else UNREACHABLE
        return Outcome(r, Status.TIMEOUT, "did not finish: "
                       + ("lost contact (no answer on the control channel)" if place == UNREACHABLE
                          else f"in {place}"),
                       hint="find why the other ranks did not reach the same call (a rank that skipped "
                            "a collective, a crash, or a slow network); raise --timeout if it is just slow",
                       finding="rank-hung", details=((dump.how(),) if dump is not None else ())
                       + tuple((stack or "").splitlines()),
                       data={"where": place, **({"stack_read": dump.method} if dump is not None else {})},
                       duration=waited)

    def _halt(self, ranks: Sequence[int]) -> None:
        """Stop the ranks given up on (they would wait for the failed rank until the end): each
        rank's supervisor obeys ``halt/<rank>``; this host's act at once."""
        for r in ranks:
            self.channel.put(f"halt/{r}", {})
            self.channel.enrol("halt", r, counted=True)
        if ranks:
            self.supervisor.poll(now=True)

    def _stacks(self, ranks: Sequence[int]) -> dict[int, StackDump]:
        for r in ranks:
            self.channel.put(f"stackreq/{r}", {"why": "deadline"})
            self.channel.enrol("stackreq", r, counted=True)
        out: dict[int, str] = {}
        deadline = time.monotonic() + STACK_WAIT
        while len(out) < len(ranks) and time.monotonic() < deadline:
            self.supervisor.poll(now=True)
            for r in ranks:
                if r not in out and self.channel.has(f"stack/{r}"):
                    out[r] = StackDump.from_dict(self.channel.get(f"stack/{r}"))
            time.sleep(POLL)
        return out

    def launcher_stopped(self, why: str, wait: float = 1.0) -> Optional[CheckResult]:
        """The launcher is stopping every rank (``why``: SIGTERM) during a check: it usually does that
        because one rank's process ended. The ranks that said their last words (``term/<rank>``) were
        stopped; a rank with no result, no death report and no last words vanished first: the cause.
        None when no rank vanished (an ordinary interruption)."""
        if self.current is None or self.current_index < 0:
            return None
        i, name = self.current_index, self.current
        ranks = sorted(self.hellos)
        deadline = time.monotonic() + wait
        said: dict[int, dict] = {}
        while True:
            for r in ranks:
                if r not in said and r != 0 and self.channel.has(f"term/{r}"):
                    said[r] = self.channel.get(f"term/{r}")
            quiet = [r for r in ranks if r != 0 and r not in said and not self.channel.has(f"result/{i}/{r}")]
            if not quiet or time.monotonic() >= deadline:
                break
            time.sleep(POLL)
        self._read_deaths()
        vanished = [r for r in quiet if self._dead(r) is None]
        if not vanished:
            return None
        stopped = sorted([0, *said])
        places = sorted({w["where"] for w in said.values() if w.get("where")})
        where = f"; they were in {', '.join(places)}" if places else ""
        summary = (f"{rank_label(vanished)} vanished during '{name}' (the process ended without a result or last "
                   f"words); the launcher then stopped {rank_label(stopped)} ({why}{where})")
        outcomes = tuple(Outcome(r, Status.CRASH, "vanished (no result, no last words)", finding="rank-vanished")
                         for r in vanished)
        return CheckResult(name, Status.CRASH, summary, finding="rank-vanished", ranks=tuple(vanished),
                           hint=f"read {rank_label(vanished)}'s own output and the launcher's summary above (exit "
                                "code or signal: SIGKILL is often the OOM killer, check `dmesg | grep -i oom`)",
                           outcomes=outcomes)

    def finish(self, exit_code: int) -> None:
        """Tell every supervisor the run is over and with which exit code."""
        self.channel.put("final", {"exit_code": int(exit_code)})


def _seconds(value: float) -> str:
    return f"{value:.0f}s" if value >= 10 else f"{value:.2g}s"


def interrupted_results(checks: Sequence[Check], done: Sequence[CheckResult], running: Optional[str],
                        why: str) -> list[CheckResult]:
    """The results after an interruption: what finished, then the rest skipped with ``why``."""
    out = list(done)
    for check in checks[len(done):]:
        text = f"interrupted ({why}) while running" if check.name == running else f"not run: interrupted ({why})"
        out.append(CheckResult(check.name, Status.SKIP, text))
    return out
