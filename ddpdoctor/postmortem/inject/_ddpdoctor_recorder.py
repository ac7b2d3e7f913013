"""Loaded by ddpdoctor's injected hook (``sitecustomize.py`` beside it) once torch.distributed is imported:
for a Flight Recorder dump on a request from ``ddpdoctor run`` or ``ddpdoctor stacks`` (the file
``fr-request`` in the run directory changed), or when the rank fails (an uncaught exception, a non-zero
exit); and for the collectives' progress (:func:`progress`, ``frprog-<pid>.json``) that ``run``'s hang
detector reads.

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
    rank = int(dist.get_rank())
    return rank, _dumper(dist)(True, bool(stacks), False)


def _backend(dist):
    """The default process group's backend (``gloo``, ``nccl``, ``cpu:gloo,cuda:nccl``...), "" unknown."""
    try:
        return str(dist.get_backend())
    except Exception:  # noqa: BLE001 - a group being torn down
        return ""


def _dumper(dist):
    """torch's dump function for this job's recorder: ``_dump_nccl_trace`` where the group runs NCCL and
    torch has it (NCCL's recorder was a singleton of its own before torch routed every backend through
    the generic one), else ``_dump_fr_trace`` (gloo, and every backend in newer torch)."""
    c10d = sys.modules.get("torch._C._distributed_c10d")
    names = ("_dump_nccl_trace", "_dump_fr_trace") if "nccl" in _backend(dist) else ("_dump_fr_trace",)
    for name in names:
        dump = getattr(c10d, name, None)
        if dump is not None:
            return dump
    version = getattr(sys.modules.get("torch"), "__version__", "?")
    raise _Unavailable(f"torch {version} has no Flight Recorder dump for this backend ({', '.join(names)})")


def progress(run_dir):
    """Write this rank's collective progress to ``frprog-<pid>.json``: the backend, the recorder's
    ``pg_status`` and, except on gloo (whose entries stay ``scheduled`` after they complete), its active
    entries without stacks (``onlyActive``: those not seen complete), reduced to the keys
    ``ddpdoctor.postmortem.collective_progress`` reads. Microseconds (3 us on gloo, torch 2.13). Called by
    the hook's recorder thread at a bounded rate; returns False (writes nothing) without a process group
    or a recorder, never raises."""
    try:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not (dist.is_available() and dist.is_initialized()):
            return False
        import pickle

        backend = _backend(dist)
        gloo = backend == "gloo"
        doc = pickle.loads(_dumper(dist)(not gloo, False, True))  # torch's own bytes, from this process
        keep = ("pg_id", "collective_seq_id", "state", "retired", "is_p2p")
        entries = [{k: e.get(k) for k in keep} for e in doc.get("entries") or [] if isinstance(e, dict)]
        reading = {"backend": "nccl" if "nccl" in backend else backend, "t": time.time(),
                   "pg_status": doc.get("pg_status") or {}, "entries": entries}
        _write(os.path.join(run_dir, f"frprog-{os.getpid()}.json"), json.dumps(reading), "w")
        return True
    except Exception:  # noqa: BLE001 - never break the job: run then counts CPU time as before
        return False


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
        record = {"pid": pid, "why": why, "token": token, "stage": stage, "t": time.time(),
                  "torch": str(getattr(sys.modules.get("torch"), "__version__", ""))}
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
