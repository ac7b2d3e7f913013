"""NVML, wrapped once and lazily: GPU facts without initializing CUDA in this process.

The supervising process counts GPUs here (never through ``torch.cuda``), so it can fork workers
safely. Every field degrades to ``None`` ("n/a" in reports) when the library is missing, the
driver says NotSupported, or one GPU is lost: one bad GPU never breaks the report.

Tests replace the one seam, :func:`load`, with a fake that has the same methods as :class:`Nvml`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

__all__ = ["GpuInfo", "Nvml", "load", "set_loader", "forget", "visible_gpus"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML sees it; ``None`` marks a field NVML could not give."""

    index: int
    name: Optional[str] = None
    uuid: Optional[str] = None
    memory_total_mb: Optional[int] = None
    memory_used_mb: Optional[int] = None
    ecc_uncorrected: Optional[int] = None
    mig_enabled: Optional[bool] = None
    error: Optional[str] = None  # set when the GPU itself could not be read ("GPU is lost")
    processes: tuple[tuple[int, int], ...] = field(default=())  # (pid, used MB)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "memory_total_mb": self.memory_total_mb,
            "memory_used_mb": self.memory_used_mb,
            "ecc_uncorrected": self.ecc_uncorrected,
            "mig_enabled": self.mig_enabled,
            "error": self.error,
            "processes": [list(p) for p in self.processes],
        }


class Nvml:
    """A lazily initialized view of NVML.

    Args:
        module: the ``pynvml`` module (from the nvidia-ml-py distribution), or None when absent.
    """

    def __init__(self, module: Any = None, unavailable_reason: str = "") -> None:
        self._nvml = module
        self._ready: Optional[bool] = None
        self.unavailable_reason = unavailable_reason

    @property
    def available(self) -> bool:
        if self._ready is None:
            self._ready = False
            if self._nvml is not None:
                try:
                    self._nvml.nvmlInit()
                    self._ready = True
                except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                    self.unavailable_reason = _describe(exc)
        return self._ready

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            log.debug("NVML call %s failed: %s", getattr(fn, "__name__", fn), exc)
            return None

    def driver_version(self) -> Optional[str]:
        if not self.available:
            return None
        return _text(self._call(self._nvml.nvmlSystemGetDriverVersion))

    def device_count(self) -> int:
        """GPUs NVML sees (all of the node's, regardless of CUDA_VISIBLE_DEVICES); 0 without NVML."""
        if not self.available:
            return 0
        return self._call(self._nvml.nvmlDeviceGetCount) or 0

    def compute_capability(self, index: int) -> Optional[tuple]:
        """(major, minor) of GPU ``index``, or None when NVML cannot say."""
        if not self.available:
            return None
        try:
            handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            return None
        cc = self._call(self._nvml.nvmlDeviceGetCudaComputeCapability, handle)
        return (int(cc[0]), int(cc[1])) if cc is not None else None

    def gpus(self, with_processes: bool = False) -> list[GpuInfo]:
        """Every GPU, each field read on its own so that one failure costs one field."""
        return [self.gpu(i, with_processes) for i in range(self.device_count())]

    def gpu(self, index: int, with_processes: bool = False) -> GpuInfo:
        n = self._nvml
        try:
            handle = n.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            return GpuInfo(index=index, error=_describe(exc))
        mem = self._call(n.nvmlDeviceGetMemoryInfo, handle)
        ecc = self._call(n.nvmlDeviceGetTotalEccErrors, handle, 1, 1)  # uncorrected, aggregate
        mig = self._call(n.nvmlDeviceGetMigMode, handle)
        procs: tuple[tuple[int, int], ...] = ()
        if with_processes:
            raw = self._call(n.nvmlDeviceGetComputeRunningProcesses, handle) or []
            procs = tuple(
                (int(p.pid), int((p.usedGpuMemory or 0) // (1024 * 1024))) for p in raw
            )
        return GpuInfo(
            index=index,
            name=_text(self._call(n.nvmlDeviceGetName, handle)),
            uuid=_text(self._call(n.nvmlDeviceGetUUID, handle)),
            memory_total_mb=int(mem.total // (1024 * 1024)) if mem is not None else None,
            memory_used_mb=int(mem.used // (1024 * 1024)) if mem is not None else None,
            ecc_uncorrected=int(ecc) if ecc is not None else None,
            mig_enabled=bool(mig[0]) if mig is not None else None,
            processes=procs,
        )


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


def _default_loader() -> Nvml:
    try:
        import pynvml  # provided by nvidia-ml-py
    except Exception as exc:  # ImportError, or a broken install
        return Nvml(None, unavailable_reason=f"pynvml not importable ({_describe(exc)})")
    return Nvml(pynvml)


_loader: Callable[[], Nvml] = _default_loader
_instance: Optional[Nvml] = None


def load() -> Nvml:
    """The process-wide NVML view (created on first use)."""
    global _instance
    if _instance is None:
        _instance = _loader()
    return _instance


def forget() -> None:
    """Drop the process-wide view (a forked child re-initializes NVML for itself)."""
    global _instance
    _instance = None


def set_loader(loader: Optional[Callable[[], Nvml]]) -> None:
    """Replace how :func:`load` builds its view (tests pass a fake); None restores the default."""
    global _loader, _instance
    _loader = loader or _default_loader
    _instance = None


def visible_gpus(view: Optional[Nvml] = None, environ: Optional[dict] = None) -> int:
    """GPUs this process may use: NVML's count, narrowed by CUDA_VISIBLE_DEVICES (no CUDA init)."""
    view = view or load()
    env = os.environ if environ is None else environ
    count = view.device_count()
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return count
    entries = [e for e in cvd.split(",") if e.strip()]
    if entries and entries[0].strip().lstrip("-").isdigit() and int(entries[0]) < 0:
        return 0
    return min(count, len(entries))
