"""How a process ended, in words: the signal's name and what usually sends it."""

from __future__ import annotations

import os
import signal

__all__ = ["describe_exit", "signal_hint"]

_SIGNAL_HINTS = {
    signal.SIGKILL: "SIGKILL is often the kernel's OOM killer: check `dmesg | grep -i oom` and lower memory per rank",
    signal.SIGSEGV: "a native crash: rerun with TORCH_SHOW_CPP_STACKTRACES=1 and check library versions",
    signal.SIGBUS: "often /dev/shm too small (Docker: --shm-size=8g or --ipc=host)",
    signal.SIGABRT: "a native abort (NCCL or a C++ assertion): read the rank's log above the abort",
}



def describe_exit(wait_status: int, pid: int) -> dict:
    """How a process ended, as JSON: ``{"signal": "SIGSEGV", "text": "...", "hint": ...}``."""
    if os.WIFSIGNALED(wait_status):
        num = os.WTERMSIG(wait_status)
        try:
            name = signal.Signals(num).name
        except ValueError:
            name = f"signal {num}"
        return {"signal": name, "code": None,
                "text": f"{name} received by PID {pid} (signal {num})",
                "hint": signal_hint(num)}
    code = os.WEXITSTATUS(wait_status)
    return {"signal": None, "code": code, "text": f"PID {pid} exited with code {code} before reporting",
            "hint": "read the rank's log in the details (-v); an os._exit or sys.exit in imported code ends a rank silently"}



def signal_hint(num: int) -> str:
    return _SIGNAL_HINTS.get(num, "find who sent the signal (job scheduler, OOM killer, a user)")
