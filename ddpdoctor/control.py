"""The control channel: results, directives, deaths and stacks travel here, never on the backend.

It is a key-value store (torch's TCPStore: plain TCP, no gloo or NCCL), so a broken backend still
yields a report. Every value is JSON. Keys (under a per-run prefix):

``hello/<rank>``      a worker arrived (pid, host, GPUs)
``port/<rank>``       the supervisor-side port outcome of that rank
``plan/<i>``          the coordinator's directive for check i: run, skip, supervisor or stop
``result/<i>/<rank>`` a rank's outcome for check i
``dead/<rank>``       a rank's supervisor saw its worker die (how)
``stackreq/<rank>``, ``stack/<rank>``  a stack dump asked for, and the answer
``final``             the run's exit code; every supervisor exits with it
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Any, Iterable, Optional

__all__ = ["Channel", "ChannelLost", "connect_store", "host_store"]


class ChannelLost(RuntimeError):
    """The control store stopped answering (its host exited or the network broke)."""


def host_store(listen_fd: int, addr: str, port: int, timeout: float) -> Any:
    """Serve the store on an already bound and listening socket (the store takes the fd)."""
    import torch.distributed as dist

    return dist.TCPStore(addr, port, None, True, timeout=datetime.timedelta(seconds=timeout),
                         wait_for_workers=False, master_listen_fd=listen_fd)


def connect_store(addr: str, port: int, timeout: float) -> Any:
    """Connect to the store at ``addr:port``, retrying until ``timeout`` seconds have passed.

    Raises:
        ChannelLost: nothing answered in time, naming the address.
    """
    import torch.distributed as dist

    try:
        return dist.TCPStore(addr, port, None, False, timeout=datetime.timedelta(seconds=timeout))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ChannelLost(f"could not reach the control store at {addr}:{port} within {timeout:g}s: {first}") from exc


class Channel:
    """JSON values under a run's prefix in a torch Store."""

    def __init__(self, store: Any, prefix: str) -> None:
        import torch.distributed as dist

        self.raw = store
        self.prefix = prefix
        self.store = dist.PrefixStore(prefix, store)

    def put(self, key: str, value: Any) -> None:
        try:
            self.store.set(key, json.dumps(value))
        except Exception as exc:
            raise ChannelLost(f"control store write failed: {exc}") from exc

    def has(self, key: str) -> bool:
        try:
            return bool(self.store.check([key]))
        except Exception as exc:
            raise ChannelLost(f"control store read failed: {exc}") from exc

    def get(self, key: str) -> Any:
        """The value at ``key``, which the caller knows exists."""
        try:
            return json.loads(self.store.get(key))
        except Exception as exc:
            raise ChannelLost(f"control store read failed: {exc}") from exc

    def take(self, key: str) -> Optional[Any]:
        """The value at ``key`` if present (then deleted), else None."""
        if not self.has(key):
            return None
        value = self.get(key)
        self.store.delete_key(key)
        return value

    def present(self, keys: Iterable[str]) -> list[str]:
        return [k for k in keys if self.has(k)]

    def wait(self, key: str, timeout: float, poll: float = 1.0) -> Optional[Any]:
        """Block until ``key`` exists (then return its value) or ``timeout`` seconds pass (None)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                self.store.wait([key], datetime.timedelta(seconds=min(poll, left)))
            except Exception as exc:
                if "timeout" in str(exc).lower() or "timed out" in str(exc).lower():
                    continue
                raise ChannelLost(f"control store wait failed: {exc}") from exc
            return self.get(key)
