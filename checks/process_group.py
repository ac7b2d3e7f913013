"""Check ``process-group``: init_process_group works, and every rank is who it should be.

Every rank initializes the backend under test (rendezvous over the control store), runs one
all_reduce, and reports its identity: host, pid, rank, local rank, device and GPU UUID, plus any
memory it holds on a GPU that is not its own (the ``torch.load`` without ``map_location`` symptom).
The coordinator then compares ranks: unique and complete, one world size, one GPU per rank.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Optional, Sequence

from ddpdoctor.check import Check, CheckResult, RankContext, Requirements, WorldInfo
from ddpdoctor.result import Outcome, Status, count, format_seconds, merge_outcomes, rank_label
from ddpdoctor.system import nvml

__all__ = ["ProcessGroupCheck", "gpu_sharers", "identity_table"]


def _init_hint(text: str) -> tuple[str, str]:
    """(finding, hint) for an init_process_group failure, from its message."""
    low = text.lower()
    if "unable to find address for" in low or "no such device" in low:
        return ("bad-socket-ifname",
                "GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME names an interface this host lacks: set it to one the "
                "env check lists")
    if "timed out" in low or "timeout" in low:
        return ("pg-init-timeout",
                "a rank did not join in time: check that every rank started, that WORLD_SIZE matches the "
                "ranks launched, and that GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME name an interface all nodes share")
    if "refused" in low or "connect" in low:
        return ("pg-connect-failed",
                "ranks cannot reach each other: set GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME to the interface "
                "of the network the nodes share, and check that the hostname does not resolve to 127.0.0.1")
    if "duplicate gpu" in low:
        return ("duplicate-gpu", _DUPLICATE_GPU_HINT)
    if "nccl" in low:
        return ("nccl-init-failed", "rerun with NCCL_DEBUG=INFO and check /dev/shm size and the NCCL version")
    return ("pg-init-failed", "rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL and check the backend's log")


_DUPLICATE_GPU_HINT = ("give each rank its own GPU: torch.cuda.set_device(LOCAL_RANK) before init_process_group, "
                       "and no more ranks per node than GPUs")
_GPU_OWNER_KEY = "ddpdoctor/gpu-owner/{}"
_GPU_OWNER_WAIT = 3.0  # seconds to wait for the other ranks' GPU identities after a failed NCCL init


def _publish_gpu(ctx: RankContext) -> Optional[str]:
    """Put this rank's host and GPU UUID in the control store before NCCL's init; return the UUID.

    NCCL names two ranks on one GPU itself only in some releases ("Duplicate GPU detected"); 2.28
    says "invalid usage". Published before the init, the identities let a failed init be told apart.
    """
    import torch

    try:
        uuid = "GPU-" + str(torch.cuda.get_device_properties(ctx.local_rank).uuid)
    except Exception:  # an invalid ordinal: init_process_group reports it in its own words
        return None
    ctx.store.set(_GPU_OWNER_KEY.format(ctx.rank), json.dumps({"host": ctx.hostname, "uuid": uuid}))
    return uuid


def gpu_sharers(store: Any, rank: int, world_size: int, host: str, uuid: str,
                wait: float = _GPU_OWNER_WAIT) -> list[int]:
    """The ranks (this one included) that published the same GPU on the same host; [] if none.

    Waits at most ``wait`` seconds for the others' identities (a rank that died before publishing
    is simply not counted), never a collective: the process group is what failed.
    """
    keys = [_GPU_OWNER_KEY.format(r) for r in range(world_size)]
    deadline = time.monotonic() + wait
    while not store.check(keys) and time.monotonic() < deadline:
        time.sleep(0.05)
    shared = []
    for r, key in enumerate(keys):
        if r == rank or store.check([key]):
            ident = json.loads(store.get(key)) if r != rank else {"host": host, "uuid": uuid}
            if ident.get("host") == host and ident.get("uuid") == uuid:
                shared.append(r)
    return shared if len(shared) > 1 else []


def _first_line(exc: BaseException) -> str:
    """The first line of an exception, without C++ ``[enforce fail at file:line]`` noise."""
    text = re.sub(r"\[enforce fail at [^\]]*\]\s*", "", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _own_gpu(ctx: RankContext, gpus: Sequence[nvml.GpuInfo]) -> tuple[Optional[int], Optional[str]]:
    """(NVML index, UUID) of this rank's GPU, or (None, None) on CPU."""
    if ctx.backend != "nccl":
        return None, None
    import torch

    uuid = "GPU-" + str(torch.cuda.get_device_properties(ctx.local_rank).uuid)
    for g in gpus:
        if g.uuid and g.uuid.lower() == uuid.lower():
            return g.index, g.uuid
    return None, uuid


