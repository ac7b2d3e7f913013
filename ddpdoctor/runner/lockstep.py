"""The coordinator: drives every rank through the checks in lockstep and merges what they report.

It runs in the supervising process of the local world, or in rank 0's supervisor in joined mode.
For each check it publishes a directive (run, skip, supervisor, stop), then waits for every rank's
outcome until the deadline. A rank that died becomes CRASH (with the signal's name and its log); a
rank that is alive but silent becomes TIMEOUT with its Python stack. After a hang or a death the
remaining checks are skipped with the reason (their collectives could not complete), and every
rank's outcome is still reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

from ddpdoctor.check import Check, WorldInfo
from ddpdoctor.report.progress import Progress
from ddpdoctor.result import CheckResult, Outcome, Status, format_ranks, rank_label
from ddpdoctor.runner.channel import Channel
from ddpdoctor.runner.supervisor import Supervisor
from ddpdoctor.system.stackframes import where_hung

__all__ = ["Coordinator", "interrupted_results"]

POLL = 0.005
DEATH_GRACE = 2.0  # seconds the others get to report after a rank died
UNREACHABLE = "no answer"  # a silent rank whose supervisor did not answer the stack request either


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

    def _tick(self) -> None:
        self.supervisor.poll()
        time.sleep(POLL)

    def _dead(self, rank: int) -> Optional[dict]:
        key = f"dead/{rank}"
        return self.channel.get(key) if self.channel.has(key) else None

    def greet(self) -> None:
        """Wait for every rank's hello until the deadline; ranks that never arrive are remembered."""
        expected = range(self.world.world_size)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for r in expected:
                if r not in self.hellos and self.channel.has(f"hello/{r}"):
                    self.hellos[r] = self.channel.get(f"hello/{r}")
            if len(self.hellos) == self.world.world_size:
                break
            if all(r in self.hellos or self._dead(r) for r in expected):
                break
            self._tick()
        hosts = {r: h["host"] for r, h in self.hellos.items()}
        gpus = min((h.get("gpus", 0) for h in self.hellos.values()), default=0)
        self.world = replace(self.world, hosts=hosts, gpus=gpus, arrived=tuple(sorted(self.hellos)))

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
            self.current = check.name
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
                self.channel.put(f"plan/{i}", {"action": "run"})
                result, trouble = self._collect(i, check)
                if trouble:
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

    def _collect(self, i: int, check: Check) -> tuple[CheckResult, Optional[str]]:
        ranks = sorted(self.hellos)
        got: dict[int, Outcome] = {}
        dead: dict[int, dict] = {}
        started = time.monotonic()
        deadline = started + self.timeout
        while time.monotonic() < deadline:
            for r in ranks:
                if r in got or r in dead:
                    continue
                key = f"result/{i}/{r}"
                if self.channel.has(key):
                    got[r] = Outcome.from_dict(self.channel.get(key))
                else:
                    info = self._dead(r)
                    if info is not None:
                        dead[r] = info
                        # The survivors are stuck in a collective with the dead rank: do not
                        # wait out the whole deadline for them.
                        deadline = min(deadline, time.monotonic() + DEATH_GRACE)
            if len(got) + len(dead) == len(ranks):
                break
            if dead and not got and len(dead) == len(ranks):
                break
            self._tick()
        silent = [r for r in ranks if r not in got and r not in dead]
        stacks = self._stacks(silent) if silent else {}
        for r, info in dead.items():
            got[r] = Outcome(r, Status.CRASH, f"died: {info['text']}", hint=info["hint"],
                             finding="rank-died", details=tuple(info.get("log", ())), data={"exit": info})
        for r in silent:
            if r not in stacks:
                self.lost.add(r)
            place = where_hung(stacks[r]) if r in stacks else UNREACHABLE
            got[r] = Outcome(r, Status.TIMEOUT, f"did not finish within {self.timeout:g}s: "
                             + ("lost contact (no answer on the control channel)" if place == UNREACHABLE
                                else f"in {place}"),
                             hint="find why the other ranks did not reach the same call (a rank that skipped "
                                  "a collective, a crash, or a slow network); raise --timeout if it is just slow",
                             finding="rank-hung", details=tuple(stacks.get(r, "").splitlines()),
                             data={"where": place}, duration=time.monotonic() - started)
        try:
            if silent or dead:
                result = _trouble_result(check, [got[r] for r in sorted(got)], silent, dead, self.world)
                result = check.explain_trouble(result, self.channel.raw, self.world)
            else:
                result = check.merge([got[r] for r in sorted(got)], self.world)
        except Exception as exc:  # noqa: BLE001 - a crashing merge is a result too
            result = CheckResult(check.name, Status.CRASH, f"merging the ranks' results raised "
                                 f"{type(exc).__name__}: {exc}", finding="check-crashed",
                                 hint="report this to ddpdoctor with the JSON report",
                                 outcomes=tuple(got[r] for r in sorted(got)))
        trouble = None
        if dead:
            trouble = f"{rank_label(dead)} died"
        elif silent:
            trouble = f"{rank_label(silent)} hung"
        return result, trouble

    def _stacks(self, ranks: Sequence[int]) -> dict[int, str]:
        for r in ranks:
            self.channel.put(f"stackreq/{r}", {"why": "deadline"})
        out: dict[int, str] = {}
        deadline = time.monotonic() + 2.0
        while len(out) < len(ranks) and time.monotonic() < deadline:
            self.supervisor.poll()
            for r in ranks:
                if r not in out and self.channel.has(f"stack/{r}"):
                    out[r] = self.channel.get(f"stack/{r}")["stack"]
            time.sleep(POLL)
        return out

    def finish(self, exit_code: int) -> None:
        """Tell every supervisor the run is over and with which exit code."""
        self.channel.put("final", {"exit_code": int(exit_code)})


