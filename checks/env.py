"""Check ``env``: versions, backends, CPUs, memory, GPUs, /dev/shm, threads and launcher variables."""

from __future__ import annotations

import ipaddress
import os
import platform
import shutil
import socket
from typing import Any, Mapping, Optional, Sequence

import psutil

from ddpdoctor.check import Check, CheckResult, Findings, RankContext, WorldInfo
from ddpdoctor.training import launcher
from ddpdoctor.result import Outcome, Status, count, merge_outcomes, rank_label
from ddpdoctor.system import envvars, nvml
from ddpdoctor.system.redact import redact_env

__all__ = ["EnvCheck", "collect_environment", "addresses_hidden", "describe_environment", "collect_installation", "describe_installation",
           "PACKAGES"]

SMALL_SHM_BYTES = 1 << 30  # Docker's default is 64 MB; NCCL and DataLoader workers need far more.


def _versions() -> dict[str, Optional[str]]:
    import torch
    import torch.distributed as dist

    cudnn = None
    try:
        v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        cudnn = str(v) if v else None
    except Exception:
        cudnn = None
    nccl = None
    if torch.version.cuda and dist.is_nccl_available():
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            nccl = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "nccl": nccl,
    }


def _backends() -> dict[str, bool]:
    import torch.distributed as dist

    return {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
        "ucc": bool(getattr(dist, "is_ucc_available", lambda: False)()),
    }


