"""Make ranks wait for each other, take turns, or stay quiet; without deadlocks and on every backend.

Every helper here is a no-op (or the obvious single-process answer) in a world of one.
:func:`zero_first` waits through the process group's store with its own timeout, not through a
collective, so an hour-long download on rank 0 does not hit the process group's timeout, and an
exception on rank 0 reaches the waiting ranks within a second.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import itertools
import logging
import random
import time
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch
import torch.distributed as dist

from ddpdoctor.dist.ranks import (get_local_rank, get_node_rank, get_rank, get_world_size, rank_device,
                                  require_process_group)
from ddpdoctor.errors import DdpdoctorError

__all__ = [
    "ZeroFirstError",
    "BarrierTimeoutError",
    "barrier",
    "wait_for_everyone",
    "synchronize",
    "zero_first",
    "main_process_first",
    "rank_zero_first",
    "rank_zero_only",
    "print0",
    "rank_zero_print",
    "seed_everything",
    "broadcast_object",
]

logger = logging.getLogger(__name__)

#: How long :func:`zero_first` waits for the first rank by default: long enough for a dataset download.
ZERO_FIRST_TIMEOUT = 4 * 3600.0
_POLL_START, _POLL_MAX = 0.005, 0.25
_KEY_PREFIX = "ddpdoctor/"
_calls = itertools.count()  # every rank enters zero_first/barrier in the same order, so keys match

F = TypeVar("F", bound=Callable[..., Any])


class ZeroFirstError(DdpdoctorError):
    """The first rank of :func:`zero_first` raised or never finished; the block was not run here."""


class BarrierTimeoutError(DdpdoctorError):
    """Not every rank reached :func:`barrier` within its timeout."""


def _store() -> dist.Store:
    return dist.distributed_c10d._get_default_store()


def _poll(store: dist.Store, key: str, ready: Callable[[], bool], timeout: float) -> bool:
    """Poll ``ready()`` with growing sleeps (at most ``_POLL_MAX``) until true or ``timeout``."""
    deadline = time.monotonic() + timeout
    delay = _POLL_START
    while True:
        if ready():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, _POLL_MAX)


def barrier(timeout: Optional[float] = None) -> None:
    """Wait until every rank gets here. A no-op when not distributed.

    Without ``timeout`` this is the process group's barrier (on NCCL on this rank's own GPU, not
    GPU 0). With ``timeout`` (seconds) it waits through the store instead, and raises on every
    rank that arrived when the others did not come in time.

    Raises:
        NotInitializedError: several processes were launched but no process group exists.
        BarrierTimeoutError: with ``timeout``, naming how many ranks arrived.
    """
    if not require_process_group("barrier()"):
        return
    if timeout is None:
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[rank_device().index])
        else:
            dist.barrier()
        return
    if timeout <= 0:
        raise ValueError(f"barrier(timeout={timeout!r}): give a positive number of seconds, or None")
    store, world = _store(), get_world_size()
    key = f"{_KEY_PREFIX}barrier/{next(_calls)}"
    store.add(key, 1)
    arrived = [0]

    def ready() -> bool:
        arrived[0] = store.add(key, 0)
        return arrived[0] >= world

    if not _poll(store, key, ready, timeout):
        raise BarrierTimeoutError(
            "barrier-timeout",
            f"only {arrived[0]} of {world} ranks reached barrier() within {timeout:g}s (rank {get_rank()} did)",
            "find the rank that is stuck or took another code path (py-spy dump, ddpdoctor hang report)",
        )


#: accelerate's and detectron2's names.
wait_for_everyone = barrier
synchronize = barrier


@contextlib.contextmanager
def zero_first(local: bool = False, timeout: float = ZERO_FIRST_TIMEOUT) -> Iterator[None]:
    """Rank 0 runs the block first; the other ranks wait, then run it (downloads, caches, preprocessing).

    With ``local=True`` local rank 0 of each node goes first and only its node waits for it.
    The wait polls the process group's store with its own ``timeout``, so it is not cut short by
    the process group's timeout. When the first rank raises inside the block, it re-raises its own
    exception and every waiting rank raises :class:`ZeroFirstError` within a second instead of
    running the block again or hanging.

    Args:
        local: let each node's local rank 0 go first instead of global rank 0.
        timeout: seconds the others wait for the first rank (default 4 hours).

    Raises:
        NotInitializedError: several processes were launched but no process group exists.
        ZeroFirstError: on the waiting ranks, when the first rank raised or did not finish in time.
    """
    if not timeout > 0:
        raise ValueError(f"zero_first(timeout={timeout!r}): give a positive number of seconds")
    if not require_process_group("zero_first()"):
        yield
        return
    store = _store()
    call = next(_calls)
    if local:
        first, scope = get_local_rank() == 0, f"node {get_node_rank()} (local rank 0)"
        key = f"{_KEY_PREFIX}zero_first/{call}/node{get_node_rank()}"
    else:
        first, scope = get_rank() == 0, "rank 0"
        key = f"{_KEY_PREFIX}zero_first/{call}/global"
    if first:
        try:
            yield
        except BaseException as exc:
            store.set(key, f"error:{type(exc).__name__}: {exc}")
            raise
        store.set(key, "ok")
        return
    if not _poll(store, key, lambda: store.check([key]), timeout):
        raise ZeroFirstError(
            "zero-first-timeout",
            f"{scope} did not finish its zero_first block within {timeout:g}s; rank {get_rank()} did not run it",
            "pass a longer zero_first(timeout=...) or find out why the first rank is stuck",
        )
    outcome = store.get(key).decode()
    if outcome != "ok":
        raise ZeroFirstError(
            "zero-first-failed",
            f"{scope} raised inside zero_first ({outcome.partition(':')[2]}); rank {get_rank()} did not run the block",
            "fix the error shown in the first rank's traceback",
        )
    yield


#: accelerate's, Lightning's and YOLOv5's names (YOLOv5's torch_distributed_zero_first takes the local rank).
main_process_first = zero_first
rank_zero_first = zero_first


def rank_zero_only(fn: Optional[F] = None, *, default: Any = None) -> Any:
    """Decorator: run ``fn`` on global rank 0 only; other ranks return ``default`` without calling it.

    The rank is read at each call, so decorating at import time (before the launcher or the
    process group is known) is safe. Use as ``@rank_zero_only`` or ``@rank_zero_only(default=x)``.
    """
    if fn is None:
        return functools.partial(rank_zero_only, default=default)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if get_rank() == 0:
            return fn(*args, **kwargs)
        return default

    return wrapper


def print0(*args: Any, **kwargs: Any) -> None:
    """``print`` on global rank 0 only, so a message appears once per job (flushed right away)."""
    if get_rank() == 0:
        kwargs.setdefault("flush", True)
        builtins.print(*args, **kwargs)


rank_zero_print = print0


def seed_everything(seed: int, *, per_rank: bool = False) -> int:
    """Seed Python's ``random``, NumPy (when installed) and torch (CPU and every CUDA device, lazily).

    Args:
        seed: a whole number in ``[0, 2**32 - 1]``.
        per_rank: add the global rank to ``seed``, for data augmentation that must differ per rank;
            leave False for model initialization that must match on every rank.

    Returns:
        The seed actually used on this rank.

    Raises:
        ValueError: ``seed`` (plus the rank) is not a whole number in range.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed_everything(seed={seed!r}): give a whole number in [0, 2**32 - 1]")
    used = seed + (get_rank() if per_rank else 0)
    if not 0 <= used <= 2**32 - 1:
        raise ValueError(f"seed_everything: seed {used} (seed={seed}, per_rank={per_rank}) is outside "
                         f"[0, 2**32 - 1]; pick a smaller seed")
    random.seed(used)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(used)
    torch.manual_seed(used)  # also seeds CUDA lazily, without initializing it
    logger.debug("seeded random, numpy and torch with %s on rank %s", used, get_rank())
    return used


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Return ``src``'s picklable ``obj`` on every rank (``obj`` itself in a world of one).

    Raises:
        ValueError: ``src`` is not a rank of this job.
        NotInitializedError: several processes were launched but no process group exists.
    """
    world = get_world_size()
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < world:
        raise ValueError(f"broadcast_object(src={src!r}): the world has ranks 0 to {world - 1}")
    if not require_process_group("broadcast_object()"):
        return obj
    # torch's broadcast_object_list needs numpy, which a CPU torch wheel does not install.
    from ddpdoctor.dist.gathering import gather_object

    return gather_object(obj if get_rank() == src else None)[src]

