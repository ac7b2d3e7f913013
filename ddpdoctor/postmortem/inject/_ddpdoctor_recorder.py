"""Loaded by ddpdoctor's injected hook (``sitecustomize.py`` beside it) only when a Flight Recorder dump
is wanted: on a request from ``ddpdoctor run`` or ``ddpdoctor stacks`` (the file ``fr-request`` in the
run directory changed), or when the rank fails (an uncaught exception, a non-zero exit).

It writes this rank's Flight Recorder dump (``torch._C._distributed_c10d._dump_fr_trace``: every recorded
collective with the Python stack that issued it) to ``$DDPDOCTOR_RUN_DIR/flight-recorder-rank<N>``,
through a temporary name and a rename, so a reader never sees half a file, and records the outcome in
``frdump-<pid>.json`` (the request it answers, or why it was written, and the error when it could not
dump: no process group yet, a torch without the recorder). It imports nothing: torch is used only when
the job already imported it. It never raises: a failure here must not break the user's job.
"""

import json
import os
import sys
import time

PREFIX = "flight-recorder-rank"


class _Unavailable(Exception):
    """The recorder cannot be dumped in this process (no process group, a torch without it)."""


def _trace(stacks):
    """(rank, the dump's bytes) of this process's Flight Recorder; ``stacks``: with the Python stack that
    issued each collective."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        raise _Unavailable("torch.distributed is not imported")
    if not (dist.is_available() and dist.is_initialized()):
        raise _Unavailable("no process group (init_process_group not called, or destroyed)")
    c10d = sys.modules.get("torch._C._distributed_c10d")
    dump = getattr(c10d, "_dump_fr_trace", None)
    if dump is None:
        version = getattr(sys.modules.get("torch"), "__version__", "?")
        raise _Unavailable(f"torch {version} has no Flight Recorder dump for this backend (_dump_fr_trace)")
    rank = int(dist.get_rank())
    return rank, dump(True, bool(stacks), False)


def _write(path, data, mode="wb"):
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, mode) as f:
        f.write(data)
    os.replace(tmp, path)


def dump(run_dir, why, token="", stages=("quick", "full")):
    """Write this rank's dump into ``run_dir`` and the outcome into ``frdump-<pid>.json``; never raises.

    In ``stages``: ``quick``, without the Python stacks (under a millisecond), then ``full``, with them,
    replacing the first. torch 2.13 takes about 5 s to symbolize the stacks (measured on gloo, with or
    without a collective in flight; the GIL stays free meanwhile, so the job is not stalled): whoever
    asked reads the quick one if the full one is late. The hook runs the two stages on two threads, so a
    full dump in progress never delays the quick answer to the next request.

    Args:
        run_dir: the run directory.
        why: ``request`` (then ``token`` names the request), ``raised`` or ``exit``.
    """
    pid = os.getpid()
    record = {}
    for stage in stages:
        started = time.monotonic()
        record = {"pid": pid, "why": why, "token": token, "stage": stage, "t": time.time()}
        try:
            rank, data = _trace(stage == "full")
            record["rank"] = rank
            name = f"{PREFIX}{rank}"
            _write(os.path.join(run_dir, name), data)
            record["file"], record["bytes"] = name, len(data)
        except _Unavailable as exc:
            record["error"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - never break the job: the error is the record
            record["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        record["took"] = round(time.monotonic() - started, 4)
        try:
            _write(os.path.join(run_dir, f"frdump-{pid}.json"), json.dumps(record), "w")
        except Exception:  # noqa: BLE001 - a full disk: run says the rank did not answer
            pass
        if "error" in record:
            break
    return record
