"""Which launcher started this process, and which rank it is: the one place that reads that.

Both the check runner's joined mode and the library's rank helpers (``get_rank`` and friends) call
:func:`detect`. Sources, in order of precedence: torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``),
Slurm's srun (``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``), Open MPI
(``OMPI_COMM_WORLD_*``), PMI (MPICH, Intel MPI: ``PMI_RANK``/``PMI_SIZE``), and the legacy
``--local_rank`` argument of ``torch.distributed.launch``. Nothing here touches a process group or CUDA.
"""

from __future__ import annotations

import os
import re
import sys
import zlib
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from ddpdoctor.errors import LauncherError

__all__ = ["LaunchInfo", "GLOBAL_RANK_VARIABLES", "detect", "expand_hostlist", "derive_port", "rank_claims"]

#: Every variable a launcher sets to the global rank, in the order :func:`detect` reads them when no
#: launcher is complete (a rank variable without its world size): torchrun, Slurm, Open MPI, PMI, LSF's jsrun.
GLOBAL_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JSM_NAMESPACE_RANK")

# (variable for rank, world size, local rank, local world size, node rank) per launcher.
_SOURCES: dict[str, dict[str, str]] = {
    "torchrun": {
        "rank": "RANK",
        "world_size": "WORLD_SIZE",
        "local_rank": "LOCAL_RANK",
        "local_world_size": "LOCAL_WORLD_SIZE",
        "node_rank": "GROUP_RANK",
    },
    "slurm": {
        "rank": "SLURM_PROCID",
        "world_size": "SLURM_NTASKS",
        "local_rank": "SLURM_LOCALID",
        "local_world_size": "SLURM_NTASKS_PER_NODE",
        "node_rank": "SLURM_NODEID",
    },
    "mpi": {
        "rank": "OMPI_COMM_WORLD_RANK",
        "world_size": "OMPI_COMM_WORLD_SIZE",
        "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK",
        "local_world_size": "OMPI_COMM_WORLD_LOCAL_SIZE",
        "node_rank": "OMPI_COMM_WORLD_NODE_RANK",
    },
    "pmi": {
        "rank": "PMI_RANK",
        "world_size": "PMI_SIZE",
        "local_rank": "MPI_LOCALRANKID",
        "local_world_size": "MPI_LOCALNRANKS",
        "node_rank": "",
    },
}

FIELDS = ("rank", "world_size", "local_rank", "local_world_size", "node_rank")


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in the job, and which variable said so.

    Attributes:
        launcher: ``torchrun``, ``slurm``, ``mpi``, ``pmi``, ``legacy`` or ``None`` (not launched).
        rank, world_size, local_rank, local_world_size, node_rank: the values (defaults for a
            world of one when not launched).
        master_addr, master_port: the rendezvous address, from MASTER_ADDR/MASTER_PORT or derived
            (the first host of SLURM_JOB_NODELIST; a port derived from the job id). ``None`` when
            nothing says.
        sources: field name -> the variable it came from (``"default"`` when none).
        conflicts: one line per disagreement between sources (RANK != SLURM_PROCID, ...).
        problems: one line per invalid value; :func:`detect` raises on these when ``strict``.
        rank_conflicts: the lines of ``conflicts`` that concern the global rank (stale or lone rank
            variables); ``get_rank()`` warns about these once each.
    """

    launcher: Optional[str]
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    sources: Mapping[str, str] = field(default_factory=dict)
    conflicts: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    rank_conflicts: tuple[str, ...] = ()

    @property
    def is_launched(self) -> bool:
        """True when a launcher set up a world of more than one process (joined mode)."""
        return self.launcher is not None and self.world_size > 1

    @property
    def num_nodes(self) -> int:
        return max(1, -(-self.world_size // max(1, self.local_world_size)))


def _parse_int(env: Mapping[str, str], name: str, problems: list[str]) -> Optional[int]:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        problems.append(f"{name}={raw!r} is not an integer; set it to a whole number or unset it")
        return None
    if value < 0:
        problems.append(f"{name}={value} is negative; ranks and sizes start at 0 and 1")
        return None
    return value


def _slurm_tasks_per_node(env: Mapping[str, str]) -> Optional[str]:
    """SLURM_NTASKS_PER_NODE may be absent; SLURM_TASKS_PER_NODE looks like ``4(x2),3``."""
    if env.get("SLURM_NTASKS_PER_NODE"):
        return env["SLURM_NTASKS_PER_NODE"]
    raw = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not raw:
        return None
    m = re.match(r"^(\d+)", raw)
    return m.group(1) if m else None


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist: ``node[01-03,07],gpu5`` -> ``[node01, node02, node03, node07, gpu5]``.

    Zero padding is kept, several bracket groups in one name are expanded left to right.

    Raises:
        ValueError: for an unbalanced bracket or a reversed range, naming the expression.
    """
    hosts: list[str] = []
    for item in _split_top_level(expr):
        hosts.extend(_expand_one(item, expr))
    return hosts