def addresses_hidden(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The facts as they are shown and written (``env --json``, ``check --json``): every interface's and
    the host name's addresses replaced by their kind (``loopback``, ``link-local``, ``private``,
    ``public``). Reports get pasted into public trackers; the kind is what a reader needs (a host name
    that resolves only to loopback, an interface with no address), the address is not."""

    def kind(address: str) -> str:
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return "unknown"
        if ip.is_loopback:
            return "loopback"
        if ip.is_link_local:
            return "link-local"
        return "private" if ip.is_private else "public"

    shown = dict(facts)
    shown["interfaces"] = {name: [kind(a) for a in addrs] for name, addrs in facts.get("interfaces", {}).items()}
    shown["hostname_addresses"] = [kind(a) for a in facts.get("hostname_addresses", ())]
    return shown


def collect_environment(environ: Optional[Mapping[str, str]] = None, local_world_size: int = 1,
                        backend: Optional[str] = None) -> dict[str, Any]:
    """Everything the env check looks at, as JSON-able facts (no verdicts)."""
    env = os.environ if environ is None else environ
    vm = psutil.virtual_memory()
    try:
        shm = shutil.disk_usage("/dev/shm").total
    except OSError:
        shm = None
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    gpu_view = nvml.load()
    gpus = gpu_view.gpus()
    info = launcher.detect(env, argv=[])
    interfaces = {
        name: sorted(a.address for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
        for name, addrs in psutil.net_if_addrs().items()
    }
    return {
        "host": platform.node(),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "versions": _versions(),
        "backends": _backends(),
        "cpus_logical": psutil.cpu_count(logical=True),
        "cpus_physical": psutil.cpu_count(logical=False),
        "cpus_usable": affinity,
        "memory_total_gib": round(vm.total / 2**30, 1),
        "memory_available_gib": round(vm.available / 2**30, 1),
        "shm_bytes": shm,
        "omp_num_threads": env.get("OMP_NUM_THREADS"),
        "local_world_size": local_world_size,
        "backend": backend,
        "visible_gpus": nvml.visible_gpus(gpu_view, dict(env)),
        "nvml": gpu_view.available,
        "nvml_reason": gpu_view.unavailable_reason,
        "driver": gpu_view.driver_version(),
        "gpus": [g.to_dict() for g in gpus],
        "interfaces": interfaces,
        "hostname_addresses": _resolve_hostname(),
        "nodes": info.num_nodes,
        "launcher": info.launcher,
        "launcher_problems": list(info.problems),
        "launcher_conflicts": list(info.conflicts),
        "variables": redact_env(envvars.relevant(env)),
    }


def _resolve_hostname() -> list[str]:
    """The addresses this host's name resolves to (what gloo advertises when no interface is named).

    The name is resolved as the bytes it is: a host name that is not valid UTF-8 (or not IDNA) is passed
    to the resolver as gloo would pass it, not re-encoded by Python (which raises UnicodeError)."""
    try:
        infos = socket.getaddrinfo(os.fsencode(socket.gethostname()), None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return sorted({str(i[4][0]) for i in infos})


def socket_ifname_problem(var: str, value: str, interfaces: Sequence[str]) -> Optional[str]:
    """Why ``var=value`` names no interface of this host, or None when it matches one.

    GLOO_SOCKET_IFNAME lists exact names; NCCL_SOCKET_IFNAME lists prefixes, ``=name`` for an exact
    name, and a leading ``^`` to exclude (which cannot be wrong in this way).
    """
    value = value.strip()
    if not value or value.startswith("^"):
        return None
    wanted = [w.strip() for w in value.split(",") if w.strip()]
    if var.startswith("NCCL"):
        def matches(w: str) -> bool:
            return any(i == w[1:] if w.startswith("=") else i.startswith(w) for i in interfaces)
        missing = [w for w in wanted if not matches(w)]
        bad = missing if len(missing) == len(wanted) else []
    else:
        bad = [w for w in wanted if w not in interfaces]
    if not bad:
        return None
    return f"{var}={value}: no interface {', '.join(bad)} on this host (it has: {', '.join(sorted(interfaces))})"


PACKAGES = ("accelerate", "lightning", "pytorch-lightning", "deepspeed", "transformers", "numpy")
"""Packages that change how a distributed job starts or behaves, named by ``ddpdoctor env`` where installed."""


def collect_installation() -> dict[str, Any]:
    """Which ddpdoctor this is (version, where it is imported from), the installed :data:`PACKAGES` and
    their versions, and the network interfaces by name and state (up, down, loopback; never their
    addresses: ``ddpdoctor env`` is pasted into bug reports). For ``ddpdoctor env`` only: the metadata
    scan costs a tenth of a second, which the ``env`` check of every rank need not pay."""
    from importlib import metadata

    import ddpdoctor

    found: dict[str, str] = {}
    for dist in metadata.distributions():  # one scan, not one per package
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in PACKAGES and name not in found:
            found[name] = dist.version
    try:
        stats = psutil.net_if_stats()
    except OSError:
        stats = {}
    network = {name: ("up" if st.isup else "down") + (", loopback" if "loopback" in st.flags.split(",") else "")
               for name, st in sorted(stats.items())}
    return {"ddpdoctor": {"version": ddpdoctor.__version__, "path": os.path.dirname(os.path.abspath(ddpdoctor.__file__))},
            "packages": {name: found[name] for name in PACKAGES if name in found},
            "network": network}


def describe_installation(facts: Mapping[str, Any]) -> list[str]:
    """:func:`collect_installation`'s facts as report lines."""
    me, packages, network = facts["ddpdoctor"], facts["packages"], facts["network"]
    return [f"ddpdoctor {me['version']} from {me['path']}",
            "packages: " + (", ".join(f"{k} {v}" for k, v in packages.items()) or
                            f"none of {', '.join(PACKAGES)}"),
            "network interfaces: " + (", ".join(f"{k} ({v})" for k, v in network.items()) or "none seen")]


def _na(value: Any, unit: str = "") -> str:
    return "n/a" if value is None else f"{value}{unit}"


