"""Make ranks wait for each other, take turns, or stay quiet; without deadlocks and on every backend.

Every helper here is a no-op (or the obvious single-process answer) in a world of one.
:func:`zero_first` waits through the process group's store with its own timeout, not through a
collective, so an hour-long download on rank 0 does not hit the process group's timeout, and an
exception on rank 0 reaches the waiting ranks within a second.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime
import functools
import logging
import math
import numbers
import os
import random
import time
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch
import torch.distributed as dist

from ddpdoctor.training.agreement import DEFAULT_TIMEOUT, check_timeout, group_ranks, group_state
from ddpdoctor.training.gathering import broadcast_object
from ddpdoctor.training.ranks import (get_local_rank, get_local_world_size, get_node_rank, get_rank, get_world_size,
                                  is_rank_zero, require_process_group)
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
    "worker_init_fn",
]

logger = logging.getLogger(__name__)

#: How long :func:`zero_first` waits for the first rank by default: long enough for a dataset download.
ZERO_FIRST_TIMEOUT = 4 * 3600.0
_POLL_START, _POLL_MAX = 0.005, 0.25
_KEY_PREFIX = "ddpdoctor/"
_POISON = 1 << 32  # added to a barrier's count by each rank that gave up on it

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


def _next_call(group: Any, kind: str) -> int:
    """This group's count of ``kind`` calls: every rank makes them in the same order, so keys match."""
    extra = group_state(group).extra
    n = extra.get(kind, 0)
    extra[kind] = n + 1
    return n


def barrier(timeout: Optional[float] = DEFAULT_TIMEOUT, *, group: Any = None) -> None:
    """Wait until every rank of the group gets here. A no-op when not distributed.

    Waits through the process group's store, with its own ``timeout`` (seconds, default
    :data:`DEFAULT_TIMEOUT`, 600; None means the same), so a timeout leaves no collective pending
    and the process group stays usable. The ranks that waited raise :class:`BarrierTimeoutError`
    when some rank does not come in time; a rank that arrives after they gave up raises it too,
    instead of passing a barrier nobody else is at.

    Raises:
        NotInitializedError: several processes were launched but no process group exists.
        BarrierTimeoutError: naming how many ranks arrived.
    """
    timeout = check_timeout("barrier()", DEFAULT_TIMEOUT if timeout is None else timeout)
    if not require_process_group("barrier()"):
        return
    ranks = group_ranks(group)
    world = len(ranks)
    if world == 1:
        return
    store = _store()
    key = f"{_KEY_PREFIX}barrier/{'-'.join(map(str, ranks))}/{_next_call(group, 'barrier')}"
    count = store.add(key, 1)
    if count >= _POISON:
        raise BarrierTimeoutError(
            "barrier-timeout",
            f"only {count % _POISON - 1} of {world} ranks reached barrier() within the others' timeout; rank "
            f"{get_rank()} arrived after they gave up",
            "find what delayed this rank; the others have moved on (their barrier raised)")
    if count == world:
        store.set(key + "/go", "1")
        return
    try:
        store.wait([key + "/go"], datetime.timedelta(seconds=timeout))
    except RuntimeError:
        count = store.add(key, _POISON)
        if count % _POISON >= world:  # the last rank came just before we gave up: everyone passes
            return
        raise BarrierTimeoutError(
            "barrier-timeout",
            f"only {count % _POISON} of {world} ranks reached barrier() within {timeout:g}s (rank {get_rank()} did)",
            "find the rank that is stuck or took another code path (py-spy dump, ddpdoctor hang report)",
        ) from None


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
    call = _next_call(None, "zero_first")
    if local:
        first, scope = get_local_rank() == 0, f"node {get_node_rank()} (local rank 0)"
        key = f"{_KEY_PREFIX}zero_first/{call}/node{get_node_rank()}"
        waiters = get_local_world_size() - 1
    else:
        first, scope = get_rank() == 0, "rank 0"
        key = f"{_KEY_PREFIX}zero_first/{call}/global"
        waiters = get_world_size() - 1
    if first:
        try:
            yield
        except BaseException as exc:
            store.set(key, f"error:{type(exc).__name__}: {exc}")
            _await_readers(store, key, waiters, min(timeout, 60.0), scope)
            raise
        store.set(key, "ok")
        # Stay until every waiting rank has read the outcome: the store may live in this process
        # (TCPStore on rank 0), and leaving at once would cut the others off mid-poll.
        if not _await_readers(store, key, waiters, timeout, scope):
            raise ZeroFirstError(
                "zero-first-timeout",
                f"{scope} finished its zero_first block but not every waiting rank came for the outcome within "
                f"{timeout:g}s", "find the rank that never reached zero_first (it is stuck or took another path)")
        return
    if not _poll(store, key, lambda: store.check([key]), timeout):
        raise ZeroFirstError(
            "zero-first-timeout",
            f"{scope} did not finish its zero_first block within {timeout:g}s; rank {get_rank()} did not run it",
            "pass a longer zero_first(timeout=...) or find out why the first rank is stuck",
        )
    outcome = store.get(key).decode()
    if store.add(key + "/read", 1) == waiters:
        store.set(key + "/done", "1")
    if outcome != "ok":
        raise ZeroFirstError(
            "zero-first-failed",
            f"{scope} raised inside zero_first ({outcome.partition(':')[2]}); rank {get_rank()} did not run the block",
            "fix the error shown in the first rank's traceback",
        )
    yield


