"""Joined mode: run the checks inside a world that torchrun, srun or mpirun started.

Every launched process forks one worker for its own rank and supervises it. The control store is
torchrun's agent store when there is one (TORCHELASTIC_USE_AGENT_STORE), otherwise rank 0's process
serves it on MASTER_ADDR:MASTER_PORT (bound there only). Rank 0 coordinates and prints the report;
every process exits with the code rank 0 decided. A rank that cannot reach the control store says so
in one line on its own stderr and exits 1 (rank 0 reports it as never arrived).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Optional, Sequence

from ddpdoctor.check import Check, WorldInfo
from ddpdoctor.training.launcher import LaunchInfo
from ddpdoctor.errors import UsageError
from ddpdoctor.report.document import RunReport
from ddpdoctor.report.progress import Progress
from ddpdoctor.result import CheckResult, Outcome, Status, rank_label
from ddpdoctor.runner.channel import Channel, ChannelLost, connect_store, host_store
from ddpdoctor.runner.lockstep import MAX_SCALE, Coordinator, interrupted_results
from ddpdoctor.runner.options import Interrupted, RunOptions, RunOutcome, terminate_as_interrupt
from ddpdoctor.runner.supervisor import Supervisor
from ddpdoctor.runner.worker import WorkerSpec
from ddpdoctor.system.nvml import visible_gpus
from ddpdoctor.system.ports import bind_master, probe_connect
from ddpdoctor.system.stackframes import where_hung

__all__ = ["run_joined", "run_id"]

BYE_WAIT = 5.0


def run_id(environ: Optional[dict] = None) -> str:
    """A key every rank of this job computes alike, so reruns under one store never collide."""
    env = os.environ if environ is None else environ
    for parts in (("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"), ("SLURM_JOB_ID", "SLURM_STEP_ID"),
                  ("PMIX_NAMESPACE",), ("OMPI_MCA_ess_base_jobid",), ("PMI_KVSNAME",)):
        if all(env.get(p) for p in parts[:1]):
            return "-".join(env.get(p, "0") for p in parts)
    return "job"


def _backend(opts: RunOptions) -> str:
    import torch.distributed as dist

    if opts.backend:
        if opts.backend == "nccl" and not dist.is_nccl_available():
            import torch

            raise UsageError("no-nccl", f"--backend nccl: this torch build ({torch.__version__}) has no NCCL",
                             "install a CUDA build of torch, or use --backend gloo")
        return opts.backend
    return "nccl" if visible_gpus() > 0 and dist.is_nccl_available() else "gloo"


def run_joined(opts: RunOptions, info: LaunchInfo, checks: Sequence[Check], progress: Progress) -> RunOutcome:
    """Join the launcher's world as ``info.rank``; see the module docstring."""
    if not info.master_addr or not info.master_port:
        raise UsageError("no-master", f"{info.launcher} job without MASTER_ADDR/MASTER_PORT",
                         "export MASTER_ADDR=<rank 0's host> MASTER_PORT=<a free port> on every rank")
    backend = _backend(opts)
    start = time.monotonic()
    rank, addr, port = info.rank, info.master_addr, info.master_port
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    hosting = rank == 0 and not agent_store
    sock = None
    if hosting:
        probe = bind_master(addr, port, rank=0)
        port_outcome = probe.outcome
        sock = probe.sock
    else:
        port_outcome = probe_connect(addr, port, opts.timeout, rank)
        if agent_store and port_outcome.status == Status.PASS:
            port_outcome = Outcome(rank, Status.PASS, f"{addr}:{port} (torchrun's store) accepted a connection",
                                   data={**port_outcome.data, "agent_store": True}, duration=port_outcome.duration)
    world = WorldInfo(world_size=info.world_size, backend=backend, mode="joined", launcher=info.launcher,
                      options=dict(opts.options))
    if port_outcome.status != Status.PASS:
        return _cannot_join(opts, world, checks, port_outcome, start)

    workdir = tempfile.mkdtemp(prefix=f"ddpdoctor-r{rank}-")
    prefix = f"ddpdoctor/{run_id()}"
    spec = WorkerSpec(
        rank=rank, world_size=info.world_size, local_rank=info.local_rank, local_world_size=info.local_world_size,
        node_rank=info.node_rank, backend=backend, timeout=opts.timeout, store_addr=addr, store_port=port,
        prefix=prefix, checks=checks, stack_path=os.path.join(workdir, "stack"),
        log_path=os.path.join(workdir, "rank.log"), master_addr=addr, master_port=port, mode="joined",
        options=dict(opts.options), close_fds=(sock.fileno(),) if sock else (),
    )
    supervisor = Supervisor()
    store = None
    channel: Optional[Channel] = None
    coordinator: Optional[Coordinator] = None
    report: Optional[RunReport] = None
    code = 1
    message = ""
    try:
        with terminate_as_interrupt():
            supervisor.start([spec])
            if sock is not None:
                store = host_store(sock.detach(), addr, port, opts.timeout)
            else:
                store = connect_store(addr, port, opts.timeout)
            # A client must not block forever on a dead link; the host's own store cannot.
            channel = Channel(store, prefix, op_timeout=None if sock is not None else max(5.0, opts.timeout))
            supervisor.attach(channel)
            channel.put(f"port/{rank}", port_outcome.to_dict())
            if rank == 0:
                coordinator = Coordinator(channel, checks, world, supervisor, opts.timeout,
                                          port_outcomes={0: port_outcome}, progress=progress)
                results = coordinator.run()
                report = RunReport(coordinator.world, tuple(results), duration=time.monotonic() - start)
                code = int(report.exit_code(opts.strict))
                coordinator.finish(code)
                _wait_byes(channel, supervisor, [r for r in coordinator.world.arrived if r not in coordinator.lost])
            else:
                code, message = _follow(channel, supervisor, rank, opts.timeout * MAX_SCALE * (len(checks) + 3))
    except ChannelLost as exc:
        message = f"ddpdoctor rank {rank}: {exc}; rank 0's report says why"
        code = 1
    except (KeyboardInterrupt, Interrupted) as exc:
        why = exc.signame if isinstance(exc, Interrupted) else "SIGINT"
        if rank == 0:
            _last_words(channel, None, rank, why)
            report = _interrupted_report(coordinator, world, checks, why, start)
            code = int(report.exit_code())
        else:
            _last_words(channel, supervisor, rank, why)
            code, message = 130, _without_rank_0(channel, rank, info.world_size, why)
    finally:
        supervisor.stop()
        if channel is not None:
            channel.close()
        if sock is not None and sock.fileno() != -1:
            sock.close()
        del store
        shutil.rmtree(workdir, ignore_errors=True)
    return RunOutcome(report, code, message)


