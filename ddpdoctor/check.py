"""The check interface: what a check declares, what it sees on a rank, and what it returns.

A check is a class with a CLI ``name``, a one-line ``description``, the ``requires`` it needs to
apply, a ``run`` executed on every rank (in a worker process) that returns an :class:`Outcome`, and
an optional ``merge`` executed once at the coordinator to compare ranks. A check that does not apply
is skipped with the reason, never failed. An exception escaping ``run`` becomes a CRASH outcome.
"""

from __future__ import annotations

import datetime
import socket
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Optional, Sequence

from ddpdoctor.result import CheckResult, Outcome, Status, merge_outcomes

__all__ = ["Check", "Findings", "Requirements", "RankContext", "WorldInfo"]


@dataclass(frozen=True)
class WorldInfo:
    """The world as the coordinator sees it, for skip decisions and cross-rank merges.

    Attributes:
        world_size: ranks expected.
        backend: ``gloo`` or ``nccl``.
        mode: ``local`` (ddpdoctor spawned the world) or ``joined`` (a launcher did).
        launcher: the launcher's name in joined mode.
        gpus: the fewest GPUs any node reported through NVML.
        hosts: rank -> hostname for every rank that arrived.
        arrived: ranks that connected to the control channel.
        options: check options from the command line (``--model`` and friends).
        purpose: what this world is for, when a run uses several (``the multi-rank checks on CPU``).
    """

    world_size: int
    backend: str
    mode: str = "local"
    launcher: Optional[str] = None
    gpus: int = 0
    hosts: Mapping[int, str] = field(default_factory=dict)
    arrived: tuple[int, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    purpose: str = ""

    @property
    def nodes(self) -> int:
        return len(set(self.hosts.values())) or 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "backend": self.backend,
            "mode": self.mode,
            "launcher": self.launcher,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus,
            "hosts": {str(r): h for r, h in sorted(self.hosts.items())},
            "arrived": list(self.arrived),
            "purpose": self.purpose or None,
        }


@dataclass(frozen=True)
class Requirements:
    """What a check needs in order to apply; unmet needs make it SKIP with the reason.

    Attributes:
        min_world_size: ranks needed.
        gpus: GPUs per node needed.
        process_group: needs ``torch.distributed`` initialized (by the process-group check or lazily).
        backends: backends it applies to; empty means all.
    """

    min_world_size: int = 1
    gpus: int = 0
    process_group: bool = False
    backends: tuple[str, ...] = ()

    def unmet(self, world: WorldInfo) -> Optional[str]:
        """The reason this check does not apply to ``world``, or None when it does."""
        if world.world_size < self.min_world_size:
            return f"needs {self.min_world_size} ranks, found {world.world_size}"
        if world.gpus < self.gpus:
            return f"needs {self.gpus} GPU{'s' if self.gpus > 1 else ''}, found {world.gpus}"
        if self.backends and world.backend not in self.backends:
            return f"applies to the {'/'.join(self.backends)} backend, this run uses {world.backend}"
        return None