class ProcessGroupCheck(Check):
    """init_process_group succeeds in time; ranks unique and complete; one GPU per rank."""

    name = "process-group"
    description = "init_process_group within the deadline; ranks unique and complete; one GPU per rank"
    requires = Requirements(process_group=True)

    def run(self, ctx: RankContext) -> Outcome:
        import torch
        import torch.distributed as dist

        uuid = _publish_gpu(ctx) if ctx.backend == "nccl" else None
        start = time.perf_counter()
        try:
            ctx.process_group()
        except Exception as exc:  # the check's subject: report it, do not crash
            text = _first_line(exc)
            finding, hint = _init_hint(str(exc))
            shared = gpu_sharers(ctx.store, ctx.rank, ctx.world_size, ctx.hostname, uuid) if uuid else []
            if shared:
                return ctx.failed(f"{rank_label(shared)} share one GPU ({uuid}) on {ctx.hostname}: "
                                  f"init_process_group({ctx.backend}) failed: {text}",
                                  hint=_DUPLICATE_GPU_HINT, finding="duplicate-gpu",
                                  details=str(exc).splitlines()[:20])
            return ctx.failed(f"init_process_group({ctx.backend}) failed after "
                              f"{time.perf_counter() - start:.1f}s: {text}",
                              hint=hint, finding=finding, details=str(exc).splitlines()[:20])
        t0 = time.perf_counter()
        probe = torch.ones(1, device=ctx.device)
        dist.all_reduce(probe)
        first_collective = time.perf_counter() - t0
        view = nvml.load()
        gpus = view.gpus(with_processes=True) if view.available else []
        gpu_index, gpu_uuid = _own_gpu(ctx, gpus)
        pid = os.getpid()
        foreign = [
            {"gpu": g.index, "mb": mb}
            for g in gpus
            for p, mb in g.processes
            if p == pid and g.uuid != gpu_uuid
        ]
        data: dict[str, Any] = {
            "host": ctx.hostname,
            "pid": pid,
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "local_rank": ctx.local_rank,
            "device": ctx.device,
            "gpu_index": gpu_index,
            "gpu_uuid": gpu_uuid,
            "init_seconds": round(ctx.pg_init_seconds or 0.0, 4),
            "first_all_reduce_seconds": round(first_collective, 4),
            "all_reduce_result": float(probe.item()),
            "foreign_gpu_memory": foreign,
        }
        if ctx.backend != "nccl":  # NCCL's first collective also sets up its communicator: not a measure
            data["collective_seconds"] = round(first_collective, 4)  # the runner scales later deadlines by it
        return ctx.passed(f"joined in {format_seconds(data['init_seconds'])}", data=data)

    def merge(self, outcomes: Sequence[Outcome], world: WorldInfo) -> CheckResult:
        merged = merge_outcomes(self.name, outcomes)
        if merged.status >= Status.FAIL or not outcomes:
            return merged
        ids = [o.data for o in outcomes if o.data.get("pid")]
        table = tuple(identity_table(ids))
        problem = _compare(ids, world)
        if problem is not None:
            status, summary, hint, finding, ranks = problem
            return CheckResult(self.name, status, summary, hint=hint, finding=finding, ranks=ranks,
                               outcomes=merged.outcomes, details=table, duration=merged.duration)
        init = max(d["init_seconds"] for d in ids)
        nodes = len({d["host"] for d in ids})
        summary = (f"{count(len(ids), 'rank')} on {count(nodes, 'node')} joined in {format_seconds(init)} "
                   f"({world.backend}); all_reduce ok")
        return CheckResult(self.name, merged.status, summary, outcomes=merged.outcomes, details=table,
                           duration=merged.duration, hint=merged.hint, finding=merged.finding, ranks=merged.ranks)