def _interrupted_report(coordinator: Optional[Coordinator], world: WorldInfo, checks: Sequence[Check], why: str,
                        start: float) -> RunReport:
    """Rank 0 was interrupted: if a rank vanished first (the launcher stops the rest when one rank's
    process ends), that rank leads the report; otherwise what finished, then the rest skipped."""
    if coordinator is None:
        return RunReport(world, tuple(interrupted_results(checks, [], None, why)),
                         duration=time.monotonic() - start, interrupted=why)
    done = list(coordinator.results)
    try:
        vanished = coordinator.launcher_stopped(why)
    except (ChannelLost, Interrupted):
        vanished = None
    if vanished is None:
        return RunReport(coordinator.world, tuple(interrupted_results(checks, done, coordinator.current, why)),
                         duration=time.monotonic() - start, interrupted=why)
    reason = f"not run: {rank_label(vanished.ranks)} vanished during '{vanished.name}'"
    results = done + [vanished] + [CheckResult(c.name, Status.SKIP, reason) for c in checks[len(done) + 1:]]
    return RunReport(coordinator.world, tuple(results), duration=time.monotonic() - start)


def _last_words(channel: Optional[Channel], supervisor: Optional[Supervisor], rank: int, why: str) -> None:
    """A rank stopped by the launcher says so (and where its worker was) before it goes, so rank 0 can
    tell the ranks that were stopped from the one that vanished first."""
    if channel is None:
        return
    try:
        with terminate_as_interrupt():
            stack = supervisor.dump_stacks([rank], wait=0.5)[rank].text if supervisor else ""
            channel.put(f"term/{rank}", {"why": why, "where": where_hung(stack) if stack else ""})
    except (ChannelLost, Interrupted, OSError):
        pass


def _without_rank_0(channel: Optional[Channel], rank: int, world_size: int, why: str, wait: float = 1.0) -> str:
    """This rank was stopped by the launcher. If rank 0 (the reporter) said nothing, it is the one that
    vanished: the lowest rank that said its last words reports that in one line; the others stay brief."""
    plain = f"ddpdoctor rank {rank}: interrupted by {why}"
    if channel is None:
        return plain
    try:
        with terminate_as_interrupt():
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if channel.has("term/0") or channel.has("final"):
                    return plain
                time.sleep(0.02)
            said = [r for r in range(1, world_size) if r == rank or channel.has(f"term/{r}")]
    except (ChannelLost, Interrupted):
        return plain
    if min(said) != rank:
        return plain
    return (f"ddpdoctor rank {rank}: rank 0 vanished (no verdict, no last words: its process ended first); "
            f"the launcher then stopped {rank_label(said)} ({why}); read rank 0's own output above")


def _follow(channel: Channel, supervisor: Supervisor, rank: int, budget: float) -> tuple[int, str]:
    """A non-reporting rank: supervise until rank 0 publishes the verdict, then say goodbye."""
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        supervisor.poll()
        if channel.has("final"):
            code = int(channel.get("final")["exit_code"])
            supervisor.wait_all(2.0)
            channel.put(f"bye/{rank}", {})
            channel.enrol("bye", rank, counted=True)
            return code, ""
        time.sleep(0.01)
    return 1, f"ddpdoctor rank {rank}: no verdict from rank 0 within {budget:g}s; see rank 0's output"


def _wait_byes(channel: Channel, supervisor: Supervisor, ranks: Sequence[int]) -> None:
    """Keep serving the store until every other rank has read the verdict (bounded)."""
    deadline = time.monotonic() + BYE_WAIT
    pending = {r for r in ranks if r != 0}
    seen = 0
    while pending and time.monotonic() < deadline:
        supervisor.poll()
        if channel.count("bye") > seen:  # one counter per tick, the roll only when it moved
            seen = channel.count("bye")
            pending -= set(channel.roll("bye"))
        time.sleep(0.01)


def _cannot_join(opts: RunOptions, world: WorldInfo, checks: Sequence[Check], port: Outcome,
                 start: float) -> RunOutcome:
    """The rendezvous port failed here: rank 0 reports it; other ranks say it in one line."""
    if port.rank != 0:
        return RunOutcome(None, 1, f"ddpdoctor rank {port.rank}: port: {port.summary}; fix: {port.hint}")
    results = []
    for check in checks:
        if check.runs_in == "supervisor":
            results.append(CheckResult(check.name, port.status, port.summary, hint=port.hint, finding=port.finding,
                                       ranks=(0,), outcomes=(port,), duration=port.duration))
        else:
            results.append(CheckResult(check.name, Status.SKIP, "not run: rank 0 cannot serve the rendezvous port"))
    report = RunReport(world, tuple(results), duration=time.monotonic() - start)
    return RunOutcome(report, int(report.exit_code(opts.strict)))