def _await_readers(store: dist.Store, key: str, waiters: int, timeout: float, scope: str) -> bool:
    """True once every waiting rank has read ``key``'s outcome; False after ``timeout``."""
    if waiters <= 0:
        return True
    try:
        store.wait([key + "/done"], datetime.timedelta(seconds=timeout))
    except RuntimeError:
        logger.warning("zero_first: %s waited %gs for the other ranks to read its outcome", scope, timeout)
        return False
    return True


#: accelerate's, Lightning's and YOLOv5's names (YOLOv5's torch_distributed_zero_first takes the local rank).
main_process_first = zero_first
rank_zero_first = zero_first


def rank_zero_only(fn: Optional[F] = None, *, default: Any = None) -> Any:
    """Decorator: run ``fn`` on global rank 0 only; other ranks return ``default`` without calling it.

    The rank is read at each call, so decorating at import time (before the launcher or the
    process group is known) is safe. Use as ``@rank_zero_only`` or ``@rank_zero_only(default=x)``.
    "Rank 0" is :func:`~ddpdoctor.training.ranks.is_rank_zero`'s rule: every rank variable that is
    set, and the process group once it exists, must say 0 (``RANK=1`` alone does not run ``fn``).
    """
    if fn is None:
        return functools.partial(rank_zero_only, default=default)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if is_rank_zero():
            return fn(*args, **kwargs)
        return default

    return wrapper


def print0(*args: Any, **kwargs: Any) -> None:
    """``print`` on global rank 0 only (:func:`rank_zero_only`'s rule), once per job, flushed right away."""
    if is_rank_zero():
        kwargs.setdefault("flush", True)
        builtins.print(*args, **kwargs)


rank_zero_print = print0


_SEED_ENV = "PL_GLOBAL_SEED"  # Lightning's variable: set by its users, read by its DataLoader workers
_WORKERS_ENV = "PL_SEED_WORKERS"


def _whole_seed(value: Any, source: str) -> int:
    """``value`` as an int when it is a whole number (7, numpy.int64(7), 45.0, "45"); else ValueError."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                value = None
    if isinstance(value, bool) or value is None:
        ok = False
    elif isinstance(value, numbers.Integral):
        ok, value = True, int(value)
    elif isinstance(value, numbers.Real) and math.isfinite(float(value)) and float(value).is_integer():
        ok, value = True, int(float(value))
    elif isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        ok, value = True, int(value.item())
    else:
        ok = False
    if not ok:
        raise ValueError(f"seed_everything: {source} is not a whole number; give one in [0, 2**32 - 1]")
    return value


def seed_everything(seed: Any = None, *, per_rank: bool = False, workers: bool = False,
                    timeout: float = DEFAULT_TIMEOUT) -> int:
    """Seed Python's ``random``, NumPy (when installed) and torch (CPU and every CUDA device, lazily).

    Follows Lightning's ``seed_everything``: without ``seed`` the environment variable
    ``PL_GLOBAL_SEED`` is used when set; otherwise rank 0 picks a seed and broadcasts it, so every
    rank gets the same one. The seed is written to ``PL_GLOBAL_SEED`` for subprocesses and workers.

    Args:
        seed: any whole number in ``[0, 2**32 - 1]``: an int, a NumPy integer, ``45.0`` (not ``45.5``).
        per_rank: add the global rank to ``seed``, for data augmentation that must differ per rank;
            leave False for model initialization that must match on every rank.
        workers: also set ``PL_SEED_WORKERS=1``; pass :func:`worker_init_fn` to your DataLoader.
        timeout: for the broadcast of a picked seed.

    Returns:
        The seed actually used on this rank.

    Raises:
        ValueError: ``seed`` (plus the rank) is not a whole number in range.
    """
    if seed is None:
        if os.environ.get(_SEED_ENV, "").strip():
            seed = _whole_seed(os.environ[_SEED_ENV], f"{_SEED_ENV}={os.environ[_SEED_ENV]!r}")
        else:
            picked = random.SystemRandom().randrange(0, 2**31)
            seed = broadcast_object(picked, 0, timeout=timeout) if require_process_group("seed_everything()") else picked
            logger.info("seed_everything: no seed given, using %s (from rank 0)", seed)
    else:
        seed = _whole_seed(seed, f"seed={seed!r}")
    used = seed + (get_rank() if per_rank else 0)
    if not 0 <= used <= 2**32 - 1:
        raise ValueError(f"seed_everything: seed {used} (seed={seed}, per_rank={per_rank}) is outside "
                         f"[0, 2**32 - 1]; pick a smaller seed")
    os.environ[_SEED_ENV] = str(seed)
    if workers:
        os.environ[_WORKERS_ENV] = "1"
    _seed_all(used)
    logger.debug("seeded random, numpy and torch with %s on rank %s", used, get_rank())
    return used


def _seed_all(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds CUDA lazily, without initializing it


def worker_init_fn(worker_id: int) -> None:
    """``DataLoader(worker_init_fn=worker_init_fn)``: a distinct seed per worker and per rank.

    Lightning's ``pl_worker_init_function``: derived from the worker's torch seed (which the
    DataLoader draws from the seeded main process) and the global rank, then applied to ``random``,
    NumPy and torch, so workers of different ranks never produce the same augmentations.
    """
    seed = (torch.initial_seed() + 1_000_003 * get_rank() + 7919 * worker_id) % 2**32
    _seed_all(seed)
