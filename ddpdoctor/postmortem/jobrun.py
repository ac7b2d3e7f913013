"""``ddpdoctor run``: run a training command unchanged, watch its ranks, explain a hang or a death.

Job states (the state machine of :func:`run_job`)::

    RUNNING --launcher exits 0, no rank died-->   OK        (one summary line; the run directory is removed
                                                             unless --keep)
    RUNNING --launcher exits non-zero-->          FAILED    (verdict: the rank that failed first and its words,
                                                             where the others were, the launcher's own
                                                             traceback summarised; exit with the job's code)
    RUNNING --a rank died, the others idle
              for DEATH_GRACE s-->                FAILED    (the same verdict; the job is stopped; exit 1)
    RUNNING --no progress for hang_timeout/3-->   RUNNING   (one line: the silence, when the verdict comes, the
                                                             stacks command; once per silence, once a minute
                                                             at most)
    RUNNING --no progress for hang_timeout-->     HUNG      (grouped stacks + explain, saved; then stop,
                                                             exit 124; with keep_hung: keep waiting)
    RUNNING --SIGINT/SIGTERM to us-->             INTERRUPTED (every live rank's stack read, stack_wait s at
                                                             most; the signal passed to the launcher's process
                                                             group; stop_grace s for the job to end, then it is
                                                             stopped; verdict with the stacks; exit 130, or 0
                                                             when the job exited 0 by itself. A second signal:
                                                             SIGKILL to the whole job at once, then the verdict)

Wherever stacks are read (a hang, a death, an interrupt), the live ranks are asked for their Flight
Recorder dumps at the same time; the verdict leads with what they say (the divergent collective by
number, the ranks on each side and their lines, the ranks with no dump), nothing when no rank could
dump. Every verdict is printed once the job's output has ended (after the launcher's own closing traceback),
so that it is the last thing on screen; a hang or a stranded rank is announced in one line when found.
With keep_hung the hang's verdict is printed at once (the job goes on). The run directory and its
marker are :mod:`ddpdoctor.postmortem.rundir`; the output's pass-through and raw log,
:mod:`ddpdoctor.postmortem.output`.

What is added to the job (and nothing else): a ``sitecustomize.py`` on ``PYTHONPATH`` (see
:mod:`ddpdoctor.postmortem.inject.sitecustomize`: in each rank, faulthandler on SIGUSR2, a heartbeat of
where the main thread is, the rank number, how the process ended, a thread that dumps the Flight
Recorder when asked: :mod:`ddpdoctor.postmortem.recorder`), ``DDPDOCTOR_RUN_*`` variables, and
PyTorch's own NCCL timeout diagnostics (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``: the Flight Recorder writes
its trace into the run directory) unless the user set them.

Ranks are the processes the hook registers: those with ``RANK`` (torchrun, srun, mpirun,
``torch.distributed.launch``) and the ``multiprocessing`` children of the launched command
(``mp.spawn``), named by their process-group rank (or ``mp.spawn``'s index before
``init_process_group``). Progress, per rank: its main thread moved since the last look, its CPU time
grew (it and its children: DataLoader workers; at least ``CPU_MIN_S`` and 1% of a core since the last
credited growth, so a busy rank on a crowded machine counts and a waiting one does not; and not while
its main thread stays put inside a collective that the Flight Recorder shows entered and not completed,
none completed since: NCCL's spin in a CUDA synchronisation,
:mod:`ddpdoctor.postmortem.collective_progress`), a collective of it completed (the recorder's
``pg_status``, which the hook writes to ``frprog-<pid>.json`` at most twice a second), it read or wrote
bytes (a rank reading a slow file is busy, not hung; torch's own timeout dumps, ``torch-dump-rank<N>``,
are not the job's I/O), or the job wrote output. The launcher and ``mp.spawn``'s parent only wait, so
they are watched only while no rank is alive. Hung: no rank made progress for ``hang_timeout`` seconds.

A healthy job is never signalled. Stack requests go only to live ranks whose handler is installed
(checked in ``/proc/<pid>/status`` right before the signal); a rank that exits ignores the signal from
its ``atexit`` on. A job is stopped only after a verdict, or when the user's Ctrl-C/SIGTERM left parts
of it running: SIGTERM to the launcher's group and every process of the job (every process below the
watchdog, which starts the launcher and is the job's child subreaper, and any process carrying the
``DDPDOCTOR_RUN_ID`` in its environment), a deadline, then SIGKILL. If ``ddpdoctor run`` itself is
killed, :mod:`ddpdoctor.postmortem.watchdog` ends the job. What counts as a rank's work, less
ddpdoctor's own inside it: :mod:`ddpdoctor.postmortem.progress`.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import IO, Optional

from ddpdoctor.exitcodes import ExitCode
from ddpdoctor.postmortem.collective_progress import CollectiveState, completed_since, read_reading, waiting
from ddpdoctor.postmortem.output import OutputCopy
from ddpdoctor.postmortem.rundir import RunDir, default_runs_root, prepare_run_dir
from ddpdoctor.postmortem.rundir import write_private as _write_private
from ddpdoctor.postmortem.jobproc import Launched, launch
from ddpdoctor.postmortem.straggle import StragglerWatch
from ddpdoctor.postmortem.watches import Watches, watch_env, window_from_env
from ddpdoctor.system import redact
from ddpdoctor.system.redact import safe_data, safe_text, shorten_middle
from ddpdoctor.system.stackframes import shown_where, user_place

__all__ = ["RunSpec", "run_job", "job_env", "default_runs_root", "RAW_LOG", "DEATH_GRACE"]

POLL = 0.2
CPU_BUSY = 0.01  # CPU growth (core-seconds per second, since the last credited growth) that counts as progress
CPU_MIN_S = 0.03  # ... and at least this many CPU seconds: a rank waiting in a collective uses ~0, while a
#                   busy rank on a crowded machine (a fraction of a core) still adds this in well under a second
DEATH_GRACE = 5.0  # seconds the others may sit idle after a rank died before the verdict (capped by hang_timeout)
RAW_LOG = "output.raw.log"  # the job's bytes as written, unredacted: mode 0600
TORCH_DUMP = "torch-dump-rank"  # where torch writes its own Flight Recorder dumps (NCCL's, on a timeout)
QUIET_SHARE = 1 / 3  # a silence this share of --hang-timeout long is announced (the verdict may be minutes away)
QUIET_REPEAT = 60.0  # ... at most once per this many seconds, and once per silence


@dataclass
class RunSpec:
    """What ``ddpdoctor run`` was asked to do.

    Args:
        command: the launcher and training command, unchanged.
        hang_timeout: seconds without progress on any rank before the job counts as hung.
        run_dir: where output, stacks and the verdict go (default: a new directory under
            :func:`default_runs_root`).
        keep: keep the run directory even when the job succeeded.
        keep_hung: report a hang but leave the job running.
        stop_grace: seconds between SIGTERM and SIGKILL when stopping a job.
        straggler_window, straggler_windows: the straggler score's window (seconds) and how many
            windows in a row a rank must score low to be named.
        no_watch: the watches for silent bugs to turn off (:data:`ddpdoctor.postmortem.watches.WATCHES`).
        html: also write ``report.html`` to this path (checked before the job starts: ``--json``'s rules).
    """

    command: list
    hang_timeout: float = 300.0
    run_dir: Optional[str] = None
    keep: bool = False
    keep_hung: bool = False
    stop_grace: float = 10.0
    stack_wait: float = 3.0
    straggler_window: float = 60.0
    straggler_windows: int = 3
    no_watch: tuple = ()
    html: Optional[str] = None
    err: IO = field(default_factory=lambda: sys.stderr)


def job_env(run_dir: str, inject_dir: str, base: dict, run_id: str = "") -> dict:
    """The job's environment: the user's, plus the handler on PYTHONPATH and PyTorch's own aids."""
    env = dict(base)
    env["PYTHONPATH"] = inject_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["DDPDOCTOR_RUN_DIR"] = run_dir
    env["DDPDOCTOR_RUN_PID"] = str(os.getpid())  # the launched command's parent: the watchdog puts its own
    env["DDPDOCTOR_RUN_ID"] = run_id or uuid.uuid4().hex
    env["DDPDOCTOR_REDACT_PY"] = os.path.abspath(redact.__file__)  # the hook redacts proc-<pid>.json with it
    env.pop("DDPDOCTOR_RANK_MARK", None)
    env.setdefault("DDPDOCTOR_STACK_SIGNAL", "SIGUSR2")
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    if not (env.get("TORCH_FR_BUFFER_SIZE") or env.get("TORCH_NCCL_TRACE_BUFFER_SIZE")):
        # the Flight Recorder's ring buffer (renamed TORCH_FR_* in newer torch; the old name warns there)
        env["TORCH_FR_BUFFER_SIZE" if _torch_version() >= (2, 8) else "TORCH_NCCL_TRACE_BUFFER_SIZE"] = "2000"
    # torch's own dumps (NCCL's watchdog, on a timeout) under a name of their own: the hook's dumps
    # (flight-recorder-rank<N>) are renamed into place on request and would replace them, and run takes
    # the bytes of each out of the rank's I/O its own way (per thread for the hook's, by file for torch's)
    fr = os.path.join(run_dir, TORCH_DUMP)
    env.setdefault("TORCH_FR_DUMP_TEMP_FILE", fr)
    env.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", fr)
    return env


def _progress_period(env: dict) -> float:
    """Seconds between two of the hook's readings of the collectives' progress (its rule:
    ``_ddpdoctor_progress_period`` in the injected sitecustomize)."""
    try:
        return max(0.0, float(env["DDPDOCTOR_FR_PROGRESS_S"]))
    except (KeyError, ValueError):
        try:
            return max(0.5, float(env.get("DDPDOCTOR_BEAT_S", "1.0")))
        except ValueError:
            return 1.0


def _torch_version() -> tuple:
    """(major, minor) of the torch this interpreter would import, without importing it.

    Read from ``torch/version.py`` (found on the import path, not imported): importing torch would
    cost seconds, and ``importlib.metadata.version`` scans every installed distribution (0.1 s on a
    quiet machine, 0.5 s under load), all before the job starts. Metadata is the fallback.
    """
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
        for folder in (spec.submodule_search_locations or []) if spec else []:
            path = os.path.join(folder, "version.py")
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    m = re.search(r"^__version__\s*=\s*['\"](\d+)\.(\d+)", f.read(), re.MULTILINE)
                if m:
                    return int(m.group(1)), int(m.group(2))
    except (ImportError, ValueError, OSError):
        pass
    from importlib import metadata

    try:
        parts = metadata.version("torch").split("+")[0].split(".")
        return int(parts[0]), int(parts[1])
    except (metadata.PackageNotFoundError, ValueError, IndexError):
        return (0, 0)


# ---------------------------------------------------------------------------------------------------
# The ranks and their progress


@dataclass
class _Proc:
    pid: int
    role: str
    rank: Optional[int]
    index: Optional[int]
    beat_file: str
    info: dict
    beat: bytes = b""
    cpu: float = 0.0  # CPU seconds when growth was last credited as progress
    cpu_at: float = 0.0  # ... and when (monotonic)
    io: int = 0
    alive: bool = True
    end: Optional[dict] = None  # the hook's exit record (None: ended by a signal or os._exit)
    ended_at: float = 0.0
    collectives: Optional[CollectiveState] = None  # the recorder's last reading (collective_progress)
    torch_dump: tuple = ()  # (inode, mtime_ns, size) of torch's own timeout dump for this rank, when seen
    torch_dump_bytes: int = 0  # bytes torch wrote into it so far (not progress: see _Watch.sample)

    @property
    def label(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank}"
        if self.index is not None:
            return f"process {self.index}"
        return f"pid {self.pid}"

    @property
    def is_rank(self) -> bool:
        return self.role in ("rank", "spawn")

    def death(self) -> Optional[str]:
        """How this ended process failed, in words; None for a normal exit (code 0)."""
        e = self.end
        if e is None:
            return "ended without a Python exit (killed by a signal)"
        if e.get("how") == "raised":
            where = _raised_where(e)
            return f"raised {shorten_middle(str(e.get('exception', '')), 400)}" + (f" at {where}" if where else "")
        code = e.get("code")
        if code not in (0, None):
            return f"exited with code {code}"
        return None


def _raised_where(end: dict) -> str:
    """The user's line in a rank's exit record: the innermost frame that is neither a library's nor
    ddpdoctor's own (its timing wrappers wrap every collective); "" when none is."""
    frames = end.get("frames")
    if isinstance(frames, list):
        return user_place(f for f in frames if isinstance(f, list) and len(f) == 3)
    return shown_where(end["where"]) if isinstance(end.get("where"), str) else ""


class _Watch:
    """The job's processes (found through the hook's ``proc-<pid>.json``) and their progress.

    Args:
        run_dir: the run directory.
        torch_dump: the prefix torch writes its own timeout dumps to (``TORCH_FR_DUMP_TEMP_FILE``: with
            ``TORCH_NCCL_DUMP_ON_TIMEOUT``, NCCL's watchdog writes ``<prefix><rank>``); "" for none.
        progress_s: seconds between two of the hook's readings of the collectives' progress.
    """

    def __init__(self, run_dir: str, torch_dump: str = "", progress_s: float = 1.0) -> None:
        self.run_dir = run_dir
        self.torch_dump = torch_dump
        self.progress_s = progress_s
        self.started = time.time()
        self.procs: dict = {}
        self.deaths: list = []  # ranks that failed, in the order seen
        self.exits: list = []  # ranks that exited normally
        self.recorder_request = None  # the last Flight Recorder dump request (ddpdoctor.postmortem.recorder)
        self.marks: dict = {}  # pid -> Mark: where a rank hung or was interrupted (the timeline's red line)
        self.verdict_at: Optional[float] = None  # when the verdict was made (monotonic): deaths after it are ours
        self.cause_proc: Optional[_Proc] = None  # the rank the verdict named as failing first (see _verdict)
        self.verdict_doc: Optional[dict] = None  # verdict.json's content, for report.html
        self.verdict_lines: list = []

    def discover(self) -> None:
        for path in glob.glob(os.path.join(glob.escape(self.run_dir), "proc-*.json")):
            if not os.path.basename(path)[5:-5].isdigit():
                continue  # not the hook's (a file of the user's in a reused --dir)
            pid = int(os.path.basename(path)[5:-5])
            known = self.procs.get(pid)
            if known is not None and (known.rank is not None or not known.is_rank or not known.alive):
                continue
            try:
                with open(path) as f:
                    info = json.load(f)
            except (OSError, ValueError):
                continue
            if not isinstance(info, dict) or not isinstance(info.get("beat_file"), str):
                continue
            rank = info.get("rank")
            rank = int(rank) if isinstance(rank, int) or (isinstance(rank, str) and rank.isdigit()) else None
            index = info.get("index") if isinstance(info.get("index"), int) else None
            if known is not None:
                known.rank, known.index, known.info = rank, index, info
                continue
            role = info.get("role") or ("rank" if rank is not None else "top")
            p = _Proc(pid, role, rank, index, info["beat_file"], info)
            p.cpu, p.io = _usage(p)
            p.io -= self._torch_dump_bytes(p)
            p.cpu_at = time.monotonic()
            self.procs[pid] = p

    def ranks(self) -> list:
        return sorted((p for p in self.procs.values() if p.is_rank),
                      key=lambda p: (p.rank is None, p.rank if p.rank is not None else p.index or 0, p.pid))

    def live_ranks(self) -> list:
        return [p for p in self.ranks() if p.alive]

    def watched(self) -> list:
        """Live ranks; when none is alive (not started yet, or all ended), the launched command itself."""
        live = self.live_ranks()
        return live or [p for p in self.procs.values() if not p.is_rank and p.alive]

    def sample(self, dt: float) -> bool:
        """Look at every watched process once; True when one of them made progress."""
        moved = False
        for p in self.watched():
            if not _running(p.pid):
                self._ended(p)
                continue
            try:
                with open(p.beat_file, "rb") as f:
                    beat = f.read(13)
            except OSError:
                beat = p.beat
            cpu, io = _usage(p)
            io -= self._torch_dump_bytes(p)
            now = time.monotonic()
            busy = cpu - p.cpu >= max(CPU_MIN_S, CPU_BUSY * (now - p.cpu_at))
            # The recorder: a collective completed is progress; CPU time while the main thread stays put
            # and a collective waits to complete is not (NCCL spins in a CUDA synchronisation there).
            collectives = read_reading(self.run_dir, p.pid, self.progress_s) if p.is_rank else None
            completed = completed_since(p.collectives, collectives)
            spinning = busy and beat == p.beat and waiting(p.collectives, collectives)
            # past its atexit (the exit record is written): the interpreter is tearing down, not hung
            exiting = os.path.exists(os.path.join(self.run_dir, f"exit-{p.pid}.json"))
            if beat != p.beat or (busy and not spinning) or completed or io != p.io or exiting:
                moved = True
            if busy:
                p.cpu, p.cpu_at = cpu, now
            p.beat, p.io = beat, io
            if collectives is not None:  # a stale reading keeps the last fresh one to compare with
                p.collectives = collectives
        for p in self.ranks():  # ranks that ended while not watched (none are, while one lives)
            if p.alive and not _running(p.pid):
                self._ended(p)
        return moved

    def _ended(self, p: _Proc) -> None:
        p.alive = False
        p.ended_at = time.monotonic()
        try:
            with open(os.path.join(self.run_dir, f"exit-{p.pid}.json")) as f:
                p.end = json.load(f)
        except (OSError, ValueError):
            p.end = None
        if not p.is_rank:
            return
        (self.deaths if p.death() else self.exits).append(p)

    def first_death(self) -> Optional[_Proc]:
        """The rank that failed first: among the deaths seen in the first poll window, the earliest by
        the time its hook wrote (a peer's "connection closed" comes after the real failure); a rank
        that vanished (a signal: often the launcher's SIGTERM to the others) only when none recorded."""
        if not self.deaths:
            return None
        t0 = self.deaths[0].ended_at
        same = [p for p in self.deaths if p.ended_at - t0 < 2 * POLL + 1.0]
        return min(same, key=lambda p: (_consequence(p), p.end is None, (p.end or {}).get("t", float("inf")),
                                        same.index(p)))


    def _torch_dump_bytes(self, p: _Proc) -> int:
        """Bytes torch itself wrote so far into this rank's timeout dump (``<torch_dump><rank>``, written
        by NCCL's watchdog thread with ``TORCH_NCCL_DUMP_ON_TIMEOUT``), for :meth:`sample` to take out of
        the rank's I/O: a dump written because the job hangs is not the job's work. Counted from the
        file's changes since this run started: a file that grew adds what it grew by, a new or
        rewritten one its size (a rewrite missed between two looks counts as the job's work: a hang
        found later, never one that is not there)."""
        if not self.torch_dump or p.rank is None:
            return p.torch_dump_bytes
        try:
            st = os.stat(f"{self.torch_dump}{p.rank}")
        except OSError:
            return p.torch_dump_bytes
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if st.st_mtime < self.started - 1.0 or seen == p.torch_dump:
            return p.torch_dump_bytes  # an earlier run's file, or unchanged
        old = p.torch_dump
        grew = bool(old) and old[0] == st.st_ino and st.st_size > old[2]
        p.torch_dump_bytes += st.st_size - old[2] if grew else st.st_size
        p.torch_dump = seen
        return p.torch_dump_bytes


def _consequence(p: _Proc) -> bool:
    """A rank that raised because a peer went away ("Connection closed by peer"): a victim, not the cause."""
    from ddpdoctor.causes.matcher import explain_text

    text = (p.end or {}).get("exception", "")
    return bool(text) and any(m.cause.id == "peer-closed" for m in explain_text(text))


def _usage(p: _Proc) -> tuple:
    """The rank's CPU seconds and I/O bytes (with its children), less ddpdoctor's own work inside it:
    its heartbeat thread and its stack dumps (see :mod:`ddpdoctor.postmortem.progress`)."""
    from ddpdoctor.postmortem.progress import usage

    stack = p.info.get("stack_file")
    own = p.info.get("own_threads")
    return usage(p.pid, own if isinstance(own, list) else (), [stack] if isinstance(stack, str) else [])


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ---------------------------------------------------------------------------------------------------
# Stopping the job


def _job_pids(proc: Launched, run_id: str) -> list:
    """Every live process of the job: below the watchdog (what no process can leave), and any other
    process of this user tagged with the run's id."""
    from ddpdoctor.postmortem.watchdog import job_pids

    return job_pids(proc.watchdog.pid, run_id)


def _signal_job(proc: Launched, run_id: str, sig: int) -> list:
    """``sig`` to the launcher's process group and every process of the job; the PIDs signalled."""
    try:
        os.killpg(proc.pid, sig)
    except OSError:
        pass
    pids = _job_pids(proc, run_id)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    return pids


def _stop(proc: Launched, run_id: str, grace: float) -> None:
    """SIGTERM to the whole job, ``grace`` seconds, then SIGKILL to what is left; reap the launcher."""
    _signal_job(proc, run_id, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _job_pids(proc, run_id):
            break
        time.sleep(0.05)
    _leave_nothing(proc, run_id)


def _leave_nothing(proc: Launched, run_id: str) -> None:
    """SIGKILL whatever of the job is left (its launcher included) and reap the launcher."""
    for _ in range(100):
        left = _signal_job(proc, run_id, signal.SIGKILL) if proc.poll() is None or _job_pids(proc, run_id) else []
        if not left and proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.wait()


def _settle(proc: Launched, run_id: str, grace: float) -> None:
    """The launcher exited: processes of the job it left behind get ``grace`` s, SIGTERM, then SIGKILL."""
    end = time.monotonic() + min(grace, 2.0)
    while _job_pids(proc, run_id):  # one scan of /proc when nothing is left (the usual end), not two
        if time.monotonic() >= end:
            _stop(proc, run_id, grace)
            return
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------------
# The verdict


def _read_live(watch: _Watch, run_dir: str, wait: float, only_read: bool = False) -> list:
    """Every live rank's stack; the live ranks also dump their Flight Recorder meanwhile (asked first, so
    the dumps are written while the stacks are read; waited for after, ``wait`` s from the request at most)."""
    from ddpdoctor.postmortem.recorder import request_dumps, wait_dumps
    from ddpdoctor.postmortem.stacks import RankProcess, read_stacks

    live = [p for p in watch.live_ranks() if _running(p.pid)] or \
        [p for p in watch.procs.values() if p.alive and _running(p.pid)]
    asked = [p.pid for p in live if p.is_rank]
    start = time.monotonic()
    if asked:
        watch.recorder_request = request_dumps(run_dir, max(wait, 2.0)) or watch.recorder_request
    procs = [RankProcess(p.pid, p.rank, run_dir=run_dir, index=p.index) for p in live]
    readings = read_stacks(procs, wait)
    if asked:
        wait_dumps(run_dir, watch.recorder_request, asked, start + max(wait, 2.0))
    return [r for r in readings if r.stack or not only_read]


def _recorder(run_dir: str, watch: _Watch):
    """The ranks' Flight Recorder dumps for the verdict (:func:`ddpdoctor.postmortem.recorder.read_recorder`)."""
    from ddpdoctor.postmortem.recorder import RankRef, read_recorder

    refs = [RankRef(p.rank, p.pid, p.alive, "" if p.alive else (p.death() or "exited with code 0"))
            for p in watch.ranks()]
    return read_recorder(run_dir, refs, watch.recorder_request)


_LAUNCHER_EXC = re.compile(r"^(?P<exc>(?:torch\.distributed\.elastic\.multiprocessing\.errors\.ChildFailedError|"
                           r"torch\.multiprocessing\.spawn\.Process(?:Raised|Exited)Exception|"
                           r"subprocess\.CalledProcessError))\b")


def _launcher_summary(text: str) -> Optional[str]:
    """The launcher's own closing traceback, in one line (it reports the rank's failure; it is not the cause)."""
    exc = None
    for line in text.splitlines():
        m = _LAUNCHER_EXC.match(line.strip())
        if m:
            exc = m.group("exc").rsplit(".", 1)[-1]
    return exc


def _tail(path: str, limit: int = 8 << 20, end: Optional[int] = None) -> str:
    """The log's last ``limit`` bytes (the failure is at the end; a huge log must not stall the verdict),
    up to byte ``end`` (what the job wrote before an interrupt); empty when the log cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell() if end is None else min(end, f.tell())
            f.seek(max(0, size - limit))
            return f.read(size - f.tell()).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _verdict(spec: RunSpec, run_dir: str, watch: _Watch, kind: str, headline: str, readings: list,
             code: Optional[int] = None, log_end: Optional[int] = None,
             watches: Optional[Watches] = None) -> list:
    """The verdict: cause first, then where the others were, the launcher's part, explain; saved.

    ``kind``: failed, hung or interrupted (then ``log_end``: what the job wrote before the interrupt,
    the part explained; what it printed as it stopped is the interrupt's doing).

    Its lines quote the job (exceptions, log lines, stack frames): each line of ``verdict.txt`` and
    ``stacks.txt`` and each string of ``verdict.json`` is redacted and escaped (``safe_text``); the
    job's own words stay byte for byte only in ``output.raw.log``."""
    from ddpdoctor.causes.matcher import explain_text, first_failure
    from ddpdoctor.postmortem.explain import render_matches
    from ddpdoctor.postmortem.recorder import lead_lines
    from ddpdoctor.postmortem.stacks import render_groups

    watch.verdict_at = time.monotonic()
    text = _tail(os.path.join(run_dir, RAW_LOG), end=log_end)
    matches = explain_text(text)
    first = first_failure(text)
    dead = watch.cause_proc = _launchers_vanished(first, watch.first_death(), watch)
    launcher_first = None
    if first and _after_the_cause(first, dead, watch):
        launcher_first, first = first, None  # the launcher saw a consequence exit first: never named as first
    cause = None
    if dead is not None:
        cause = f"{dead.label} {dead.death()}"
    if first and (dead is None or dead.end is None or dead.end.get("how") != "raised"):
        cause = first  # the launcher's report names the exception when the hook could not (mp.spawn, torchrun)
    teardown = next((m for m in matches if m.cause.id == "teardown-abort"), None)
    if teardown is not None and (dead is None or dead.end is None or dead.end.get("how") != "raised"):
        # the work finished and a rank aborted in the interpreter's teardown: the launcher then SIGTERMed the
        # others, whose deaths are its consequence (never the cause)
        cause = teardown.meaning.split(". ")[0].replace("{rank}", "a rank")
    lines = [f"ddpdoctor run: {headline}" + (f"; cause: {cause}" if cause and kind == "failed" else "")]
    if kind != "failed" and cause:
        lines.append(f"  before it {'hung' if kind == 'hung' else 'was interrupted'}: {cause}")
    recorder = _recorder(run_dir, watch)  # the divergent collective leads; nothing when no rank could dump
    lines += ["  " + line for line in lead_lines(recorder, {r.proc.rank: r.place for r in readings if r.stack})]
    if readings:
        if kind == "interrupted":
            lines.append("  where the ranks were when it was interrupted:")
        elif kind != "hung":
            who = dead.label if dead is not None else "the first rank"
            lines.append(f"  where the other ranks were when {who} ended:")
        lines += ["  " + line for line in render_groups(readings)]
    for p in watch.deaths:
        if p is not dead:
            lines.append(f"  {p.label} (pid {p.pid}) {p.death()}" + (
                (" after the first failure (most likely stopped by the launcher)" if p.end is None else
                 " after the first failure") if dead else ""))
    launcher = _launcher_summary(text)
    if launcher and kind != "hung":
        lines.append(f"  the launcher's traceback above ({launcher}) is its report of that failure, not another "
                     "cause")
    if matches or first:
        explained = render_matches(matches, f"explain ({RAW_LOG})", first)
        if first and _same_failure(cause, first, dead):
            explained = explained[1:]  # "first failure:" would say the cause again (the headline has the code)
        lines += ["  " + line for line in explained]
    if watches is not None and watches.findings:
        lines += [f"  silent bug: {line}" for line in watches.summary()]
    lines.append(f"  saved in {run_dir} ({RAW_LOG}, stacks.txt, verdict.txt, verdict.json, report.html, trace.json)")
    lines = [safe_text(line) for line in lines]
    unsaved = _save(os.path.join(run_dir, "stacks.txt"), lambda: "".join(
        safe_text(line) + "\n" for r in readings
        for line in [f"--- {r.proc.label} (pid {r.proc.pid}), read with {r.method}: {r.place}",
                     *(r.stack or r.error).rstrip("\n").splitlines()]))
    unsaved += _save(os.path.join(run_dir, "verdict.txt"), lambda: "\n".join(lines) + "\n")
    doc = watch.verdict_doc = safe_data({
        "schema": 1, "kind": kind, "headline": headline, "exit_code": code, "cause": cause, "first_failure": first,
        **({"launcher_first_failure": launcher_first} if launcher_first else {}),
        "causes": [m.to_dict() for m in matches],
        "stacks": [{"rank": r.proc.rank, "pid": r.proc.pid, "method": r.method, "place": r.place} for r in readings],
        "ranks": [{"rank": p.rank, "index": p.index, "pid": p.pid,
                   "state": "alive" if p.alive else (p.death() or "exited with code 0")} for p in watch.ranks()],
        "deaths": [{"rank": p.rank, "pid": p.pid, "how": p.death()} for p in watch.deaths],
        "findings": watches.to_json() if watches is not None else [],
        "flight_recorder": recorder.to_dict()})
    unsaved += _save(os.path.join(run_dir, "verdict.json"), lambda: json.dumps(doc, indent=2))
    if unsaved:
        lines.append(f"  not saved: {'; '.join(unsaved)}")
    watch.verdict_lines = lines
    return lines


def _launchers_vanished(first: Optional[str], dead: Optional[_Proc], watch: _Watch) -> Optional[_Proc]:
    """The rank that failed first when none left an exit record: the one the launcher's "first observed
    failure" names, when the hook saw it vanish too. Ranks that end without a Python exit are ordered by when
    the hook noticed them gone, and a rank the launcher then stopped (SIGTERM) can be noticed in the same
    look as the rank it was stopped for (SIGKILL): the launcher, their parent, saw which ended first."""
    m = re.match(r"rank (\d+) ", first or "")
    if m is None or dead is None or dead.end is not None or dead.rank == int(m.group(1)):
        return dead
    named = next((p for p in watch.deaths if p.rank == int(m.group(1)) and p.end is None), None)
    return named if named is not None else dead


def _after_the_cause(first: str, dead: Optional[_Proc], watch: _Watch) -> bool:
    """The launcher's "first observed failure" names a rank the hook saw die after the one that raised first
    (torchrun orders failures it saw in one poll by rank, not by time: rank 0's "Connection closed by
    peer" can be named before rank 1's exception that caused it)."""
    m = re.match(r"rank (\d+) ", first)
    if m is None or dead is None or dead.end is None or dead.end.get("how") != "raised":
        return False
    return any(p is not dead and p.rank == int(m.group(1)) for p in watch.deaths) and dead.rank != int(m.group(1))


def _same_failure(cause: Optional[str], first: str, dead: Optional[_Proc]) -> bool:
    """The launcher's first failure says what the cause already says: the same line, or the same rank's
    failure in the launcher's words (``rank 1 exited with code 1: <the exception the hook recorded>``)."""
    if cause is None:
        return False
    return cause == first or (dead is not None and cause.startswith(f"{dead.label} ")
                              and first.startswith(f"{dead.label} "))


def _save(path: str, text) -> list:
    """Write a report file of the run directory; ``[why it was not saved]`` (a full disk), else []."""
    try:
        _write_private(path, text())
    except OSError as exc:
        return [f"{os.path.basename(path)} ({exc.strerror or exc})"]
    return []


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run_job(spec: RunSpec) -> int:
    """Run ``spec.command``; returns the job's exit code, 124 when it hung, 130 when interrupted.

    Raises:
        UsageError: the run directory cannot be used or the command cannot be started.
    """
    from ddpdoctor.errors import UsageError

    window = window_from_env(dict(os.environ))  # a bad DDPDOCTOR_WATCH_WINDOW: exit 2 before anything is made
    rd = prepare_run_dir(spec.run_dir)
    run_dir = rd.path
    run_id = uuid.uuid4().hex
    env = job_env(run_dir, rd.inject, dict(os.environ), run_id)
    env.setdefault("DDPDOCTOR_BEAT_S", f"{max(0.05, min(1.0, spec.hang_timeout / 10)):g}")
    env.update(watch_env(spec.no_watch))
    try:
        tee = OutputCopy(os.path.join(run_dir, RAW_LOG))
    except OSError as exc:
        rd.remove()
        raise UsageError("run-dir", f"cannot write {RAW_LOG} in {run_dir}: {exc.strerror or exc}",
                         "pass a writable directory with --dir") from None
    started = time.monotonic()
    try:  # through the watchdog: from here on, our death takes the whole job with it
        proc = launch(spec.command, env, run_id)
    except OSError as exc:
        tee.close()
        rd.remove()
        raise UsageError("cannot-start", f"cannot start {spec.command[0]!r}: {exc.strerror}",
                         "check the command after --") from None
    tee.start(proc.stdout, _binary(sys.stdout))
    tee.start(proc.stderr, _binary(sys.stderr))
    watch = _Watch(run_dir, env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or "",
                   _progress_period(env))
    stragglers = StragglerWatch(run_dir, spec.straggler_window, spec.straggler_windows)
    watches = Watches(run_dir, window, env)
    forwarded: list = []  # SIGINT/SIGTERM to us, in order (the first is acted on in the loop: _interrupt)

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        if len(forwarded) > 1:  # a second one: stop the job now, skip every wait
            _signal_job(proc, run_id, signal.SIGKILL)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    verdict_kind: Optional[str] = None
    verdict: list = []  # printed once the job's output ended: the verdict is the last thing on screen
    stopped: dict = {}  # the interrupt: the signal, the output before it, the stacks, how the job ended
    try:
        last_progress = last = time.monotonic()
        out_bytes = 0
        snapshot: list = []
        poll = max(POLL, min(1.0, spec.hang_timeout / 20))
        quiet_said_at, quiet_said_now = -QUIET_REPEAT, False  # the silence line: when, and said in this silence
        ended = proc.ended
        while proc.poll() is None:
            if forwarded and (verdict_kind is None or (verdict_kind == "hung" and spec.keep_hung)):
                verdict_kind = "interrupted"
                stopped.update(_interrupt(spec, proc, run_id, watch, run_dir, forwarded, tee, ended))
                break
            if ended(poll):
                break
            now = time.monotonic()
            watch.discover()
            deaths_before = len(watch.deaths)
            moved = watch.sample(now - last)
            named = stragglers.poll(now, watch.live_ranks())
            named += watches.poll(now, watch.ranks())
            if named:
                _say(spec, [f"ddpdoctor run: {line}" for line in named])
            if tee.bytes != out_bytes:
                moved, out_bytes = True, tee.bytes
            last = now
            if moved or not watch.procs:
                last_progress = now
            if len(watch.deaths) > deaths_before and not snapshot and watch.live_ranks():
                # where the survivors were when a rank died (before the launcher stops them)
                snapshot = _read_live(watch, run_dir, wait=1.0, only_read=True)
            if forwarded or verdict_kind:
                continue
            idle = now - last_progress
            if idle < QUIET_SHARE * spec.hang_timeout:
                quiet_said_now = False
            elif not quiet_said_now and watch.procs and now - quiet_said_at >= QUIET_REPEAT:
                quiet_said_now, quiet_said_at = True, now
                _say(spec, [_quiet_line(idle, spec.hang_timeout, proc.pid)])
            if watch.deaths and watch.live_ranks() and idle >= min(spec.hang_timeout, DEATH_GRACE):
                verdict_kind = "failed"
                if not snapshot:
                    snapshot = _read_live(watch, run_dir, wait=spec.stack_wait, only_read=True)
                dead = watch.first_death()
                verdict = _verdict(spec, run_dir, watch, "failed",
                                   f"{dead.label if dead else 'a rank'} ended and the others were left waiting "
                                   f"(no progress for {idle:.0f}s)", snapshot, 1, watches=watches)
                verdict.append(f"  stopped the job (SIGTERM, SIGKILL after {spec.stop_grace:g}s); exit 1")
                _say(spec, [f"ddpdoctor run: {dead.label if dead else 'a rank'} ended and the others were left "
                            f"waiting: stopping the job; the verdict follows its last output"])
                _stop(proc, run_id, spec.stop_grace)
                break
            if watch.procs and idle >= spec.hang_timeout:
                verdict_kind = "hung"
                _mark_live(watch, "hung", now, [])
                readings = _read_live(watch, run_dir, spec.stack_wait)
                _mark_live(watch, "hung", now, readings)
                verdict = _verdict(spec, run_dir, watch, "hung",
                                   f"hung: no rank made progress for {spec.hang_timeout:g}s", readings,
                                   int(ExitCode.HUNG), watches=watches)
                if spec.keep_hung:  # the job goes on printing: nothing to wait for
                    _say(spec, verdict)
                    verdict = []
                    continue
                verdict.append(f"  stopped the job (SIGTERM, SIGKILL after {spec.stop_grace:g}s); "
                               f"exit {int(ExitCode.HUNG)}")
                _say(spec, [f"ddpdoctor run: hung: no rank made progress for {spec.hang_timeout:g}s: stopping "
                            "the job; the verdict follows its last output"])
                _stop(proc, run_id, spec.stop_grace)
                break
        proc.wait()
        _settle(proc, run_id, spec.stop_grace)
        if proc.lost:
            _say(spec, ["ddpdoctor run: the watchdog that started the job ended before it (killed?): the "
                        "job's exit code is unknown, reported as 1"])
    except BaseException:
        _leave_nothing(proc, run_id)
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        tee.close()
        proc.done()
        rd.seal()
    code = _exit_code(proc.returncode)
    pictures = _Pictures(spec, rd, watch, stragglers, watches)
    if verdict_kind == "interrupted":
        return pictures.write("interrupted", _report_interrupt(spec, rd, watch, tee, code, stopped, watches), True)
    if verdict:
        _say(spec, verdict + _unsaved(tee))
    watch.discover()
    watch.sample(POLL)
    late = watches.finish(watch.ranks())
    if late:
        _say(spec, [f"ddpdoctor run: {line}" for line in late])
    elapsed = time.monotonic() - started
    if verdict_kind == "hung" and not spec.keep_hung:
        return pictures.write("hung", int(ExitCode.HUNG), True)
    if verdict_kind == "failed":
        return pictures.write("failed", 1, True)
    if verdict_kind is None and (code != 0 or watch.deaths):
        head = f"the job failed (exit {code})" if code != 0 else "the job exited 0, but a rank failed"
        _say(spec, _verdict(spec, run_dir, watch, "failed", head, snapshot, code, watches=watches) + _unsaved(tee))
        rd.seal()
        return pictures.write("failed", code, True)
    if verdict_kind is None and code == 0:
        n = len(watch.ranks())
        who = f"{n} rank{'s' if n != 1 else ''}" if n else "1 process"
        kept = spec.keep
        line = f"ddpdoctor run: {who}, exit 0 in {elapsed:.0f} s, no hang, no rank died"
        slow = stragglers.summary()
        if slow:
            line += f"; {len(slow)} straggler{'s' if len(slow) != 1 else ''}: " + "; ".join(slow)
        pictures.headline = line[len("ddpdoctor run: "):]
        if watches.findings:  # a silent bug: the directory and its verdict are kept, the exit code stays the job's
            n = len(watches.findings)
            line += (f"; {n} silent bug{'s' if n != 1 else ''} found: " + "; ".join(watches.summary()) +
                     f"; saved in {run_dir} (verdict.txt, verdict.json, report.html, trace.json)")
            line = safe_text(line)
            unsaved = _save(os.path.join(run_dir, "verdict.txt"), lambda: line + "\n")
            unsaved += _save(os.path.join(run_dir, "verdict.json"), lambda: json.dumps(safe_data({
                "schema": 1, "kind": "ok", "headline": f"exit 0, {n} silent bug{'s' if n != 1 else ''} found",
                "exit_code": code, "findings": watches.to_json()}), indent=2))
            if unsaved:
                line += f"; not saved: {'; '.join(unsaved)}"
            kept = True
        elif kept:
            line += f"; kept {run_dir}"
        _say(spec, _unsaved(tee) + [line])
        code = pictures.write("ok", code, kept)
        if kept:
            rd.seal()
        else:
            rd.remove()
        return code
    rd.seal()
    return pictures.write(verdict_kind or "failed", code, True)


def _mark_live(watch: _Watch, kind: str, at: float, readings: list) -> None:
    """Mark every live rank on the timeline: ``kind`` (hung, interrupted) at ``at``, with where it was."""
    from ddpdoctor.postmortem.timeline import Mark

    places = {r.proc.pid: r.place for r in readings if getattr(r, "stack", None)}
    for p in watch.live_ranks():
        watch.marks[p.pid] = Mark(kind, at, f"{p.label} {kind}" + (f" at {places[p.pid]}" if p.pid in places else ""))


class _Pictures:
    """``report.html`` and ``trace.json`` of a run: written into the run directory when it is kept, the page
    also to ``--html``; a file that cannot be written is named in one line, never a traceback."""

    def __init__(self, spec: RunSpec, rd: RunDir, watch: _Watch, stragglers: StragglerWatch, watches: Watches):
        self.spec, self.rd, self.watch, self.stragglers, self.watches = spec, rd, watch, stragglers, watches
        self.headline = ""

    def _rows(self, limit: int) -> list:
        from ddpdoctor.postmortem.timeline import Mark, read_rank

        w = self.watch
        first = w.cause_proc or w.first_death()
        rows = []
        skew = time.time() - time.monotonic()  # the hook's exit record has the wall clock: when the rank ended
        for p in w.ranks():
            mark = w.marks.get(p.pid)
            if mark is None and p in w.deaths and (w.verdict_at is None or p.ended_at <= w.verdict_at + POLL):
                t = (p.end or {}).get("t")  # else (a signal): when run saw it gone, up to a poll later
                at = min(p.ended_at, t - skew) if isinstance(t, (int, float)) else p.ended_at
                mark = Mark("died" if p is first else "ended", at, f"{p.label} {p.death()}")
            key = p.rank if p.rank is not None else p.label
            rows.append(read_rank(self.rd.path, p.pid, key, str(p.info.get("host") or ""),
                                  end=mark.at if mark else None, limit=limit))
            rows[-1].mark = mark
        return rows

    def write(self, kind: str, code: int, kept: bool) -> int:
        """Write the pictures; ``code``, or 74 when ``--html`` could not be written and ``code`` was 0."""
        from ddpdoctor.report.document import save_output
        from ddpdoctor.report.page import save_page

        if not kept and not self.spec.html:
            return code
        unsaved = []
        try:
            from ddpdoctor.postmortem.runpage import PAGE_LIMIT, RunPicture, render_run_page
            from ddpdoctor.postmortem.timeline import write_trace

            rows = self._rows(PAGE_LIMIT * 2)
            trace = os.path.join(self.rd.path, "trace.json")
            if kept:
                try:
                    write_trace(trace, rows)
                except OSError as exc:
                    unsaved.append(f"trace.json ({exc.strerror or exc})")
            doc = self.watch.verdict_doc
            headline = (doc or {}).get("headline") or self.headline or kind
            here = os.path.abspath(self.spec.html) if self.spec.html else os.path.join(self.rd.path, "report.html")
            link = "" if not kept or unsaved else (
                "trace.json" if os.path.dirname(here) == self.rd.path else "file://" + trace)
            picture = RunPicture(kind, headline, self.spec.command, self.rd.path if kept else "", code, doc,
                                 self.watch.verdict_lines, rows, self.stragglers.history, self.stragglers.summary(),
                                 self.watches.to_json(), link,
                                 first=getattr(self.watch.cause_proc or self.watch.first_death(), "label", ""))
            html_text = render_run_page(picture)
        except Exception as exc:  # noqa: BLE001 - the verdict is out already: a picture that fails is one line
            _say(self.spec, [f"ddpdoctor run: report.html not written: {type(exc).__name__}: {exc}"])
            return code
        if kept:
            unsaved += _save(os.path.join(self.rd.path, "report.html"), lambda: html_text)
        if self.spec.html:
            code, line = save_output(self.spec.html, lambda: save_page(self.spec.html, html_text), code, "--html")
            if line:
                _say(self.spec, [line])
        if unsaved:
            _say(self.spec, [f"ddpdoctor run: not saved: {'; '.join(unsaved)}"])
        if kept:
            self.rd.seal()
        return code


def _quiet_line(idle: float, hang_timeout: float, pid: int) -> str:
    """The one line said in a long silence, so that the user knows ddpdoctor is watching, when the verdict
    comes, and how to look now (before it, a job under the default --hang-timeout printed nothing for 300 s)."""
    return (f"ddpdoctor run: no progress for {idle:.0f} s on any rank; verdict at {hang_timeout:g} s; "
            f"`ddpdoctor stacks {pid}` to look now")


def _binary(stream: object) -> Optional[IO[bytes]]:
    """The byte stream under one of ours (None when there is none: the job's output then only goes to the log)."""
    return getattr(stream, "buffer", None)


def _unsaved(tee: OutputCopy) -> list:
    line = tee.unsaved()
    return [line] if line else []


def _interrupt(spec: RunSpec, proc: Launched, run_id: str, watch: _Watch, run_dir: str, forwarded: list,
               tee: OutputCopy, ended) -> dict:
    """The first Ctrl-C (or SIGTERM) to ``run``: read every live rank's stack (``stack_wait`` s at most),
    pass the signal on to the job, wait for it to end (``stop_grace`` s, then stop it: SIGTERM, SIGKILL).
    A second signal skips the waits (the job is SIGKILLed by the handler). What happened, for the verdict.
    """
    sig = signal.Signals(forwarded[0])
    _say(spec, [f"ddpdoctor run: {sig.name}: reading the ranks' stacks, then passing {sig.name} to the job "
                f"(again to stop it at once)"])
    log_end = tee.bytes
    watch.discover()
    at = time.monotonic()
    readings = _read_live(watch, run_dir, spec.stack_wait) if len(forwarded) < 2 else []
    _mark_live(watch, "interrupted", at, readings)
    try:
        os.killpg(proc.pid, sig)
    except OSError:
        pass
    deadline = time.monotonic() + spec.stop_grace
    while len(forwarded) < 2 and time.monotonic() < deadline and not ended(0.1):
        pass
    how = "ended by itself"
    if len(forwarded) > 1 and (proc.poll() is None or proc.returncode == -signal.SIGKILL):
        how = "was stopped at once (SIGKILL: interrupted again)"
        _leave_nothing(proc, run_id)
    elif proc.poll() is None:
        how = f"did not end in {spec.stop_grace:g}s and was stopped (SIGTERM, then SIGKILL)"
        _stop(proc, run_id, spec.stop_grace)
    return {"signal": sig.name, "log_end": log_end, "readings": readings, "how": how}


def _report_interrupt(spec: RunSpec, rd: RunDir, watch: _Watch, tee: OutputCopy, code: int, stopped: dict,
                      watches: Optional[Watches] = None) -> int:
    """The interrupt's verdict, after the job's last output: where the ranks were; exit 130 (0 when the
    job handled the interrupt and exited 0 by itself)."""
    ours = 0 if code == 0 and stopped["how"] == "ended by itself" else int(ExitCode.INTERRUPTED)
    lines = _verdict(spec, rd.path, watch, "interrupted", f"interrupted by {stopped['signal']}", stopped["readings"],
                     ours, log_end=stopped["log_end"], watches=watches)
    lines.append(f"  {stopped['signal']} passed to the job; it {stopped['how']} (exit {code}); exit {ours}")
    rd.seal()
    _say(spec, lines + _unsaved(tee))
    return ours


def _say(spec: RunSpec, lines: list) -> None:
    try:
        spec.err.write("\n".join(safe_text(line) for line in lines) + "\n")  # quotes the job: redacted, escaped
        spec.err.flush()
    except (OSError, ValueError):
        pass
