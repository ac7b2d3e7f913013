"""Running the checks: a local world that ddpdoctor spawns, or the world a launcher started.

Local mode: this process binds the rendezvous port (the ``port`` check), forks one worker per rank,
serves the control store on that port, and coordinates. Joined mode (torchrun, srun, mpirun): every
launched process forks one worker for its own rank and supervises it; rank 0's process coordinates
and prints the report; every process exits with the same code.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from ddpdoctor.check import Check, WorldInfo
from ddpdoctor.training import launcher
from ddpdoctor.errors import UsageError
from ddpdoctor.report.document import RunReport
from ddpdoctor.report.progress import Progress
from ddpdoctor.runner.channel import COUNTS, Channel, dump_counts, host_store
from ddpdoctor.runner.lockstep import Coordinator, interrupted_results
from ddpdoctor.runner.options import Interrupted, RunOptions, RunOutcome, terminate_as_interrupt
from ddpdoctor.runner.registry import select_checks
from ddpdoctor.runner.supervisor import Supervisor
from ddpdoctor.runner.worker import WorkerSpec
from ddpdoctor.system.nvml import visible_gpus

__all__ = ["run_checks", "resolve_world", "plan_worlds", "LocalWorld"]

BACKENDS = ("gloo", "nccl")


def resolve_world(opts: RunOptions, gpus: Optional[int] = None, nccl_built: Optional[bool] = None) -> tuple[int, str]:
    """(ranks, backend) for a local world; one rank per GPU with NCCL, else 2 ranks with gloo.

    Raises:
        UsageError: ``--nproc`` below 1, an unknown backend, or NCCL without GPUs or without NCCL.
    """
    import torch.distributed as dist

    gpus = visible_gpus() if gpus is None else gpus
    nccl_built = dist.is_nccl_available() if nccl_built is None else nccl_built
    if opts.nproc is not None and opts.nproc < 1:
        raise UsageError("bad-nproc", f"--nproc {opts.nproc} is not a number of ranks", "use --nproc 1 or more")
    backend = opts.backend or ("nccl" if gpus > 0 and nccl_built else "gloo")
    if backend not in BACKENDS:
        raise UsageError("bad-backend", f"--backend {backend!r} is not supported", "use --backend gloo or nccl")
    if backend == "nccl":
        if not nccl_built:
            import torch

            raise UsageError("no-nccl", f"--backend nccl: this torch build ({torch.__version__}) has no NCCL",
                             "install a CUDA build of torch, or use --backend gloo")
        if gpus == 0:
            raise UsageError("nccl-without-gpu", "--backend nccl needs GPUs, NVML found 0",
                             "use --backend gloo on CPU, or run where GPUs are visible")
    nproc = opts.nproc or (gpus if backend == "nccl" else 2)
    if backend == "nccl" and nproc > gpus:
        raise UsageError("too-few-gpus", f"--nproc {nproc} with --backend nccl needs {nproc} GPUs, found {gpus}",
                         f"use --nproc {gpus} or fewer (one rank per GPU)")
    return nproc, backend


@dataclass(frozen=True)
class LocalWorld:
    """One world a local run forks: its size, backend and the checks that run in it."""

    nproc: int
    backend: str
    checks: tuple[Check, ...]
    purpose: str = ""
    device: str = "cpu"  # where its ranks compute: cuda (NCCL) or cpu


def plan_worlds(opts: RunOptions, checks: Sequence[Check], gpus: Optional[int] = None,
                nccl_built: Optional[bool] = None) -> list[LocalWorld]:
    """The worlds a local run forks, in order: usually one (``resolve_world``'s).

    On a machine whose default NCCL world is smaller than some check needs (one GPU), and neither
    ``--nproc`` nor ``--backend`` was given, the run forks two worlds so that every check runs: the
    GPU world runs the checks it can (env, port, process-group on NCCL), then a 2-rank gloo world on
    CPU runs the multi-rank ones. The report says which ran where and that NCCL across ranks needs
    another GPU.

    Raises:
        UsageError: as ``resolve_world``.
    """
    gpus = visible_gpus() if gpus is None else gpus
    nproc, backend = resolve_world(opts, gpus, nccl_built)
    whole = [LocalWorld(nproc, backend, tuple(checks), device="cuda" if backend == "nccl" else "cpu")]
    if backend != "nccl" or opts.nproc is not None or opts.backend is not None:
        return whole
    multi = tuple(c for c in checks if c.requires.min_world_size > nproc)
    here = tuple(c for c in checks if c.requires.min_world_size <= nproc)
    if not multi:
        return whole
    ranks = max(2, max(c.requires.min_world_size for c in multi))
    more = f"{ranks - gpus} more GPU" + ("s" if ranks - gpus > 1 else "")
    cpu = LocalWorld(ranks, "gloo", multi,
                     f"{', '.join(c.name for c in multi)} on CPU ({gpus} GPU visible; NCCL across ranks "
                     f"needs {more})")
    if not here:
        return [cpu]
    gpu = LocalWorld(nproc, backend, here, f"{', '.join(c.name for c in here)} on the GPU", device="cuda")
    return [gpu, cpu]


def run_checks(opts: RunOptions, progress: Optional[Progress] = None) -> RunOutcome:
    """Run the selected checks in local or joined mode (``opts.mode``: auto picks by the environment).

    Raises:
        UsageError: bad options or launcher variables (exit 2), before anything starts.
    """
    checks = select_checks(opts.only, opts.skip, opts.broken_plugins)
    if opts.timeout <= 0:
        raise UsageError("bad-timeout", f"--timeout {opts.timeout:g} must be positive", "use --timeout 30")
    info = launcher.detect(strict=True)
    joined = opts.mode == "join" or (opts.mode == "auto" and info.is_launched)
    if opts.mode == "join" and info.launcher is None:
        raise UsageError("no-launcher", "--join: no launcher variables found (RANK/WORLD_SIZE, SLURM_PROCID, "
                         "OMPI_COMM_WORLD_RANK)", "start ddpdoctor under torchrun, srun or mpirun")
    importlib.import_module("torch.distributed")  # before forking, so that the workers start instantly

    _validate_options(opts.options)
    for check in checks:
        type(check).prepare(opts.options)
    progress = progress or Progress()
    if joined:
        from ddpdoctor.runner.joined import run_joined

        return run_joined(opts, info, checks, progress)
    return _run_local(opts, checks, progress)


def _validate_options(options: dict) -> None:
    """Check options that name user code, before any rank starts (one line and exit 2 if wrong)."""
    from ddpdoctor.diagnostics.model_factory import load_factory, parse_input_shape

    if options.get("input_shape") is not None:
        options["input_shape"] = parse_input_shape(options["input_shape"])
    if options.get("model"):
        load_factory(options["model"])  # imports the module, finds the callable; builds nothing


def _run_local(opts: RunOptions, checks: Sequence[Check], progress: Progress) -> RunOutcome:
    worlds = plan_worlds(opts, checks)
    if len(worlds) == 1:
        report = _run_world(opts, worlds[0], progress)
        return RunOutcome(report, int(report.exit_code(opts.strict)))
    start = time.monotonic()
    reports: list[RunReport] = []
    for i, w in enumerate(worlds):
        reports.append(_run_world(opts, w, progress))
        if reports[-1].interrupted:
            why = reports[-1].interrupted
            extra = tuple(replace(r, world=_world_tag(rest)) for rest in worlds[i + 1:]
                          for r in interrupted_results(rest.checks, [], None, why))
            reports.append(RunReport(reports[-1].world, extra, interrupted=why))
            break
    order = {c.name: i for i, c in enumerate(checks)}
    results = sorted((r for rep in reports for r in rep.results), key=lambda r: order.get(r.name, len(order)))
    report = RunReport(reports[0].world, tuple(results), duration=time.monotonic() - start,
                       interrupted=next((rep.interrupted for rep in reports if rep.interrupted), None),
                       worlds=tuple(rep.world for rep in reports if rep.results))
    return RunOutcome(report, int(report.exit_code(opts.strict)))


def _world_tag(w: LocalWorld) -> dict:
    return {"world_size": w.nproc, "backend": w.backend, "device": w.device, "purpose": w.purpose}


def _run_world(opts: RunOptions, plan: LocalWorld, progress: Progress) -> RunReport:
    from ddpdoctor.system.ports import bind_master

    nproc, backend, checks = plan.nproc, plan.backend, plan.checks
    start = time.monotonic()
    COUNTS.clear()
    probe = bind_master(opts.master_addr, opts.master_port, rank=0)
    blocked = None
    sock = probe.sock
    if sock is None:
        blocked = "the rendezvous port is not usable (see 'port')"
        sock = bind_master("127.0.0.1", 0).sock
        if sock is None:
            raise UsageError("no-loopback", "cannot bind any port on 127.0.0.1", "check the loopback interface")
    store_addr, store_port = sock.getsockname()[:2]
    world = WorldInfo(world_size=nproc, backend=backend, mode="local", options=dict(opts.options),
                      purpose=plan.purpose)
    workdir = tempfile.mkdtemp(prefix="ddpdoctor-")
    prefix = f"ddpdoctor/{uuid.uuid4().hex[:12]}"
    pinned = _loopback_pins(store_addr)
    specs = [
        WorkerSpec(
            rank=r, world_size=nproc, local_rank=r, local_world_size=nproc, node_rank=0, backend=backend,
            timeout=opts.timeout, store_addr=store_addr, store_port=store_port, prefix=prefix, checks=checks,
            stack_path=os.path.join(workdir, f"stack{r}"), log_path=os.path.join(workdir, f"rank{r}.log"),
            master_addr=store_addr, master_port=store_port, mode="local", options=dict(opts.options),
            env={"RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(nproc),
                 "GROUP_RANK": "0", "MASTER_ADDR": store_addr, "MASTER_PORT": str(store_port), **pinned},
            close_fds=(sock.fileno(),),
        )
        for r in range(nproc)
    ]
    supervisor = Supervisor()
    store = None
    coordinator: Optional[Coordinator] = None
    try:
        with terminate_as_interrupt(cleanup=lambda: shutil.rmtree(workdir, ignore_errors=True)):
            supervisor.start(specs)
            store = host_store(sock.detach(), store_addr, store_port, opts.timeout)
            channel = Channel(store, prefix)
            supervisor.attach(channel)
            coordinator = Coordinator(channel, checks, world, supervisor, opts.timeout,
                                      port_outcomes={0: probe.outcome}, blocked=blocked, progress=progress)
            results = coordinator.run()
            report = RunReport(coordinator.world, tuple(results), duration=time.monotonic() - start)
            coordinator.finish(report.exit_code(opts.strict))
            supervisor.wait_all(2.0)
    except (KeyboardInterrupt, Interrupted) as exc:
        why = exc.signame if isinstance(exc, Interrupted) else "SIGINT"
        done = coordinator.results if coordinator else []
        running = coordinator.current if coordinator else None
        report = RunReport(coordinator.world if coordinator else world,
                           tuple(interrupted_results(checks, done, running, why)),
                           duration=time.monotonic() - start, interrupted=why)
    finally:
        supervisor.stop()
        if sock.fileno() != -1:
            sock.close()
        del store
        shutil.rmtree(workdir, ignore_errors=True)
        dump_counts("supervisor")
    tag = _world_tag(plan)
    return replace(report, results=tuple(replace(r, world=tag) for r in report.results))


def _loopback_pins(addr: str) -> dict[str, str]:
    """A local world on a loopback address keeps gloo's sockets on loopback too (unless the user
    named an interface): otherwise gloo binds whatever the hostname resolves to."""
    import ipaddress

    import psutil

    try:
        if not ipaddress.ip_address(addr).is_loopback or "GLOO_SOCKET_IFNAME" in os.environ:
            return {}
    except ValueError:
        return {}
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == addr for a in addrs):
            return {"GLOO_SOCKET_IFNAME": name}
    return {}


