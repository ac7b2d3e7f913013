"""``ddpdoctor run``: run a training command unchanged, watch its ranks, explain a hang or a death.

Job states (the state machine of :func:`run_job`)::

    RUNNING --launcher exits 0, no rank died-->   OK        (one summary line; the run directory is removed
                                                             unless --keep)
    RUNNING --launcher exits non-zero-->          FAILED    (verdict: the rank that failed first and its words,
                                                             where the others were, the launcher's own
                                                             traceback summarised; exit with the job's code)
    RUNNING --a rank died, the others idle
              for DEATH_GRACE s-->                FAILED    (the same verdict; the job is stopped; exit 1)
    RUNNING --no progress for hang_timeout-->     HUNG      (grouped stacks + explain, saved; then stop,
                                                             exit 124; with keep_hung: keep waiting)
    RUNNING --SIGINT/SIGTERM to us-->             forwarded to the launcher's process group; when the launcher
                                                  is gone, what is left of the job is stopped too

What is added to the job (and nothing else): a ``sitecustomize.py`` on ``PYTHONPATH`` (see
:mod:`ddpdoctor.postmortem.inject.sitecustomize`: in each rank, faulthandler on SIGUSR2, a heartbeat of
where the main thread is, the rank number, how the process ended), ``DDPDOCTOR_RUN_*`` variables, and
PyTorch's own NCCL timeout diagnostics (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``: the Flight Recorder writes
its trace into the run directory) unless the user set them.

Ranks are the processes the hook registers: those with ``RANK`` (torchrun, srun, mpirun,
``torch.distributed.launch``) and the ``multiprocessing`` children of the launched command
(``mp.spawn``), named by their process-group rank (or ``mp.spawn``'s index before
``init_process_group``). Progress, per rank: its main thread moved since the last look, its CPU time
grew (it and its children: DataLoader workers; at least ``CPU_MIN_S`` and 1% of a core since the last
credited growth, so a busy rank on a crowded machine counts and a waiting one does not), it read or
wrote bytes (a rank reading a slow file is
busy, not hung), or the job wrote output. The launcher and ``mp.spawn``'s parent only wait, so they are
watched only while no rank is alive. Hung: no rank made progress for ``hang_timeout`` seconds.

A healthy job is never signalled. Stack requests go only to live ranks whose handler is installed
(checked in ``/proc/<pid>/status`` right before the signal); a rank that exits ignores the signal from
its ``atexit`` on. A job is stopped only after a verdict, or when the user's Ctrl-C/SIGTERM left parts
of it running: SIGTERM to the launcher's group and every process of the job (found by the
``DDPDOCTOR_RUN_ID`` in its environment), a deadline, then SIGKILL. If ``ddpdoctor run`` itself is
killed, :mod:`ddpdoctor.postmortem.watchdog` ends the job.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import IO, Optional

from ddpdoctor.exitcodes import ExitCode
from ddpdoctor.postmortem.straggle import StragglerWatch
from ddpdoctor.postmortem.watches import Watches, watch_env, window_from_env
from ddpdoctor.system.stackframes import shown_where

__all__ = ["RunSpec", "run_job", "job_env", "default_runs_root", "RAW_LOG", "DEATH_GRACE"]

POLL = 0.2
CPU_BUSY = 0.01  # CPU growth (core-seconds per second, since the last credited growth) that counts as progress
CPU_MIN_S = 0.03  # ... and at least this many CPU seconds: a rank waiting in a collective uses ~0, while a
#                   busy rank on a crowded machine (a fraction of a core) still adds this in well under a second
DEATH_GRACE = 5.0  # seconds the others may sit idle after a rank died before the verdict (capped by hang_timeout)
RAW_LOG = "output.raw.log"  # the job's bytes as written, unredacted: mode 0600
_OWN_FILES = ("proc-*.json", "beat-*", "coll-*.txt", "stacks-*.txt", "exit-*.json", ".proc-*", ".exit-*", RAW_LOG, "stacks.txt",
              "verdict.txt", "verdict.json", "flight-recorder-rank*", "finding-*.json", ".finding-*", "desync-*",
              ".desync-*", "plan-*.json", ".plan-*")


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
    err: IO = field(default_factory=lambda: sys.stderr)


def default_runs_root() -> str:
    """``$XDG_STATE_HOME/ddpdoctor/runs`` (``~/.local/state/ddpdoctor/runs`` when unset or relative)."""
    state = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "ddpdoctor", "runs")


def job_env(run_dir: str, inject_dir: str, base: dict, run_id: str = "") -> dict:
    """The job's environment: the user's, plus the handler on PYTHONPATH and PyTorch's own aids."""
    env = dict(base)
    env["PYTHONPATH"] = inject_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["DDPDOCTOR_RUN_DIR"] = run_dir
    env["DDPDOCTOR_RUN_PID"] = str(os.getpid())
    env["DDPDOCTOR_RUN_ID"] = run_id or uuid.uuid4().hex
    env.pop("DDPDOCTOR_RANK_MARK", None)
    env.setdefault("DDPDOCTOR_STACK_SIGNAL", "SIGUSR2")
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    if not (env.get("TORCH_FR_BUFFER_SIZE") or env.get("TORCH_NCCL_TRACE_BUFFER_SIZE")):
        # the Flight Recorder's ring buffer (renamed TORCH_FR_* in newer torch; the old name warns there)
        env["TORCH_FR_BUFFER_SIZE" if _torch_version() >= (2, 8) else "TORCH_NCCL_TRACE_BUFFER_SIZE"] = "2000"
    fr = os.path.join(run_dir, "flight-recorder-rank")
    env.setdefault("TORCH_FR_DUMP_TEMP_FILE", fr)
    env.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", fr)
    return env


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
# The run directory