def describe_environment(facts: Mapping[str, Any]) -> list[str]:
    """The environment as report lines, copy-paste ready for a bug report."""
    v = facts["versions"]
    lines = [
        f"host: {facts['host']} ({facts['platform']})",
        f"python {v['python']}, torch {v['torch']}, CUDA {_na(v['cuda'])}, cuDNN {_na(v['cudnn'])}, NCCL {_na(v['nccl'])}",
        "backends: " + ", ".join(f"{k} {'yes' if ok else 'no'}" for k, ok in facts["backends"].items()),
        f"CPUs: {facts['cpus_logical']} logical, {_na(facts['cpus_physical'])} physical, "
        f"{_na(facts['cpus_usable'])} usable; memory {facts['memory_total_gib']} GiB "
        f"({facts['memory_available_gib']} GiB available)",
        f"/dev/shm: {_na(None if facts['shm_bytes'] is None else round(facts['shm_bytes'] / 2**20), ' MiB')}",
        f"OMP_NUM_THREADS: {facts['omp_num_threads'] or 'unset'}",
    ]
    if facts["nvml"]:
        lines.append(f"NVIDIA driver {_na(facts['driver'])}, {len(facts['gpus'])} GPU(s)")
        for g in facts["gpus"]:
            if g["error"]:
                lines.append(f"  GPU {g['index']}: unreadable ({g['error']})")
                continue
            mem = f"{_na(g['memory_used_mb'])}/{_na(g['memory_total_mb'])} MiB"
            lines.append(
                f"  GPU {g['index']}: {_na(g['name'])}, {mem}, ECC uncorrected {_na(g['ecc_uncorrected'])}, "
                f"MIG {_na(None if g['mig_enabled'] is None else ('on' if g['mig_enabled'] else 'off'))}, "
                f"{_na(g['uuid'])}"
            )
    else:
        lines.append(f"GPUs: none seen through NVML ({facts['nvml_reason'] or 'no NVIDIA driver'})")
    lines.append(f"launcher: {facts['launcher'] or 'none'}")
    variables = facts["variables"]
    if variables:
        lines.append("variables: " + " ".join(f"{k}={val}" for k, val in variables.items()))
    return lines