class RankContext:
    """What a check sees on one rank: identity, options, the control channel, the process group.

    Args:
        rank, world_size, local_rank, local_world_size, node_rank: this rank's place.
        backend: the backend under test.
        timeout: the per-check deadline in seconds (also the process group's timeout); the runner
            may scale it for a slow world and tells the rank in ``deadline`` (see ``hosts``,
            ``ranks_per_core`` and ``deadline``, set before each check runs).
        store: the control store (a torch ``Store``), independent of the backend.
        options: check options from the command line.
        launch: the :class:`ddpdoctor.launcher.LaunchInfo` this rank was started with.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        local_rank: int,
        local_world_size: int,
        node_rank: int,
        backend: str,
        timeout: float,
        store: Any,
        options: Optional[Mapping[str, Any]] = None,
        launch: Any = None,
        master_addr: str = "127.0.0.1",
        master_port: int = 0,
        mode: str = "local",
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.node_rank = node_rank
        self.backend = backend
        self.timeout = timeout
        self.store = store
        self.options = dict(options or {})
        self.launch = launch
        self.master_addr = master_addr
        self.master_port = master_port
        self.mode = mode
        self.hostname = socket.gethostname()
        self.pg_init_seconds: Optional[float] = None
        self.pg_error: Optional[BaseException] = None
        # What the runner tells every rank with each check's directive (runner/lockstep.py), so no
        # check needs a collective to learn it: every rank's host in rank order (empty when not
        # told), the most crowded node's ranks per usable CPU core, and this check's deadline.
        self.hosts: tuple[str, ...] = ()
        self.ranks_per_core: Optional[float] = None
        self.deadline: float = timeout

    @property
    def device(self) -> str:
        """``cuda:<local_rank>`` for NCCL, ``cpu`` otherwise."""
        return f"cuda:{self.local_rank}" if self.backend == "nccl" else "cpu"

    def process_group(self) -> Any:
        """Initialize ``torch.distributed`` once (rendezvous over the control store) and return it.

        Raises:
            Exception: whatever ``init_process_group`` raised; it is also remembered in ``pg_error``
                so later checks fail fast instead of waiting out another deadline.
        """
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return dist.group.WORLD
        if self.pg_error is not None:
            raise self.pg_error
        kwargs: dict[str, Any] = {}
        if self.backend == "nccl":
            torch.cuda.set_device(self.local_rank)
            kwargs["device_id"] = torch.device("cuda", self.local_rank)
        start = time.perf_counter()
        try:
            dist.init_process_group(
                self.backend,
                store=dist.PrefixStore("ddpdoctor/pg", self.store),
                rank=self.rank,
                world_size=self.world_size,
                timeout=datetime.timedelta(seconds=self.timeout),
                **kwargs,
            )
        except BaseException as exc:
            self.pg_error = exc
            raise
        self.pg_init_seconds = time.perf_counter() - start
        return dist.group.WORLD

    # Outcome builders, so checks read as sentences.
    def passed(self, summary: str, *, hint: str = "", details: Sequence[str] = (),
               data: Optional[Mapping[str, Any]] = None) -> Outcome:
        """A pass; a ``hint`` here is advice the report shows as a tip (a demonstration's fix)."""
        return Outcome(self.rank, Status.PASS, summary, hint=hint, details=tuple(details), data=dict(data or {}))

    def skipped(self, reason: str, *, data: Optional[Mapping[str, Any]] = None) -> Outcome:
        return Outcome(self.rank, Status.SKIP, reason, data=dict(data or {}))

    def warned(self, summary: str, *, hint: str, finding: str, details: Sequence[str] = (),
               data: Optional[Mapping[str, Any]] = None) -> Outcome:
        return Outcome(self.rank, Status.WARN, summary, hint=hint, finding=finding,
                       details=tuple(details), data=dict(data or {}))

    def failed(self, summary: str, *, hint: str, finding: str, details: Sequence[str] = (),
               data: Optional[Mapping[str, Any]] = None) -> Outcome:
        return Outcome(self.rank, Status.FAIL, summary, hint=hint, finding=finding,
                       details=tuple(details), data=dict(data or {}))


class Check:
    """Base class of every check. Subclasses set ``name``, ``description``, and implement ``run``.

    Class attributes:
        name: the CLI name (kebab-case), unique.
        description: one line for ``ddpdoctor list``.
        requires: what the check needs (:class:`Requirements`).
        slow: slow checks run last and are listed as such.
        runs_in: ``"rank"`` (``run`` executes in every worker) or ``"supervisor"`` (the supervising
            process computes the outcome before the world forms, e.g. whether the port is free).
        on_request: runs only when named (``--only``), never by default (e.g. the bench sweep).
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    requires: ClassVar[Requirements] = Requirements()
    slow: ClassVar[bool] = False
    runs_in: ClassVar[str] = "rank"
    on_request: ClassVar[bool] = False

    @classmethod
    def prepare(cls, options: Mapping[str, Any]) -> None:
        """Called once in the supervising process before the ranks fork: import heavy modules here
        so every rank inherits them instead of paying for them. Must not initialize CUDA."""

    def run(self, ctx: RankContext) -> Outcome:
        """Run on one rank and say what was found. Exceptions become CRASH outcomes."""
        raise NotImplementedError

    def merge(self, outcomes: Sequence[Outcome], world: WorldInfo) -> CheckResult:
        """Combine every rank's outcome; override to compare ranks (the default: worst wins)."""
        return merge_outcomes(self.name, outcomes)

    def named_silent(self, outcomes: Sequence[Outcome]) -> frozenset:
        """Ranks this check's own result names as not answering (``locate``'s silent nodes), from the
        outcomes reported so far: once every other rank reported, the runner waits for these only a
        short grace, then merges as usual (their outcomes: TIMEOUT). The default: none."""
        return frozenset()

    def explain_trouble(self, result: CheckResult, store: Any, world: WorldInfo) -> CheckResult:
        """Refine the result of a run with hung or dead ranks, e.g. with progress the ranks wrote to
        the control ``store``; the default keeps the runner's report."""
        return result

    def measured(self, store: Any, world: WorldInfo) -> list:
        """Supervisor side, polled while the ranks run this check: what they measured since the last
        call, read from the control ``store`` (``bench``'s rows, each as soon as every rank timed it), for
        the progress to show at once. Must not block. The default: nothing."""
        return []


@dataclass
class Findings:
    """Collects several findings on one rank and folds them into one :class:`Outcome`.

    The outcome's status, summary, hint and finding id are the worst finding's; every finding is
    kept in ``details`` (for ``-v``) and in ``data["findings"]`` (for JSON).
    """

    items: list[tuple[Status, str, str, str]] = field(default_factory=list)  # status, id, summary, hint

    def add(self, status: Status, finding: str, summary: str, hint: str = "") -> None:
        self.items.append((status, finding, summary, hint))

    def warn(self, finding: str, summary: str, hint: str) -> None:
        self.add(Status.WARN, finding, summary, hint)

    def fail(self, finding: str, summary: str, hint: str) -> None:
        self.add(Status.FAIL, finding, summary, hint)

    def outcome(self, rank: int, ok_summary: str, *, details: Sequence[str] = (),
                data: Optional[Mapping[str, Any]] = None) -> Outcome:
        payload = dict(data or {})
        payload["findings"] = [
            {"status": s.label, "finding": f, "summary": m, "hint": h} for s, f, m, h in self.items
        ]
        lines = [f"{s.label}: {m}" + (f" -> {h}" if h else "") for s, f, m, h in self.items]
        if not self.items:
            return Outcome(rank, Status.PASS, ok_summary, details=tuple(details), data=payload)
        worst = max(self.items, key=lambda item: item[0])
        summary = worst[2]
        if len(self.items) > 1:
            summary += f" (+{len(self.items) - 1} more)"
        return Outcome(rank, worst[0], summary, hint=worst[3], finding=worst[1],
                       details=tuple(lines) + tuple(details), data=payload)