def _trouble_result(check: Check, outcomes: Sequence[Outcome], silent: Sequence[int],
                    dead: dict, world: WorldInfo) -> CheckResult:
    """A check with hung or dead ranks: group the hung ranks by where they are, name the dead and
    the unreachable (with their hosts: a lost link or node shows up as one host's ranks)."""
    by_place: dict[str, list[int]] = {}
    for o in outcomes:
        if o.rank in silent:
            by_place.setdefault(o.data.get("where", "?"), []).append(o.rank)
    parts = [f"{rank_label(r)} died ({dead[r[0]]['signal'] or 'exit ' + str(dead[r[0]]['code'])})"
             for r in ([d] for d in sorted(dead))]
    lost = by_place.pop(UNREACHABLE, [])
    parts += [f"{rank_label(ranks)} stuck in {place}" for place, ranks in sorted(by_place.items())]
    if lost:
        hosts = sorted({world.hosts.get(r, "?") for r in lost})
        parts.append(f"{rank_label(lost)} on {', '.join(hosts)} lost contact (no answer on the control channel)")
    finished = [o.rank for o in outcomes if o.rank not in silent and o.rank not in dead]
    if finished:
        parts.append(f"{rank_label(finished)} finished")
    worst = max(o.status for o in outcomes)
    first = next(o for o in outcomes if o.status == worst)
    hint, finding = first.hint, first.finding
    if lost and not dead:
        hint = (f"check the network path to {', '.join(hosts)} (link, switch, firewall) and that node's health; "
                "the other ranks are waiting for it")
        finding = "rank-unreachable"
    return CheckResult(check.name, worst, "; ".join(parts), hint=hint, finding=finding,
                       ranks=tuple(sorted(list(silent) + list(dead))), outcomes=tuple(outcomes),
                       duration=max(o.duration for o in outcomes))


def interrupted_results(checks: Sequence[Check], done: Sequence[CheckResult], running: Optional[str],
                        why: str) -> list[CheckResult]:
    """The results after an interruption: what finished, then the rest skipped with ``why``."""
    out = list(done)
    for check in checks[len(done):]:
        text = f"interrupted ({why}) while running" if check.name == running else f"not run: interrupted ({why})"
        out.append(CheckResult(check.name, Status.SKIP, text))
    return out