def assess(facts: Mapping[str, Any]) -> Findings:
    """Turn facts into findings: what is wrong, why it matters, and the fix."""
    f = Findings()
    lws, visible = max(1, int(facts["local_world_size"])), facts.get("visible_gpus")
    if facts.get("backend") == "nccl" and visible is not None and lws > visible:
        f.fail("too-few-gpus",
               f"{lws} ranks on this node with NCCL, but {visible} GPU{'s' if visible != 1 else ''} visible "
               f"(NCCL needs one GPU per rank; rank {visible} and up fail with 'invalid device ordinal')",
               f"start at most {visible} rank{'s' if visible != 1 else ''} per node "
               f"(torchrun --nproc-per-node {visible})" + (" or make more GPUs visible (CUDA_VISIBLE_DEVICES)"
                                                              if visible else "") + ", or use the gloo backend")
    for problem in facts["launcher_problems"]:
        f.fail("bad-launcher-env", problem.split("; ")[0], problem.split("; ", 1)[-1])
    for conflict in facts["launcher_conflicts"]:
        message, _, hint = conflict.partition("; ")
        f.warn("launcher-conflict", message, hint or "launch with one launcher")
    shm = facts["shm_bytes"]
    if shm is not None and shm < SMALL_SHM_BYTES:
        f.warn(
            "small-shm",
            f"/dev/shm is only {shm // 2**20} MiB; NCCL and DataLoader workers need more (Docker defaults to 64 MiB)",
            "run the container with --ipc=host or --shm-size=8g",
        )
    omp = facts["omp_num_threads"]
    usable = facts["cpus_usable"] or facts["cpus_logical"]
    lws = max(1, int(facts["local_world_size"]))
    if omp:
        try:
            threads = int(omp)
        except ValueError:
            f.warn("bad-omp-num-threads", f"OMP_NUM_THREADS={omp!r} is not an integer",
                   "set OMP_NUM_THREADS to a whole number, e.g. cores per rank")
        else:
            if usable and threads * lws > usable:
                per_rank = max(1, usable // lws)
                # The fix is never the current setting: with one thread per rank, only fewer ranks help.
                fix = (f"export OMP_NUM_THREADS={per_rank}" if per_rank != threads else
                       f"run at most {usable} ranks per node (e.g. torchrun --nproc-per-node {usable}), "
                       f"or run where each rank has a core")
                f.warn(
                    "omp-oversubscribed",
                    f"OMP_NUM_THREADS={threads} x {count(lws, 'rank')} per node = {count(threads * lws, 'thread')} on {count(usable, 'core')}",
                    fix,
                )
    interfaces = facts.get("interfaces", {})
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        value = facts["variables"].get(var)
        problem = socket_ifname_problem(var, value, list(interfaces)) if value is not None else None
        if problem:
            usable = [n for n, addrs in sorted(interfaces.items()) if n != "lo" and addrs] or list(interfaces)
            f.fail("bad-socket-ifname", problem,
                   f"set {var} to the interface of the network the nodes share: {', '.join(usable)}")
    loop = [a for a in facts.get("hostname_addresses", ()) if a.startswith("127.") or a == "::1"]
    if facts.get("nodes", 1) > 1 and loop and len(loop) == len(facts.get("hostname_addresses", ())) \
            and "GLOO_SOCKET_IFNAME" not in facts["variables"]:
        f.warn("hostname-is-loopback",
               f"this host's name resolves only to {', '.join(loop)}; on a multi-node job gloo advertises "
               "that address and other nodes cannot connect",
               "set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to the shared network's interface, or fix "
               "/etc/hosts so the hostname maps to that interface's address")
    for name in facts["variables"]:
        meant = envvars.likely_typo(name)
        if meant:
            f.warn("env-typo", f"{name} is not a variable NCCL or PyTorch reads; did you mean {meant}?",
                   f"rename {name} to {meant}")
    for g in facts["gpus"]:
        if g["error"]:
            f.warn("gpu-unreadable", f"GPU {g['index']} cannot be read through NVML: {g['error']}",
                   "check `nvidia-smi`; a GPU that fell off the bus needs a node reboot")
        elif g["ecc_uncorrected"]:
            f.warn("gpu-ecc-errors", f"GPU {g['index']} reports {g['ecc_uncorrected']} uncorrected ECC errors",
                   "drain the node or reset the GPU (nvidia-smi -r) before long jobs")
    return f


class EnvCheck(Check):
    """Versions and environment of every rank; ranks on different versions fail."""

    name = "env"
    description = "Python/torch/CUDA/NCCL versions, backends, CPUs, memory, GPUs, /dev/shm, launcher variables"

    def run(self, ctx: RankContext) -> Outcome:
        facts = collect_environment(local_world_size=ctx.local_world_size, backend=ctx.backend)
        v = facts["versions"]
        ok = (
            f"python {v['python']}, torch {v['torch']}, CUDA {_na(v['cuda'])}, NCCL {_na(v['nccl'])}; "
            f"{count(facts['cpus_logical'], 'CPU')}, {facts['memory_total_gib']} GiB, {count(len(facts['gpus']), 'GPU')}"
        )
        return assess(facts).outcome(ctx.rank, ok, details=describe_environment(facts),
                                     data=addresses_hidden(facts))

    def merge(self, outcomes: Sequence[Outcome], world: WorldInfo) -> CheckResult:
        merged = merge_outcomes(self.name, outcomes)
        if merged.status >= Status.FAIL:
            return merged
        for key in ("torch", "python", "cuda", "nccl"):
            seen: dict[str, list[int]] = {}
            for o in outcomes:
                versions = o.data.get("versions") or {}
                seen.setdefault(str(versions.get(key)), []).append(o.rank)
            if len(seen) > 1:
                parts = "; ".join(f"{ver} on {rank_label(r)}" for ver, r in sorted(seen.items()))
                return CheckResult(
                    self.name, Status.FAIL, f"ranks run different {key} versions: {parts}",
                    hint=f"install the same {key} version on every node (one container image or environment)",
                    finding="version-mismatch", ranks=tuple(o.rank for o in outcomes),
                    outcomes=merged.outcomes, duration=merged.duration,
                )
        return merged
