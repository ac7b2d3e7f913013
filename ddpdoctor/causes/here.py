"""``explain --here``: check the causes found in a log against the facts of this machine.

When the log came from this machine, some causes can be confirmed or ruled out by looking: does
the interface the job named exist, how many GPUs are there, how big and how writable is /dev/shm,
which torch / CUDA / NCCL are installed, which architectures the build has and which the GPU is.

Everything this module learns about the machine goes through one seam, :class:`Probe`; tests pass a
fake one. The real probe never initializes CUDA (GPU facts come from NVML) and imports torch only
for its version strings and build flags.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import stat
import warnings
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

from ddpdoctor.causes.evidence import gather
from ddpdoctor.causes.versions import NCCL_BF16, versions_in
from ddpdoctor.system import nvml

__all__ = ["Check", "HostFacts", "Probe", "check_here", "gather_facts", "render_here"]


@dataclass
class HostFacts:
    """What this machine says about itself; ``None`` where it could not be read."""

    hostname: str = ""
    interfaces: list = field(default_factory=list)
    gpu_count: Optional[int] = None
    gpu_names: list = field(default_factory=list)
    capabilities: list = field(default_factory=list)  # "sm_86", one per GPU
    shm_total_mb: Optional[int] = None
    shm_free_mb: Optional[int] = None
    shm_mode: Optional[str] = None  # e.g. "1777"
    shm_writable: Optional[bool] = None
    torch_version: Optional[str] = None
    torch_cuda: Optional[str] = None
    arch_list: list = field(default_factory=list)
    nccl_available: Optional[bool] = None
    nccl_version: Optional[str] = None
    windows: bool = False
    missing_attrs: dict = field(default_factory=dict)  # torch.distributed attribute -> present here?

    def to_dict(self) -> dict:
        return asdict(self)


class Probe:
    """The one seam to the machine: each method returns what it found, or None."""

    shm_path = "/dev/shm"

    def hostname(self) -> str:
        return socket.gethostname()

    def interfaces(self) -> Optional[list]:
        try:
            return sorted(name for _, name in socket.if_nameindex())
        except OSError:
            return None

    def gpus(self) -> tuple:
        """(count, names, capabilities as 'sm_XY'), from NVML; (None, [], []) without it."""
        view = nvml.load()
        if not view.available:
            return None, [], []
        infos = view.gpus()
        caps = []
        for info in infos:
            cc = view.compute_capability(info.index)
            caps.append(f"sm_{cc[0]}{cc[1]}" if cc else None)
        return len(infos), [i.name for i in infos], caps

    def shm(self) -> tuple:
        """(total MB, free MB, mode as octal text, writable) of /dev/shm."""
        try:
            st = os.statvfs(self.shm_path)
            mode = stat.S_IMODE(os.stat(self.shm_path).st_mode)
        except OSError:
            return None, None, None, None
        mb = 1024 * 1024
        return (st.f_blocks * st.f_frsize // mb, st.f_bavail * st.f_frsize // mb, f"{mode:o}",
                os.access(self.shm_path, os.W_OK | os.X_OK))

    def torch_info(self, attrs: Sequence[str] = ()) -> dict:
        """torch's version, CUDA, architectures, NCCL; and whether torch.distributed has ``attrs``."""
        try:
            with warnings.catch_warnings():  # torch's own import-time warnings (no numpy) are not ours
                warnings.simplefilter("ignore")
                import torch
                import torch.distributed as dist
        except Exception:
            return {}
        info = {"version": torch.__version__, "cuda": torch.version.cuda,
                "nccl_available": bool(dist.is_available() and dist.is_nccl_available())}
        try:
            info["arch_list"] = list(torch.cuda.get_arch_list()) if torch.version.cuda else []
        except Exception:
            info["arch_list"] = []
        if info["nccl_available"]:
            try:
                v = torch.cuda.nccl.version()
                info["nccl_version"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
            except Exception:
                pass
        info["attrs"] = {a: hasattr(dist, a) for a in attrs}
        return info


_MISSING_ATTR = re.compile(r"module 'torch\.distributed' has no attribute '(\w+)'")


def gather_facts(probe: Optional[Probe] = None, text: str = "") -> HostFacts:
    """This machine's facts (``text``: the log, to learn which torch.distributed names to look up)."""
    probe = probe or Probe()
    facts = HostFacts(hostname=probe.hostname(), windows=platform.system() == "Windows")
    facts.interfaces = probe.interfaces() or []
    facts.gpu_count, facts.gpu_names, facts.capabilities = probe.gpus()
    facts.shm_total_mb, facts.shm_free_mb, facts.shm_mode, facts.shm_writable = probe.shm()
    attrs = sorted(set(_MISSING_ATTR.findall(text[:1_000_000])))
    info = probe.torch_info(attrs)
    facts.torch_version, facts.torch_cuda = info.get("version"), info.get("cuda")
    facts.arch_list = info.get("arch_list", [])
    facts.nccl_available, facts.nccl_version = info.get("nccl_available"), info.get("nccl_version")
    facts.missing_attrs = info.get("attrs", {})
    return facts


@dataclass(frozen=True)
class Check:
    """One cause checked against this machine: ``verdict`` is confirmed, ruled out, or unknown."""

    cause: str
    verdict: str
    text: str

    def to_dict(self) -> dict:
        return {"cause": self.cause, "verdict": self.verdict, "text": self.text}


def _iface_exists(name: str, interfaces: Sequence[str]) -> bool:
    """NCCL's rule: a name matches interfaces it prefixes; '=name' matches exactly."""
    if name.startswith("="):
        return name[1:] in interfaces
    return any(i.startswith(name) for i in interfaces)


def check_here(matches: Sequence, text: str, facts: HostFacts) -> list:
    """Confirm or rule out each matched cause with this machine's facts (only causes it can check)."""
    ids = [m.cause.id for m in matches]
    ev = gather(text.splitlines())
    out: list = []

    def say(cid: str, verdict: str, msg: str) -> None:
        out.append(Check(cid, verdict, msg))

    if "socket-ifname-missing" in ids:
        names = [n for _, v in ev.ifnames for n in v.split(",") if n and not n.startswith("^")]
        have = ", ".join(facts.interfaces) or "none readable"
        if not names:
            say("socket-ifname-missing", "unknown", f"the log names no interface; this host has: {have}")
        for name in names:
            if "." in name or name == facts.hostname:
                say("socket-ifname-missing", "unknown",
                    f"{name} is a host name, not an interface: check that it resolves (getent hosts {name})")
            elif _iface_exists(name, facts.interfaces):
                say("socket-ifname-missing", "ruled out",
                    f"interface {name} exists here ({have}): the job ran on another host or network namespace")
            else:
                say("socket-ifname-missing", "confirmed", f"no interface {name} here; this host has: {have}")
    for cid in ("more-ranks-than-gpus", "duplicate-gpu"):
        if cid not in ids:
            continue
        if facts.gpu_count is None:
            say(cid, "unknown", "NVML is not available here, so the GPUs cannot be counted")
        elif ev.nproc is None:
            say(cid, "unknown", f"this host has {facts.gpu_count} GPU(s); the log does not show the process count")
        elif ev.nproc > facts.gpu_count:
            say("more-ranks-than-gpus", "confirmed",
                f"the log starts {ev.nproc} processes per node and this host has {facts.gpu_count} GPU(s)")
        else:
            say("more-ranks-than-gpus", "ruled out",
                f"{ev.nproc} processes per node fit the {facts.gpu_count} GPUs here: look for a missing set_device")
    if "shm-too-small" in ids:
        if facts.shm_total_mb is None:
            say("shm-too-small", "unknown", "/dev/shm cannot be read here")
        elif facts.shm_total_mb < 1024 or (facts.shm_free_mb is not None and facts.shm_free_mb < 256):
            say("shm-too-small", "confirmed",
                f"/dev/shm here is {facts.shm_total_mb} MB ({facts.shm_free_mb} MB free)")
        else:
            say("shm-too-small", "ruled out",
                f"/dev/shm here is {facts.shm_total_mb} MB ({facts.shm_free_mb} MB free): if the job ran in a "
                "container, check the container's /dev/shm instead")
    if "shm-permission" in ids:
        if facts.shm_writable is None:
            say("shm-permission", "confirmed" if facts.shm_total_mb is None else "unknown",
                "/dev/shm does not exist here" if facts.shm_total_mb is None else "/dev/shm permissions unknown")
        elif facts.shm_writable and facts.shm_mode == "1777":
            say("shm-permission", "ruled out", "/dev/shm here is writable (mode 1777)")
        else:
            say("shm-permission", "confirmed" if not facts.shm_writable else "unknown",
                f"/dev/shm here has mode {facts.shm_mode} and is {'not ' if not facts.shm_writable else ''}writable "
                "by this user")
    if "cuda-arch-unsupported" in ids:
        if not facts.capabilities or not facts.arch_list:
            say("cuda-arch-unsupported", "unknown",
                f"GPU architectures here: {', '.join(c for c in facts.capabilities if c) or 'n/a'}; "
                f"the torch build's: {', '.join(facts.arch_list) or 'n/a (CPU build or no torch)'}")
        else:
            missing = sorted({c for c in facts.capabilities if c and c not in facts.arch_list})
            if missing:
                say("cuda-arch-unsupported", "confirmed",
                    f"this GPU is {', '.join(missing)}; torch {facts.torch_version} has {', '.join(facts.arch_list)}")
            else:
                say("cuda-arch-unsupported", "ruled out",
                    f"torch {facts.torch_version} here has kernels for every GPU here ({', '.join(c for c in facts.capabilities if c)})")
    if "nccl-not-built" in ids:
        if facts.nccl_available is None:
            say("nccl-not-built", "unknown", "torch is not importable here")
        else:
            say("nccl-not-built", "confirmed" if not facts.nccl_available else "ruled out",
                f"torch {facts.torch_version} here {'has no' if not facts.nccl_available else 'has'} NCCL"
                + (" (Windows)" if facts.windows else ""))
    if "nccl-bf16-unsupported" in ids or "nccl-version-mismatch" in ids:
        here_v = tuple(int(x) for x in re.findall(r"\d+", facts.nccl_version or "")[:3])
        logged = versions_in(text.splitlines()).get("nccl")
        if "nccl-bf16-unsupported" in ids:
            if len(here_v) < 3:
                say("nccl-bf16-unsupported", "unknown", f"NCCL here: {facts.nccl_version or 'n/a'}")
            else:
                old_here = here_v < NCCL_BF16
                say("nccl-bf16-unsupported", "confirmed" if old_here else "ruled out",
                    f"NCCL {facts.nccl_version} here {'has no' if old_here else 'has'} bfloat16 (2.10.3+)"
                    + ("" if old_here else ": the job loaded another NCCL, or ran elsewhere"))
        if "nccl-version-mismatch" in ids:
            if len(here_v) < 3 or not logged:
                say("nccl-version-mismatch", "unknown",
                    f"NCCL here: {facts.nccl_version or 'n/a'}; the log prints no NCCL version to compare")
            else:
                same = here_v == logged
                say("nccl-version-mismatch", "unknown" if same else "confirmed",
                    f"NCCL here is {facts.nccl_version}, the log's rank printed {'.'.join(map(str, logged))}"
                    + (": compare the other nodes" if same else ": this node differs"))
    if "nccl-library-mismatch" in ids:
        if facts.nccl_version:
            say("nccl-library-mismatch", "ruled out",
                f"torch {facts.torch_version} loads NCCL {facts.nccl_version} here: the mismatch is in the job's "
                "environment, not this one")
        else:
            say("nccl-library-mismatch", "unknown",
                f"torch here: {facts.torch_version or 'not importable'}; NCCL: {facts.nccl_version or 'n/a'}")
    if "torch-api-mismatch" in ids:
        for attr, present in sorted(facts.missing_attrs.items()):
            say("torch-api-mismatch", "ruled out" if present else "confirmed",
                f"torch.distributed.{attr} {'exists' if present else 'is missing'} in torch {facts.torch_version} here")
        if not facts.missing_attrs:
            say("torch-api-mismatch", "unknown", f"torch here: {facts.torch_version or 'not importable'}")
    return out


def render_here(facts: HostFacts, checks: Sequence) -> list:
    """The lines ``explain --here`` adds after the causes."""
    gpus = "n/a (no NVML)" if facts.gpu_count is None else str(facts.gpu_count)
    shm = ("n/a" if facts.shm_total_mb is None else
           f"{facts.shm_total_mb} MB ({facts.shm_free_mb} MB free, mode {facts.shm_mode})")
    out = [f"here ({facts.hostname}; valid only if the job ran on this machine):",
           f"  interfaces: {', '.join(facts.interfaces) or 'n/a'}; GPUs: {gpus}; /dev/shm: {shm}",
           f"  torch {facts.torch_version or 'n/a'} (CUDA {facts.torch_cuda or 'none'}, NCCL "
           f"{facts.nccl_version or ('none' if facts.nccl_available is False else 'n/a')})"]
    if not checks:
        out.append("  none of the causes above can be checked from here")
    for c in checks:
        out.append(f"  {c.cause}: {c.verdict}: {c.text}")
    return out