def _compare(ids: Sequence[dict], world: WorldInfo) -> Optional[tuple[Status, str, str, str, tuple[int, ...]]]:
    """The first cross-rank problem: (status, summary, hint, finding, ranks), or None."""
    sizes = {d["world_size"] for d in ids}
    if sizes != {world.world_size}:
        return (Status.FAIL, f"ranks disagree on world size: {sorted(sizes)} (expected {world.world_size})",
                "launch every node with the same WORLD_SIZE/--nnodes/--nproc-per-node", "world-size-mismatch",
                tuple(d["rank"] for d in ids))
    ranks = sorted(d["rank"] for d in ids)
    dupes = sorted({r for r in ranks if ranks.count(r) > 1})
    missing = sorted(set(range(world.world_size)) - set(ranks))
    if dupes or missing:
        what = []
        if dupes:
            what.append(f"{rank_label(dupes)} appear{'s' if len(dupes) == 1 else ''} twice")
        if missing:
            what.append(f"{rank_label(missing)} is missing")
        return (Status.FAIL, "; ".join(what), "give every process a unique RANK in 0..WORLD_SIZE-1 "
                "(check --node-rank/NODE_RANK on each node)", "rank-mismatch", tuple(dupes or missing))
    wrong = [d["rank"] for d in ids if d["all_reduce_result"] != float(world.world_size)]
    if wrong:
        return (Status.FAIL, f"all_reduce of ones returned the wrong sum on {rank_label(wrong)}",
                "run `ddpdoctor check --only collectives -v` to find the bad rank or link", "wrong-all-reduce",
                tuple(wrong))
    by_gpu: dict[tuple[str, str], list[int]] = {}
    for d in ids:
        if d["gpu_uuid"]:
            by_gpu.setdefault((d["host"], d["gpu_uuid"]), []).append(d["rank"])
    for (host, uuid), shared in sorted(by_gpu.items()):
        if len(shared) > 1:
            return (Status.FAIL, f"{rank_label(shared)} share one GPU ({uuid}) on {host}",
                    _DUPLICATE_GPU_HINT, "duplicate-gpu", tuple(shared))
    foreign = [(d["rank"], f) for d in ids for f in d.get("foreign_gpu_memory", ())]
    if foreign:
        rank, f = foreign[0]
        own = next((d["gpu_index"] for d in ids if d["rank"] == rank), None)
        more = f" (+{len(foreign) - 1} more)" if len(foreign) > 1 else ""
        return (Status.WARN,
                f"rank {rank} holds {f['mb']} MiB on GPU {f['gpu']}, which is not its own "
                f"(GPU {own if own is not None else 'n/a'}){more}",
                "load checkpoints with map_location='cpu' (or ddpdoctor.load_checkpoint) and call "
                "torch.cuda.set_device(local_rank) before any CUDA work", "foreign-gpu-memory",
                tuple(r for r, _ in foreign))
    return None


def identity_table(ids: Sequence[dict]) -> list[str]:
    """Per-rank identity as aligned text rows (host, pid, rank, local rank, device, GPU)."""
    rows = [("rank", "host", "pid", "local", "device", "gpu", "init")]
    for d in sorted(ids, key=lambda d: d["rank"]):
        gpu = "-" if d["gpu_uuid"] is None else f"{d['gpu_index'] if d['gpu_index'] is not None else '?'} {d['gpu_uuid']}"
        rows.append((str(d["rank"]), d["host"], str(d["pid"]), str(d["local_rank"]), d["device"], gpu,
                     format_seconds(d["init_seconds"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
