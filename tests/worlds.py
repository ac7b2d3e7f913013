"""Real torch.distributed worlds for tests: fork N ranks, run a function on each, collect results.

Each rank is a forked child with a gloo process group over a FileStore (no ports). Results and
exceptions come back pickled through a pipe. Every world has a hard deadline: on expiry the ranks
that have not finished dump their Python stacks (faulthandler) into the error, then all are killed.
No child outlives the call.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import pickle
import shutil
import signal
import tempfile
import time
import traceback
from typing import Any, Callable, Optional

__all__ = ["run_world", "WorldError"]


class WorldError(AssertionError):
    """A rank raised, died or hung; the message holds every rank's story."""


def _child(rank: int, world_size: int, fn: Callable[..., Any], args: tuple, store_path: str,
           wfd: int, stack_path: str, backend: Optional[str], env: dict) -> None:
    code = 0
    try:
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size),
                           "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size)})
        os.environ.update(env)
        stack_file = open(stack_path, "w")
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # A forked child inherits the parent's OpenMP thread pool in a broken state: once the parent
        # has run a parallel op, the child's first one hangs. One intra-op thread per rank avoids it.
        import torch

        torch.set_num_threads(1)
        if backend:
            import torch.distributed as dist

            store = dist.FileStore(store_path, world_size)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=60))
            # gloo may still be connecting its full mesh when init returns: a rank whose fn returns
            # at once would exit and break its peers' connections ("Connection closed by peer").
            dist.barrier()
        try:
            payload = ("ok", fn(rank, world_size, *args))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the test
            payload = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", exc)
        try:
            data = pickle.dumps(payload)
        except Exception:
            data = pickle.dumps((payload[0], payload[1] if payload[0] == "error" else repr(payload[1])))
        with os.fdopen(wfd, "wb") as w:
            w.write(data)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def run_world(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 60.0,
              backend: Optional[str] = "gloo", env: Optional[dict] = None,
              expect_errors: bool = False) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` forked ranks; return results by rank.

    Args:
        fn: module-level or closure; runs in the child after ``init_process_group`` (unless
            ``backend`` is None, for tests of code that runs before or without a group).
        timeout: hard deadline for the whole world, in seconds.
        env: extra environment variables for every rank.
        expect_errors: return ``("error", text, exc)`` tuples instead of raising when ranks raise.

    Raises:
        WorldError: a rank raised (unless ``expect_errors``), died, or the deadline passed.
    """
    tmp = tempfile.mkdtemp(prefix="ddpdoctor-world-")
    store_path = os.path.join(tmp, "store")
    children: list[tuple[int, int, int, str]] = []  # pid, read fd, rank, stack path
    for rank in range(world_size):
        r, w = os.pipe()
        stack_path = os.path.join(tmp, f"stack{rank}")
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(rank, world_size, fn, args, store_path, w, stack_path, backend, dict(env or {}))
        os.close(w)
        os.set_blocking(r, False)
        children.append((pid, r, rank, stack_path))

    buffers = {rank: b"" for _, _, rank, _ in children}
    status: dict[int, Optional[int]] = {rank: None for _, _, rank, _ in children}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and any(v is None for v in status.values()):
            for pid, r, rank, _ in children:
                _drain(r, buffers, rank)
                if status[rank] is None:
                    done, st = os.waitpid(pid, os.WNOHANG)
                    if done:
                        _drain(r, buffers, rank)
                        status[rank] = st
            time.sleep(0.01)
        hung = [rank for rank, st in status.items() if st is None]
        stacks = {}
        if hung:
            for pid, _, rank, _ in children:
                if rank in hung:
                    os.kill(pid, signal.SIGUSR1)
            time.sleep(0.5)
            for _, _, rank, path in children:
                if rank in hung:
                    with open(path) as f:
                        stacks[rank] = f.read()
    finally:
        for pid, r, rank, _ in children:
            if status[rank] is None:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
            os.close(r)
        shutil.rmtree(tmp, ignore_errors=True)
    if hung:
        raise WorldError("ranks %s hung past %.0fs:\n%s" % (hung, timeout, "\n".join(
            f"--- rank {k} ---\n{v}" for k, v in stacks.items())))
    results: list[Any] = []
    problems: list[str] = []
    for rank in range(world_size):
        if not buffers[rank]:
            st = status[rank] or 0
            how = f"signal {os.WTERMSIG(st)}" if os.WIFSIGNALED(st) else f"exit code {os.WEXITSTATUS(st)}"
            problems.append(f"rank {rank} died ({how}) without a result")
            results.append(None)
            continue
        payload = pickle.loads(buffers[rank])
        if payload[0] == "error" and not expect_errors:
            problems.append(f"rank {rank} raised {payload[1]}")
        results.append(payload[1] if payload[0] == "ok" else payload)
    if problems:
        raise WorldError("\n".join(problems))
    return results


def _drain(fd: int, buffers: dict, rank: int) -> None:
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            return
        buffers[rank] += chunk