def _split_top_level(expr: str) -> list[str]:
    items, depth, cur = [], 0, []
    for ch in expr.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {expr!r}")
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in hostlist {expr!r}")
    items.append("".join(cur))
    return [i.strip() for i in items if i.strip()]


def _expand_one(item: str, expr: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if not m:
        return [item]
    prefix, body, rest = item[: m.start()], m.group(1), item[m.end():]
    out: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise ValueError(f"bad range {part!r} in hostlist {expr!r}")
            width = len(lo)
            values = [str(v).zfill(width) for v in range(int(lo), int(hi) + 1)]
        else:
            values = [part]
        for v in values:
            out.extend(_expand_one(prefix + v + rest, expr))
    return out


def derive_port(key: str, low: int = 20000, span: int = 20000) -> int:
    """A port every rank of a job computes alike from a job-wide key (never a fixed 29500)."""
    return low + zlib.crc32(key.encode()) % span


def _legacy_local_rank(argv: Sequence[str]) -> Optional[str]:
    for i, arg in enumerate(argv):
        for flag in ("--local_rank", "--local-rank"):
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
    return None


def _pick_launcher(env: Mapping[str, str]) -> Optional[str]:
    if "RANK" in env and "WORLD_SIZE" in env:
        return "torchrun"
    if "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        return "slurm"
    if "OMPI_COMM_WORLD_RANK" in env:
        return "mpi"
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        return "pmi"
    return None


def detect(
    environ: Optional[Mapping[str, str]] = None,
    argv: Optional[Sequence[str]] = None,
    strict: bool = False,
) -> LaunchInfo:
    """Read the launcher's variables.

    Args:
        environ: the environment to read (default ``os.environ``).
        argv: the command line for ``--local_rank`` (default ``sys.argv``).
        strict: raise on invalid values instead of recording them in ``problems``.

    Raises:
        LauncherError: with ``strict``, on the first invalid value, naming it and the fix.
    """
    env = os.environ if environ is None else environ
    argv = sys.argv if argv is None else argv
    launcher = _pick_launcher(env)
    problems: list[str] = []
    values: dict[str, Optional[int]] = {f: None for f in FIELDS}
    sources: dict[str, str] = {}

    if launcher is not None:
        names = dict(_SOURCES[launcher])
        view = dict(env)
        if launcher == "slurm":
            tpn = _slurm_tasks_per_node(env)
            if tpn is not None:
                view["SLURM_NTASKS_PER_NODE"] = tpn
        for f in FIELDS:
            var = names.get(f)
            if var:
                values[f] = _parse_int(view, var, problems)
                if values[f] is not None:
                    sources[f] = var
        # torchrun jobs also carry Slurm/MPI variables when nested; LOCAL_RANK is common to all.
        if launcher != "torchrun" and values["local_rank"] is None and "LOCAL_RANK" in env:
            values["local_rank"] = _parse_int(env, "LOCAL_RANK", problems)
            sources["local_rank"] = "LOCAL_RANK"
        # torch.distributed.launch without --use_env sets RANK/WORLD_SIZE but passes the local
        # rank only as an argument.
        legacy = _legacy_local_rank(argv)
        if values["local_rank"] is None and legacy is not None:
            values["local_rank"] = _parse_int({"--local_rank": legacy}, "--local_rank", problems)
            if values["local_rank"] is not None:
                sources["local_rank"] = "--local_rank"
    else:
        lone = _lone_rank(env, problems)
        if lone is not None:
            # A rank variable without its world size (RANK alone, SLURM_PROCID outside a job step,
            # JSM_NAMESPACE_RANK): it still names this process's rank, so rank-zero code must not
            # run here as if it were rank 0. Nothing names the world size: it stays 1.
            values["rank"], sources["rank"] = lone[1], lone[0]
        legacy = _legacy_local_rank(argv)
        if legacy is not None or "LOCAL_RANK" in env:
            launcher = "legacy" if legacy is not None else None
            var = "--local_rank" if legacy is not None else "LOCAL_RANK"
            values["local_rank"] = _parse_int({var: legacy or env.get("LOCAL_RANK", "")}, var, problems)
            if values["local_rank"] is not None:
                sources["local_rank"] = var

    # torchrun's variables are checked whatever else is set (another launcher, or RANK without
    # WORLD_SIZE): RANK=abc is a mistake in any case, never silently a world of one.
    if launcher != "torchrun":
        for var in ("RANK", "WORLD_SIZE"):
            _parse_int(env, var, problems)

    info_values = {
        "rank": values["rank"] if values["rank"] is not None else 0,
        "world_size": values["world_size"] if values["world_size"] is not None else 1,
        "local_rank": values["local_rank"] if values["local_rank"] is not None else 0,
    }
    lws = values["local_world_size"]
    if lws is None:
        # Without a per-node count, assume one node (the common single-machine case).
        lws = info_values["world_size"] if launcher not in (None, "legacy") else 1
    info_values["local_world_size"] = max(1, lws)
    nr = values["node_rank"]
    if nr is None and info_values["local_world_size"]:
        nr = info_values["rank"] // max(1, info_values["local_world_size"])
    info_values["node_rank"] = nr or 0
    for f in FIELDS:
        sources.setdefault(f, "default")

    if launcher is not None and launcher != "legacy":
        if values["world_size"] is not None and values["world_size"] == 0:
            problems.append(f"{_SOURCES[launcher]['world_size']}=0; a world has at least one rank")
        elif values["rank"] is not None and values["world_size"] is not None and values["rank"] >= values["world_size"]:
            problems.append(
                f"{_SOURCES[launcher]['rank']}={values['rank']} is not below "
                f"{_SOURCES[launcher]['world_size']}={values['world_size']}; ranks run from 0 to world size - 1"
            )
        lw = info_values["local_world_size"]
        if values["local_rank"] is not None and values["local_world_size"] is not None and values["local_rank"] >= lw:
            problems.append(
                f"{sources['local_rank']}={values['local_rank']} is not below "
                f"{sources['local_world_size']}={lw}; local ranks run from 0 to processes per node - 1"
            )

    conflicts = _conflicts(env, launcher, info_values, problems, sources)
    rank_lines = [line for line in conflicts if line.split("=", 1)[0] in GLOBAL_RANK_VARIABLES + ("rank",)]
    if launcher in (None, "legacy"):
        rank_lines = _lone_conflicts(env, sources["rank"], info_values["rank"])
        conflicts = rank_lines + conflicts
    master_addr, master_port = _master(env, launcher, problems)
    if strict and problems:
        message, _, hint = problems[0].partition("; ")
        raise LauncherError("bad-launcher-env", message, hint)
    return LaunchInfo(
        launcher=launcher,
        master_addr=master_addr,
        master_port=master_port,
        sources=sources,
        conflicts=tuple(conflicts),
        problems=tuple(problems),
        rank_conflicts=tuple(rank_lines),
        **info_values,
    )


def rank_claims(environ: Optional[Mapping[str, str]] = None) -> list[tuple[str, Optional[int]]]:
    """Every global rank variable that is set, with its value (None when it is not a whole number >= 0).

    In :data:`GLOBAL_RANK_VARIABLES` order. Rank-zero code runs only when every claim (and the process
    group, once it exists) says 0; an unreadable value is never taken for 0.
    """
    env = os.environ if environ is None else environ
    scratch: list[str] = []
    return [(var, _parse_int(env, var, scratch)) for var in GLOBAL_RANK_VARIABLES if (env.get(var) or "").strip()]


def _lone_rank(env: Mapping[str, str], problems: list[str]) -> Optional[tuple[str, int]]:
    """The first global rank variable that is set and readable, when no launcher is complete."""
    for var in GLOBAL_RANK_VARIABLES:
        if (env.get(var) or "").strip():
            value = _parse_int(env, var, [])
            if value is not None:
                return var, value
    return None


def _lone_conflicts(env: Mapping[str, str], var: str, rank: int) -> list[str]:
    """Lines for rank variables set without a complete launcher: a lone non-zero rank, disagreeing or
    unreadable variables (``var`` is where the rank came from, ``"default"`` when from none)."""
    out = [f"{var}={rank} is set without its world size: get_rank() says {rank} and get_world_size() says 1; "
           f"launch with torchrun/srun/mpirun, or unset the stale {var}"] if rank != 0 else []
    for var_other, theirs in rank_claims(env):
        if theirs is None:
            out.append(f"{var_other}={env[var_other]!r} is not a rank; rank-zero code will not run in this process: "
                       f"set it to a whole number or unset it")
        elif var_other != var and theirs != rank:
            out.append(f"{var}={rank} but {var_other}={theirs}; get_rank() reads {', '.join(GLOBAL_RANK_VARIABLES)} "
                       f"in that order, so it says {rank}: unset the stale variable")
    return out


def _conflicts(env: Mapping[str, str], launcher: Optional[str], vals: Mapping[str, int], problems: list[str],
               sources: Mapping[str, str]) -> list[str]:
    """Other launchers' variables that disagree with the one in charge."""
    out: list[str] = []
    if launcher is None:
        return out
    scratch: list[str] = []
    for other, names in _SOURCES.items():
        if other == launcher:
            continue
        if other == "slurm" and launcher == "torchrun":
            # torchrun under srun: SLURM_PROCID is the node's task, not the worker's rank. Only a
            # one-task-per-GPU srun (SLURM_NTASKS == WORLD_SIZE) must agree.
            if _parse_int(env, "SLURM_NTASKS", scratch) != vals["world_size"]:
                continue
        for f in ("rank", "world_size"):
            var = names.get(f)
            if not var or var not in env:
                continue
            theirs = _parse_int(env, var, scratch)
            if theirs is not None and theirs != vals[f]:
                mine = _SOURCES[launcher][f] if launcher in _SOURCES else f
                out.append(f"{mine}={vals[f]} but {var}={theirs}; the launcher in charge is {launcher}, "
                           f"unset the stale {var} or launch with one launcher")
    if "JSM_NAMESPACE_RANK" in env and launcher in _SOURCES:
        theirs = _parse_int(env, "JSM_NAMESPACE_RANK", scratch)
        if theirs is not None and theirs != vals["rank"]:
            out.append(f"{_SOURCES[launcher]['rank']}={vals['rank']} but JSM_NAMESPACE_RANK={theirs}; the launcher in "
                       f"charge is {launcher}, unset the stale JSM_NAMESPACE_RANK or launch with one launcher")
    if launcher in ("torchrun",) and sources.get("local_rank") == "default":
        out.append("LOCAL_RANK is missing; each process cannot tell which GPU is its own: launch with torchrun "
                   "or set LOCAL_RANK per process")
    elif launcher in _SOURCES and sources.get("local_rank") == "default" and vals["world_size"] > 1:
        out.append(f"{_SOURCES[launcher]['local_rank']} and LOCAL_RANK are missing; local rank 0 is assumed, "
                   "which is wrong on every node but one of a multi-node job: set LOCAL_RANK per process")
    if launcher in _SOURCES and launcher != "torchrun" and "LOCAL_RANK" in env:
        theirs = _parse_int(env, "LOCAL_RANK", scratch)
        if theirs is not None and theirs != vals["local_rank"]:
            out.append(f"LOCAL_RANK={theirs} but {_SOURCES[launcher]['local_rank']}={vals['local_rank']}; "
                       "unset the stale LOCAL_RANK")
    return out


def _master(env: Mapping[str, str], launcher: Optional[str], problems: list[str]) -> tuple[Optional[str], Optional[int]]:
    addr = env.get("MASTER_ADDR") or None
    port = None
    if env.get("MASTER_PORT"):
        raw = env["MASTER_PORT"]
        try:
            port = int(raw)
        except ValueError:
            problems.append(f"MASTER_PORT={raw!r} is not a port number; set it to an integer in 1-65535")
        else:
            if not 1 <= port <= 65535:
                problems.append(f"MASTER_PORT={port} is out of range; set it to an integer in 1-65535")
                port = None
    if launcher == "slurm":
        if addr is None:
            nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
            if nodelist:
                try:
                    hosts = expand_hostlist(nodelist)
                except ValueError as exc:
                    problems.append(f"{exc}; fix SLURM_JOB_NODELIST or set MASTER_ADDR")
                else:
                    addr = hosts[0] if hosts else None
        if port is None and env.get("SLURM_JOB_ID"):
            port = derive_port("slurm-" + env["SLURM_JOB_ID"])
    elif launcher in ("mpi", "pmi"):
        local = env.get("OMPI_COMM_WORLD_LOCAL_SIZE") or env.get("MPI_LOCALNRANKS")
        size = env.get("OMPI_COMM_WORLD_SIZE") or env.get("PMI_SIZE")
        if addr is None and local is not None and local == size:
            addr = "127.0.0.1"  # every rank is on this node
        job_key = env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid") or env.get("PMI_KVSNAME")
        if port is None and job_key:
            port = derive_port("mpi-" + job_key)
    return addr, port
