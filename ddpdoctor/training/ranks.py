"""Which rank am I: the same answer before, during and without ``init_process_group``.

Launcher variables are read by :func:`ddpdoctor.launcher.detect` (the one module that knows
torchrun, Slurm, Open MPI, PMI and the legacy ``--local_rank`` argument); once a process group
exists, its rank and world size win. Nothing here initializes a process group or CUDA.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import torch
import torch.distributed as dist

from ddpdoctor.training.launcher import GLOBAL_RANK_VARIABLES, detect, rank_claims
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
    "is_rank_zero",
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


_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def _warn_once(line: str) -> None:
    """One :class:`RankConflictWarning` per distinct line per process (these are read at every call)."""
    with _WARNED_LOCK:
        if line in _WARNED:
            return
        _WARNED.add(line)
    warnings.warn(line, RankConflictWarning, stacklevel=3)


def get_rank() -> int:
    """This process's global rank: from the process group if one exists, else from the launcher.

    Without a process group the launcher in charge decides (torchrun, Slurm's srun, Open MPI, PMI:
    see :func:`ddpdoctor.training.launcher.detect`). When no launcher is complete, the first of
    ``RANK``, ``SLURM_PROCID``, ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``JSM_NAMESPACE_RANK`` that is
    set gives the rank, so ``RANK=1`` alone means rank 1, never 0. A rank variable that disagrees
    with the one used, or a lone non-zero one, is reported once per process as a
    :class:`RankConflictWarning` (the same lines as :func:`rank_info`). ``LOCAL_RANK`` alone is not
    a global rank: it leaves ``get_rank()`` at 0 (see :func:`is_rank_zero`).
    """
    if _group_initialized():
        return dist.get_rank()
    info = detect()
    for line in info.rank_conflicts:
        _warn_once(line)
    return info.rank


def is_rank_zero() -> bool:
    """True only when every rank this process is told says 0: the rule for rank-zero-only code.

    Every global rank variable that is set (``RANK``, ``SLURM_PROCID``, ``OMPI_COMM_WORLD_RANK``,
    ``PMI_RANK``, ``JSM_NAMESPACE_RANK``) and the process group once it exists must say 0; an
    unreadable value counts as not 0. A process that checkpoints or logs as rank 0 when one of them
    says otherwise corrupts the run, so a disagreement runs nothing and warns once. When none is
    set, ``LOCAL_RANK`` (or the legacy ``--local_rank`` argument) must be 0 too: it is not a global
    rank (warned once), but a non-zero local rank is certainly not global rank 0.
    """
    claims: list[tuple[str, Optional[int]]] = list(rank_claims())
    if _group_initialized():
        claims.append(("the process group's rank", dist.get_rank()))
    if not claims:
        info = detect()
        if info.sources.get("local_rank") in ("LOCAL_RANK", "--local_rank"):
            _warn_once(f"{info.sources['local_rank']}={info.local_rank} is set but no global rank variable "
                       f"({', '.join(GLOBAL_RANK_VARIABLES)}) is: a local rank is not a global rank, so rank-zero "
                       f"code runs only where it is 0; launch with torchrun, srun or mpirun")
            return info.local_rank == 0
        return True
    said = {value for _, value in claims}
    if said != {0} and 0 in said:
        _warn_once("rank-zero code did not run: " + ", ".join(
            f"{name}={os.environ.get(name, '') if value is None else value}" for name, value in claims)
            + "; they must all say 0: unset the stale variable")
    return said == {0}


def get_world_size() -> int:
    """The number of processes in the job (1 when not launched).

    When a rank variable is set without its world size (``RANK=1`` alone, ``SLURM_PROCID`` outside
    a job step), nothing names the size, so this stays 1 while :func:`get_rank` gives that rank;
    :func:`rank_info` and the first ``get_rank()`` warn about it.
    """
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
    """True on global rank 0 (:func:`is_rank_zero`'s rule), or with ``local=True`` on local rank 0 of each node."""
    return get_local_rank() == 0 if local else is_rank_zero()


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
