"""Real-GPU tests: the machine's own GPUs for the processes a `gpu` test starts, and how many there are.

The suite hides GPUs from everything else (conftest.py sets CUDA_VISIBLE_DEVICES=""), so these tests
run their GPU work in subprocesses with the original setting, and count GPUs there too (counting in
this process would initialize CUDA with no device visible).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import conftest

__all__ = ["gpu_env", "cuda_gpus", "needs_gpus"]


def gpu_env(base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    if conftest.ORIGINAL_CUDA_VISIBLE_DEVICES is None:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        env["CUDA_VISIBLE_DEVICES"] = conftest.ORIGINAL_CUDA_VISIBLE_DEVICES
    return env


@functools.lru_cache(maxsize=1)
def cuda_gpus() -> int:
    """CUDA GPUs this machine gives the suite's processes (0 with a CPU torch or no driver)."""
    import torch

    if torch.version.cuda is None:  # a CPU build: no CUDA whatever the machine has
        return 0
    code = ("import torch, torch.distributed as d; "
            "print(torch.cuda.device_count() if torch.cuda.is_available() and d.is_nccl_available() else 0)")
    try:
        p = subprocess.run([sys.executable, "-c", code], env=gpu_env(), capture_output=True, text=True, timeout=120)
        return int(p.stdout.strip() or 0)
    except (subprocess.TimeoutExpired, ValueError):
        return 0


def needs_gpus(n: int) -> str:
    """The skip reason when fewer than ``n`` CUDA GPUs (with NCCL) are here, else ''."""
    have = cuda_gpus()
    return "" if have >= n else f"needs {n} CUDA GPU{'s' if n > 1 else ''} and NCCL; this machine has {have}"
