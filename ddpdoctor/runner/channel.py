"""The control channel: results, directives, deaths and stacks travel here, never on the backend.

It is a key-value store (torch's TCPStore: plain TCP, no gloo or NCCL), so a broken backend still
yields a report. Every value is JSON. Keys (under a per-run prefix):

``hello/<rank>``      a worker arrived (pid, host, GPUs)
``port/<rank>``       the supervisor-side port outcome of that rank
``plan/<i>``          the coordinator's directive for check i: run, skip, supervisor or stop; a run
                      directive also carries the check's deadline and the world's facts (every
                      rank's host, run-length packed, and the most crowded node's ranks per core)
``result/<i>/<rank>`` a rank's outcome for check i
``dead/<rank>``       a rank's supervisor saw its worker die (how)
``stackreq/<rank>``, ``stack/<rank>``  a stack dump asked for, and the answer
``final``             the run's exit code; every supervisor exits with it
``roll/<what>``       who did ``what`` so far: ``r,`` appended per rank (``hello``, ``dead``, ``result/<i>``),
                      with a counter ``count/<what>`` when the reader polls before the roll exists

So that the messages per rank do not grow with the world, a waiting reader polls one roll or
counter per tick, never every rank's key. :data:`COUNTS` counts this process's store operations;
with ``DDPDOCTOR_CHANNEL_COUNTS=DIR`` each process writes them to ``DIR/<label>.json`` at its end
(:func:`dump_counts`): benchmarks/bench_scale.py reads them.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import queue
import threading
import time
from typing import Any, Callable, Iterable, Optional

__all__ = ["Channel", "ChannelLost", "connect_store", "host_store", "COUNTS", "dump_counts", "pack_hosts",
           "unpack_hosts"]

COUNTS: "collections.Counter[str]" = collections.Counter()  # store operations by kind, this process
COUNTS_ENV = "DDPDOCTOR_CHANNEL_COUNTS"


def dump_counts(label: str) -> None:
    """Write :data:`COUNTS` to ``$DDPDOCTOR_CHANNEL_COUNTS/<label>.json`` when that is set."""
    folder = os.environ.get(COUNTS_ENV)
    if not folder:
        return
    try:
        with open(os.path.join(folder, f"{label}.json"), "w") as f:
            json.dump(dict(COUNTS), f)
    except OSError:
        pass


def pack_hosts(hosts: dict[int, str], world_size: int) -> dict:
    """Every rank's host in rank order, compactly: the distinct names, and runs of consecutive ranks
    on one host as ``[name index, count]`` (a rank that never arrived: index -1). One node of 128
    ranks packs to one name and one run."""
    names: list[str] = []
    runs: list[list[int]] = []
    for r in range(world_size):
        host = hosts.get(r)
        if host is not None and host not in names:
            names.append(host)
        index = names.index(host) if host is not None else -1
        if runs and runs[-1][0] == index:
            runs[-1][1] += 1
        else:
            runs.append([index, 1])
    return {"names": names, "runs": runs}


def unpack_hosts(packed: Optional[dict]) -> tuple:
    """The inverse of :func:`pack_hosts`: a tuple of host names by rank ("" where unknown)."""
    if not packed:
        return ()
    names = packed.get("names", [])
    out: list[str] = []
    for index, n in packed.get("runs", []):
        out.extend([names[index] if 0 <= index < len(names) else ""] * int(n))
    return tuple(out)


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


class _Call:
    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.value: Any = None
        self.error: Optional[BaseException] = None


def _serve_calls(calls: "queue.Queue[Optional[_Call]]") -> None:
    while True:
        call = calls.get()
        if call is None:
            return
        try:
            call.value = call.fn(*call.args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            call.error = exc
        call.done.set()


class _DeadQueue:
    """Stands in for the call queue once the store stopped answering: every call times out at once."""

    def put(self, call: Optional[_Call]) -> None:
        if call is not None:
            call.error = ChannelLost("the control store stopped answering earlier")
            call.done.set()


def _dead_queue() -> Any:
    return _DeadQueue()


class Channel:
    """JSON values under a run's prefix in a torch Store.

    Args:
        store: the torch Store.
        prefix: the run's key prefix.
        op_timeout: when set, every operation must complete within this many seconds or
            :class:`ChannelLost` is raised. A store client blocks in ``recv`` for as long as TCP keeps
            a dead link open; the bound turns that into an error (the operation runs on a helper
            thread, which is left behind if it never returns).
    """

    def __init__(self, store: Any, prefix: str, op_timeout: Optional[float] = None) -> None:
        import torch.distributed as dist

        self.raw = store
        self.prefix = prefix
        self.store = dist.PrefixStore(prefix, store)
        self.op_timeout = op_timeout
        self._calls: Optional[queue.Queue] = None
        if op_timeout is not None:
            self._calls = queue.Queue()
            # A daemon thread, not an executor: interpreter exit must never wait for a stuck call.
            threading.Thread(target=_serve_calls, args=(self._calls,), name="ddpdoctor-ctl", daemon=True).start()

    def _op(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        COUNTS[what] += 1
        try:
            if self._calls is None:
                return fn(*args)
            call = _Call(fn, args)
            self._calls.put(call)
            if not call.done.wait(self.op_timeout):
                self._calls = _dead_queue()  # later calls fail fast instead of queueing behind it
                raise ChannelLost(f"the control store did not answer a {what} within {self.op_timeout:g}s "
                                  "(lost contact with the master?)")
            if call.error is not None:
                raise call.error
            return call.value
        except ChannelLost:
            raise
        except Exception as exc:
            raise ChannelLost(f"control store {what} failed: {exc}") from exc

    def close(self) -> None:
        """Stop the helper thread (it is abandoned if an operation never returns)."""
        if self._calls is not None:
            self._calls.put(None)

    def put(self, key: str, value: Any) -> None:
        self._op("write", self.store.set, key, json.dumps(value))

    def has(self, key: str) -> bool:
        return bool(self._op("read", self.store.check, [key]))

    def get(self, key: str) -> Any:
        """The value at ``key``, which the caller knows exists."""
        return json.loads(self._op("read", self.store.get, key))

    def take(self, key: str) -> Optional[Any]:
        """The value at ``key`` if present (then deleted), else None."""
        if not self.has(key):
            return None
        value = self.get(key)
        self._op("delete", self.store.delete_key, key)
        return value

    def enrol(self, what: str, rank: int, counted: bool = False) -> None:
        """Add ``rank`` to the roll ``what`` (and bump its counter when ``counted``)."""
        self._op("write", self.store.append, f"roll/{what}", f"{int(rank)},")
        if counted:
            self._op("write", self.store.add, f"count/{what}", 1)

    def count(self, what: str) -> int:
        """How many enrolled in ``what`` with ``counted=True`` (one message, never blocks)."""
        return int(self._op("read", self.store.add, f"count/{what}", 0))

    def open_roll(self, what: str) -> None:
        """Create the roll ``what`` empty, before anyone can enrol (then :meth:`roll` is one message)."""
        self._op("write", self.store.set, f"roll/{what}", "")

    def roll(self, what: str) -> list[int]:
        """The ranks enrolled in ``what`` so far, in order (one read; the roll must exist)."""
        raw = self._op("read", self.store.get, f"roll/{what}")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return [int(x) for x in text.split(",") if x]

    def present(self, keys: Iterable[str]) -> list[str]:
        return [k for k in keys if self.has(k)]

    def wait(self, key: str, timeout: float, poll: float = 1.0) -> Optional[Any]:
        """Block until ``key`` exists (then return its value) or ``timeout`` seconds pass (None)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            COUNTS["wait"] += 1
            try:
                self.store.wait([key], datetime.timedelta(seconds=min(poll, left)))
            except Exception as exc:
                if "timeout" in str(exc).lower() or "timed out" in str(exc).lower():
                    continue
                raise ChannelLost(f"control store wait failed: {exc}") from exc
            return self.get(key)