@dataclass
class _RunDir:
    path: str
    inject: str
    created: bool  # we made the directory itself (so removing it whole is ours to do)


def _prepare_dir(spec: RunSpec) -> _RunDir:
    """Create (or reuse, for an existing real ``--dir``) the run directory, user-only.

    Raises:
        UsageError: the path is a symbolic link, not a directory, or cannot be created.
    """
    from ddpdoctor.errors import UsageError

    explicit = spec.run_dir is not None
    if explicit:
        path = os.path.abspath(spec.run_dir)
    else:
        path = os.path.join(default_runs_root(), f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    shown = spec.run_dir if explicit else path
    created = False
    try:
        if os.path.islink(path):
            raise UsageError("run-dir", f"--dir {shown} is a symbolic link; ddpdoctor run does not write "
                             "through a link it did not create", "pass a real directory or a new path")
        if os.path.lexists(path):
            if not os.path.isdir(path):
                raise UsageError("run-dir", f"--dir {shown} exists and is not a directory",
                                 "pass a directory or a new path")
            _clear_own_files(path)
        else:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            os.mkdir(path, 0o700)
            created = True
        inject = os.path.join(path, ".inject")
        if os.path.islink(inject):
            os.unlink(inject)
        os.makedirs(inject, mode=0o700, exist_ok=True)
        for source, name in _inject_files():
            target = os.path.join(inject, name)
            if os.path.lexists(target):
                os.unlink(target)
            with open(source, "rb") as src:
                data = src.read()
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    except OSError as exc:
        raise UsageError("run-dir", f"cannot use --dir {shown}: {exc.strerror or exc}" if explicit else
                         f"cannot create the run directory {path}: {exc.strerror or exc}",
                         "pass a writable directory with --dir" if explicit else
                         "set XDG_STATE_HOME to a writable directory, or pass --dir") from None
    return _RunDir(path, inject, created)


def _inject_files() -> list:
    """(source, name in ``.inject``): the hook, the watches (:mod:`ddpdoctor.postmortem.watches`) and the
    library's fingerprint they use, as files: the job's interpreter need not be able to import ddpdoctor."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [(os.path.join(here, "inject", "sitecustomize.py"), "sitecustomize.py"),
            (os.path.join(here, "inject", "_ddpdoctor_watches.py"), "_ddpdoctor_watches.py"),
            (os.path.join(os.path.dirname(here), "diagnostics", "fingerprint.py"), "_ddpdoctor_fingerprint.py")]


def _clear_own_files(path: str) -> None:
    """Remove what an earlier run left in a reused ``--dir`` (never follows a link: unlink removes the link)."""
    for pattern in _OWN_FILES:
        for f in glob.glob(os.path.join(glob.escape(path), pattern)):
            if os.path.islink(f) or os.path.isfile(f):
                os.unlink(f)
    inject = os.path.join(path, ".inject")
    if os.path.islink(inject):
        os.unlink(inject)
    elif os.path.isdir(inject):
        shutil.rmtree(inject, ignore_errors=True)


def _remove_dir(rd: _RunDir) -> None:
    """Remove the run's files (the whole directory when this run created it)."""
    if rd.created:
        shutil.rmtree(rd.path, ignore_errors=True)
        return
    _clear_own_files(rd.path)


def _write_private(path: str, data: str) -> None:
    """Write a file of the run directory: never through a link, user-only."""
    if os.path.islink(path):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(data)


# ---------------------------------------------------------------------------------------------------
# Output and the watchdog


class _Tee:
    """Copies the job's stdout/stderr byte for byte to ours and to the raw log; counts bytes (progress)."""

    def __init__(self, log_path: str) -> None:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        self.log = os.fdopen(fd, "ab")
        self.lock = threading.Lock()
        self.bytes = 0
        self.threads: list = []
        self.pipes: list = []

    def start(self, pipe: IO[bytes], sink: IO[bytes]) -> None:
        t = threading.Thread(target=self._pump, args=(pipe, sink), daemon=True)
        t.start()
        self.threads.append(t)
        self.pipes.append(pipe)

    def _pump(self, pipe: IO[bytes], sink: IO[bytes]) -> None:
        fd = pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            with self.lock:
                self.bytes += len(chunk)
                self.log.write(chunk)
                self.log.flush()
            try:
                sink.write(chunk)
                sink.flush()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        for t in self.threads:
            t.join(timeout=5)
        for pipe in self.pipes:
            if not any(t.is_alive() for t in self.threads):
                pipe.close()
        self.log.close()


class _Watchdog:
    """The process that ends the job if ``ddpdoctor run`` dies (see :mod:`ddpdoctor.postmortem.watchdog`)."""

    def __init__(self, run_id: str) -> None:
        script = os.path.join(os.path.dirname(__file__), "watchdog.py")
        self.proc: Optional[subprocess.Popen] = None
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", script, run_id], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
        except OSError:
            self.proc = None

    def tell(self, line: str) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(line.encode() + b"\n")
                self.proc.stdin.flush()
            except (OSError, ValueError):
                pass

    def done(self) -> None:
        """Normal end: the job is already stopped and reaped; let the watchdog go."""
        if self.proc is None:
            return
        self.tell("done")
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


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
            return f"raised {e.get('exception', '')}" + (f" at {shown_where(e['where'])}" if e.get("where") else "")
        code = e.get("code")
        if code not in (0, None):
            return f"exited with code {code}"
        return None


class _Watch:
    """The job's processes (found through the hook's ``proc-<pid>.json``) and their progress."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.procs: dict = {}
        self.deaths: list = []  # ranks that failed, in the order seen
        self.exits: list = []  # ranks that exited normally

    def discover(self) -> None:
        for path in glob.glob(os.path.join(glob.escape(self.run_dir), "proc-*.json")):
            pid = int(os.path.basename(path)[5:-5])
            known = self.procs.get(pid)
            if known is not None and (known.rank is not None or not known.is_rank or not known.alive):
                continue
            try:
                with open(path) as f:
                    info = json.load(f)
            except (OSError, ValueError):
                continue
            rank = info.get("rank")
            rank = int(rank) if isinstance(rank, int) or (isinstance(rank, str) and rank.isdigit()) else None
            index = info.get("index") if isinstance(info.get("index"), int) else None
            if known is not None:
                known.rank, known.index, known.info = rank, index, info
                continue
            role = info.get("role") or ("rank" if rank is not None else "top")
            p = _Proc(pid, role, rank, index, info["beat_file"], info)
            p.cpu, p.io = _usage(pid)
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
            cpu, io = _usage(p.pid)
            now = time.monotonic()
            busy = cpu - p.cpu >= max(CPU_MIN_S, CPU_BUSY * (now - p.cpu_at))
            # past its atexit (the exit record is written): the interpreter is tearing down, not hung
            exiting = os.path.exists(os.path.join(self.run_dir, f"exit-{p.pid}.json"))
            if beat != p.beat or busy or io != p.io or exiting:
                moved = True
            if busy:
                p.cpu, p.cpu_at = cpu, now
            p.beat, p.io = beat, io
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


def _consequence(p: _Proc) -> bool:
    """A rank that raised because a peer went away ("Connection closed by peer"): a victim, not the cause."""
    from ddpdoctor.causes.matcher import explain_text

    text = (p.end or {}).get("exception", "")
    return bool(text) and any(m.cause.id == "peer-closed" for m in explain_text(text))


def _usage(pid: int) -> tuple:
    """CPU seconds and bytes read+written by ``pid`` and its descendants (DataLoader workers)."""
    import psutil  # here, not at the top: the wrapper starts the job before its first sample

    cpu, io = 0.0, 0
    try:
        me = psutil.Process(pid)
        family = [me] + me.children(recursive=True)
    except psutil.Error:
        return cpu, io
    for q in family:
        try:
            with q.oneshot():
                t = q.cpu_times()
                cpu += t.user + t.system
                c = q.io_counters()
                io += c.read_chars + c.write_chars
        except (psutil.Error, AttributeError):
            continue
    return cpu, io


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ---------------------------------------------------------------------------------------------------
# Stopping the job


def _job_pids(run_id: str) -> list:
    from ddpdoctor.postmortem.watchdog import tagged_pids

    return tagged_pids(run_id)


def _signal_job(proc: subprocess.Popen, run_id: str, sig: int) -> list:
    """``sig`` to the launcher's process group and every process of the job; the PIDs signalled."""
    try:
        os.killpg(proc.pid, sig)
    except OSError:
        pass
    pids = _job_pids(run_id)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    return pids


def _stop(proc: subprocess.Popen, run_id: str, grace: float) -> None:
    """SIGTERM to the whole job, ``grace`` seconds, then SIGKILL to what is left; reap the launcher."""
    _signal_job(proc, run_id, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _job_pids(run_id):
            break
        time.sleep(0.05)
    _leave_nothing(proc, run_id)


def _leave_nothing(proc: subprocess.Popen, run_id: str) -> None:
    """SIGKILL whatever of the job is left (its launcher included) and reap the launcher."""
    for _ in range(100):
        left = _signal_job(proc, run_id, signal.SIGKILL) if proc.poll() is None or _job_pids(run_id) else []
        if not left and proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.wait()


def _exit_waiter(proc: subprocess.Popen):
    """A function ``ended(timeout)``: True once the job's launcher has exited, returning as soon as it
    does. Through a pidfd where Linux has them; ``Popen.wait(timeout)`` sleeps in steps of up to 50
    ms, which the end of every job would pay."""
    import select

    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        fd = None

    def ended(timeout: float) -> bool:
        if fd is None:
            try:
                proc.wait(timeout=timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        try:
            select.select([fd], [], [], timeout)
        except InterruptedError:  # a forwarded signal: look again on the next round
            pass
        if proc.poll() is None:
            return False
        os.close(fd)  # the job is reaped: its pidfd is done with
        return True

    return ended


def _settle(proc: subprocess.Popen, run_id: str, grace: float) -> None:
    """The launcher exited: processes of the job it left behind get ``grace`` s, SIGTERM, then SIGKILL."""
    end = time.monotonic() + min(grace, 2.0)
    while _job_pids(run_id):  # one scan of /proc when nothing is left (the usual end), not two
        if time.monotonic() >= end:
            _stop(proc, run_id, grace)
            return
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------------
# The verdict


def _read_live(watch: _Watch, run_dir: str, wait: float, only_read: bool = False) -> list:
    from ddpdoctor.postmortem.stacks import RankProcess, read_stacks

    live = [p for p in watch.live_ranks() if _running(p.pid)] or \
        [p for p in watch.procs.values() if p.alive and _running(p.pid)]
    procs = [RankProcess(p.pid, p.rank, run_dir=run_dir, index=p.index) for p in live]
    readings = read_stacks(procs, wait)
    return [r for r in readings if r.stack or not only_read]


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


def _tail(path: str, limit: int = 8 << 20) -> str:
    """The log's last ``limit`` bytes (the failure is at the end; a huge log must not stall the verdict)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - limit))
        return f.read().decode("utf-8", errors="replace")


def _verdict(spec: RunSpec, run_dir: str, watch: _Watch, kind: str, headline: str, readings: list,
             code: Optional[int] = None, watches: Optional[Watches] = None) -> list:
    """The verdict: cause first, then where the others were, the launcher's part, explain; saved."""
    from ddpdoctor.causes.matcher import explain_text, first_failure
    from ddpdoctor.postmortem.explain import render_matches
    from ddpdoctor.postmortem.stacks import render_groups

    text = _tail(os.path.join(run_dir, RAW_LOG))
    matches = explain_text(text)
    first = first_failure(text)
    dead = watch.first_death()
    cause = None
    if dead is not None:
        cause = f"{dead.label} {dead.death()}"
    if first and (dead is None or dead.end is None or dead.end.get("how") != "raised"):
        cause = first  # the launcher's report names the exception when the hook could not (mp.spawn, torchrun)
    lines = [f"ddpdoctor run: {headline}" + (f"; cause: {cause}" if cause and kind != "hung" else "")]
    if kind == "hung" and cause:
        lines.append(f"  before it hung: {cause}")
    if readings:
        if kind != "hung":
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
        lines += ["  " + line for line in render_matches(matches, f"explain ({RAW_LOG})", first)]
    if watches is not None and watches.findings:
        lines += [f"  silent bug: {line}" for line in watches.summary()]
    lines.append(f"  saved in {run_dir} ({RAW_LOG}, stacks.txt, verdict.txt, verdict.json)")
    _write_private(os.path.join(run_dir, "stacks.txt"), "".join(
        f"--- {r.proc.label} (pid {r.proc.pid}), read with {r.method}: {r.place}\n{r.stack or r.error}\n"
        for r in readings))
    _write_private(os.path.join(run_dir, "verdict.txt"), "\n".join(lines) + "\n")
    _write_private(os.path.join(run_dir, "verdict.json"), json.dumps({
        "schema": 1, "kind": kind, "headline": headline, "exit_code": code, "cause": cause, "first_failure": first,
        "causes": [m.to_dict() for m in matches],
        "stacks": [{"rank": r.proc.rank, "pid": r.proc.pid, "method": r.method, "place": r.place} for r in readings],
        "ranks": [{"rank": p.rank, "index": p.index, "pid": p.pid,
                   "state": "alive" if p.alive else (p.death() or "exited with code 0")} for p in watch.ranks()],
        "deaths": [{"rank": p.rank, "pid": p.pid, "how": p.death()} for p in watch.deaths],
        "findings": watches.to_json() if watches is not None else []}, indent=2))
    return lines


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run_job(spec: RunSpec) -> int:
    """Run ``spec.command``; returns the job's exit code, or 124 when it hung.

    Raises:
        UsageError: the run directory cannot be used or the command cannot be started.
    """
    from ddpdoctor.errors import UsageError

    window = window_from_env(dict(os.environ))
    rd = _prepare_dir(spec)
    run_dir = rd.path
    run_id = uuid.uuid4().hex
    env = job_env(run_dir, rd.inject, dict(os.environ), run_id)
    env.setdefault("DDPDOCTOR_BEAT_S", f"{max(0.05, min(1.0, spec.hang_timeout / 10)):g}")
    env.update(watch_env(spec.no_watch))
    tee = _Tee(os.path.join(run_dir, RAW_LOG))
    watchdog = _Watchdog(run_id)  # first: from here on, our death takes the job with it
    started = time.monotonic()
    try:
        proc = subprocess.Popen(spec.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        tee.close()
        watchdog.done()
        _remove_dir(rd)
        raise UsageError("cannot-start", f"cannot start {spec.command[0]!r}: {exc.strerror}",
                         "check the command after --") from None
    watchdog.tell(f"pgid {proc.pid}")
    tee.start(proc.stdout, sys.stdout.buffer)
    tee.start(proc.stderr, sys.stderr.buffer)
    watch = _Watch(run_dir)
    stragglers = StragglerWatch(run_dir, spec.straggler_window, spec.straggler_windows)
    watches = Watches(run_dir, window, env)
    forwarded: list = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        if len(forwarded) > 2:
            _signal_job(proc, run_id, signal.SIGKILL)
            return
        try:
            os.killpg(proc.pid, signum)
        except OSError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    verdict_kind: Optional[str] = None
    try:
        last_progress = last = time.monotonic()
        out_bytes = 0
        snapshot: list = []
        poll = max(POLL, min(1.0, spec.hang_timeout / 20))
        ended = _exit_waiter(proc)
        while proc.poll() is None:
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
            if watch.deaths and watch.live_ranks() and idle >= min(spec.hang_timeout, DEATH_GRACE):
                verdict_kind = "failed"
                if not snapshot:
                    snapshot = _read_live(watch, run_dir, wait=spec.stack_wait, only_read=True)
                dead = watch.first_death()
                lines = _verdict(spec, run_dir, watch, "failed",
                                 f"{dead.label if dead else 'a rank'} ended and the others were left waiting "
                                 f"(no progress for {idle:.0f}s)", snapshot, 1, watches)
                lines.append(f"  stopping the job (SIGTERM, SIGKILL after {spec.stop_grace:g}s); exit 1")
                _say(spec, lines)
                _stop(proc, run_id, spec.stop_grace)
                break
            if watch.procs and idle >= spec.hang_timeout:
                verdict_kind = "hung"
                readings = _read_live(watch, run_dir, spec.stack_wait)
                lines = _verdict(spec, run_dir, watch, "hung",
                                 f"hung: no rank made progress for {spec.hang_timeout:g}s", readings,
                                 int(ExitCode.HUNG), watches)
                if not spec.keep_hung:
                    lines.append(f"  stopping the job (SIGTERM, SIGKILL after {spec.stop_grace:g}s); "
                                 f"exit {int(ExitCode.HUNG)}")
                _say(spec, lines)
                if not spec.keep_hung:
                    _stop(proc, run_id, spec.stop_grace)
                    break
        proc.wait()
        _settle(proc, run_id, spec.stop_grace)
    except BaseException:
        _leave_nothing(proc, run_id)
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        tee.close()
        watchdog.done()
    watch.discover()
    watch.sample(POLL)
    late = watches.finish(watch.ranks())
    if late:
        _say(spec, [f"ddpdoctor run: {line}" for line in late])
    code = _exit_code(proc.returncode)
    elapsed = time.monotonic() - started
    if verdict_kind == "hung" and not spec.keep_hung:
        return ExitCode.HUNG
    if verdict_kind == "failed":
        return 1
    if verdict_kind is None and not forwarded and (code != 0 or watch.deaths):
        head = f"the job failed (exit {code})" if code != 0 else "the job exited 0, but a rank failed"
        _say(spec, _verdict(spec, run_dir, watch, "failed", head, snapshot, code, watches))
        return code
    if verdict_kind is None and not forwarded and code == 0:
        n = len(watch.ranks())
        who = f"{n} rank{'s' if n != 1 else ''}" if n else "1 process"
        kept = spec.keep
        line = f"ddpdoctor run: {who}, exit 0 in {elapsed:.0f} s, no hang, no rank died"
        slow = stragglers.summary()
        if slow:
            line += f"; {len(slow)} straggler{'s' if len(slow) != 1 else ''}: " + "; ".join(slow)
        if watches.findings:
            n = len(watches.findings)
            line += (f"; {n} silent bug{'s' if n != 1 else ''} found: " + "; ".join(watches.summary()) +
                     f"; saved in {run_dir} (verdict.txt, verdict.json)")
            _write_private(os.path.join(run_dir, "verdict.txt"), line + "\n")
            _write_private(os.path.join(run_dir, "verdict.json"), json.dumps({
                "schema": 1, "kind": "ok", "headline": f"exit 0, {n} silent bug{'s' if n != 1 else ''} found",
                "exit_code": code, "findings": watches.to_json()}, indent=2))
        elif kept:
            line += f"; kept {run_dir}"
        else:
            _remove_dir(rd)
        _say(spec, [line])
        return code
    if forwarded:
        _say(spec, [f"ddpdoctor run: stopped by {signal.Signals(forwarded[0]).name} (exit {code}); "
                    f"saved in {run_dir} ({RAW_LOG})"])
    return code


def _say(spec: RunSpec, lines: list) -> None:
    try:
        spec.err.write("\n".join(lines) + "\n")
        spec.err.flush()
    except (OSError, ValueError):
        pass
