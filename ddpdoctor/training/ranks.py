"""Which rank am I: the same answer before, during and without ``init_process_group``.

Launcher variables are read by :func:`ddpdoctor.launcher.detect` (the one module that knows
torchrun, Slurm, Open MPI, PMI and the legacy ``--local_rank`` argument); once a process group
exists, its rank and world size win. Nothing here initializes a process group or CUDA.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import torch
import torch.distributed as dist

from ddpdoctor.training.launcher import detect
from ddpdoctor.errors import DdpdoctorError

__all__ = [
    "RankInfo",
    "RankConflictWarning",
    "NotInitializedError",
    "get_rank",
    "get_world_size",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "is_distributed",
    "is_main_process",
    "rank_info",
    "rank_device",
    "require_process_group",
]

logger = logging.getLogger(__name__)


class RankConflictWarning(UserWarning):
    """Two sources of rank information disagree (RANK != SLURM_PROCID, LOCAL_RANK missing, ...)."""


class NotInitializedError(DdpdoctorError):
    """A launcher started several processes but no process group exists yet."""


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the job, and which variable each value came from.

    Attributes:
        rank, world_size, local_rank, local_world_size, node_rank: the values :func:`get_rank`
            and friends return.
        launcher: ``torchrun``, ``slurm``, ``mpi``, ``pmi``, ``legacy`` or ``None``.
        backend: the process group's backend, or ``None`` when there is no process group.
        sources: field name -> the variable it came from, ``"process_group"`` or ``"default"``.
        warnings: one line per conflict or invalid value, each naming the variables and the fix.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    launcher: Optional[str]
    backend: Optional[str]
    sources: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def _group_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """This process's global rank: from the process group if one exists, else from the launcher."""
    if _group_initialized():
        return dist.get_rank()
    return detect().rank


def get_world_size() -> int:
    """The number of processes in the job (1 when not launched)."""
    if _group_initialized():
        return dist.get_world_size()
    return detect().world_size


def get_local_rank() -> int:
    """This process's rank on its node (LOCAL_RANK, SLURM_LOCALID, ...; 0 when not launched)."""
    return detect().local_rank


def get_local_world_size() -> int:
    """The number of processes on this node (1 when not launched)."""
    return detect().local_world_size


def get_node_rank() -> int:
    """The index of this node in the job (0 when not launched)."""
    return detect().node_rank


def is_distributed() -> bool:
    """True when the job has more than one process, whether or not the process group exists yet."""
    return get_world_size() > 1


def is_main_process(local: bool = False) -> bool:
    """True on global rank 0, or with ``local=True`` on local rank 0 of each node."""
    return (get_local_rank() if local else get_rank()) == 0


def rank_info(environ: Optional[Mapping[str, str]] = None, argv: Optional[Sequence[str]] = None,
              warn: bool = True) -> RankInfo:
    """The values of :func:`get_rank` and friends with where each came from, and their conflicts.

    Args:
        environ: the environment to read (default ``os.environ``); for tests and dry runs.
        argv: the command line to read ``--local_rank`` from (default ``sys.argv``).
        warn: issue a :class:`RankConflictWarning` per conflict (they are always in ``.warnings``).
    """
    info = detect(environ, argv)
    values = {f: getattr(info, f) for f in ("rank", "world_size", "local_rank", "local_world_size", "node_rank")}
    sources = dict(info.sources)
    lines = list(info.conflicts) + list(info.problems)
    backend = None
    if _group_initialized():
        backend = str(dist.get_backend())
        for name, actual in (("rank", dist.get_rank()), ("world_size", dist.get_world_size())):
            if info.launcher is not None and sources.get(name) != "default" and values[name] != actual:
                lines.append(f"{sources[name]}={values[name]} but the process group says {name}={actual}; "
                             f"the process group wins: pass rank/world_size from the launcher's variables "
                             f"to init_process_group")
            values[name] = actual
            sources[name] = "process_group"
    if warn:
        for line in lines:
            warnings.warn(line, RankConflictWarning, stacklevel=2)
    return RankInfo(launcher=info.launcher, backend=backend, sources=sources, warnings=tuple(lines), **values)


def rank_device() -> torch.device:
    """The device this rank's collectives run on: its own GPU on NCCL, the CPU otherwise.

    On NCCL this is the device bound to the process group (``init_process_group(device_id=...)``),
    else ``cuda:LOCAL_RANK`` (modulo the visible devices, so one GPU per process via
    CUDA_VISIBLE_DEVICES works), never an unset current device that makes every rank use GPU 0.
    """
    if not _group_initialized() or dist.get_backend() != "nccl":
        return torch.device("cpu")
    bound = getattr(dist.distributed_c10d._get_default_group(), "bound_device_id", None)
    if bound is not None:
        return bound
    return torch.device("cuda", get_local_rank() % max(1, torch.cuda.device_count()))


def require_process_group(what: str) -> bool:
    """True when a collective must run; False in a world of one.

    Raises:
        NotInitializedError: a launcher started several processes but ``init_process_group``
            has not been called, so ``what`` cannot reach the other ranks.
    """
    if _group_initialized():
        return dist.get_world_size() > 1
    info = detect()
    if info.world_size > 1:
        raise NotInitializedError(
            "no-process-group",
            f"{what} needs the other {info.world_size - 1} ranks ({info.sources.get('world_size')}="
            f"{info.world_size}) but no process group is initialized",
            "call torch.distributed.init_process_group() first",
        )
    return False
