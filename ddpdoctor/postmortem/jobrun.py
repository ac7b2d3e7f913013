"""``ddpdoctor run``: run a training command unchanged, watch its ranks, explain a hang or a death.

Job states (the state machine of :func:`run_job`)::

    RUNNING --launcher exits-->                 FINISHED  (exit with the job's code; verdict if non-zero)
    RUNNING --no progress for hang_timeout-->   HUNG      (grouped stacks + explain, saved; then stop,
                                                           exit 124; with keep_hung: keep waiting)
    RUNNING --SIGINT/SIGTERM to us-->           forwarded to the launcher; it decides; exit with its code

What is added to the job (and nothing else): a ``sitecustomize.py`` on ``PYTHONPATH`` that, in each
rank, registers faulthandler on SIGUSR2 and keeps a one-line heartbeat of where the main thread is
(see :mod:`ddpdoctor.postmortem.inject.sitecustomize`); PyTorch's own NCCL timeout diagnostics
(``TORCH_NCCL_DUMP_ON_TIMEOUT=1``: the Flight Recorder writes its trace into the run directory) unless
the user set them. A rank counts as making progress when its main thread moved since the last look,
its CPU time grew by more than half a core, or the job wrote output. A job is stopped only after a
hang was reported (SIGTERM to the launcher's process group and the ranks, a deadline, then SIGKILL);
a healthy job is never signalled except to forward the user's own Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Optional

import psutil

from ddpdoctor.exitcodes import ExitCode

__all__ = ["RunSpec", "run_job", "job_env"]

POLL = 0.2
CPU_BUSY = 0.5  # core-seconds per second that count as progress


@dataclass
class RunSpec:
    """What ``ddpdoctor run`` was asked to do.

    Args:
        command: the launcher and training command, unchanged.
        hang_timeout: seconds without progress on any rank before the job counts as hung.
        run_dir: where output, stacks and the verdict go (default: ``./ddpdoctor-run-<time>-<pid>``).
        keep_hung: report a hang but leave the job running.
        stop_grace: seconds between SIGTERM and SIGKILL when stopping a hung job.
    """

    command: list
    hang_timeout: float = 300.0
    run_dir: Optional[str] = None
    keep_hung: bool = False
    stop_grace: float = 10.0
    stack_wait: float = 3.0
    err: IO = field(default_factory=lambda: sys.stderr)


@dataclass
class _Rank:
    pid: int
    rank: Optional[int]
    beat_file: str
    beat: bytes = b""
    cpu: float = 0.0
    alive: bool = True


def job_env(run_dir: str, inject_dir: str, base: dict) -> dict:
    """The job's environment: the user's, plus the handler on PYTHONPATH and PyTorch's own aids."""
    env = dict(base)
    env["PYTHONPATH"] = inject_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["DDPDOCTOR_RUN_DIR"] = run_dir
    env["DDPDOCTOR_RUN_PID"] = str(os.getpid())
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
    from importlib import metadata

    try:
        parts = metadata.version("torch").split("+")[0].split(".")
        return int(parts[0]), int(parts[1])
    except (metadata.PackageNotFoundError, ValueError, IndexError):
        return (0, 0)


def _prepare_dir(spec: RunSpec) -> tuple:
    run_dir = os.path.abspath(spec.run_dir or f"ddpdoctor-run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    inject = os.path.join(run_dir, ".inject")
    os.makedirs(inject, exist_ok=True)
    shutil.copy(os.path.join(os.path.dirname(__file__), "inject", "sitecustomize.py"), inject)
    return run_dir, inject


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _Tee:
    """Copies the job's stdout/stderr to ours and to ``output.log``; counts bytes (a progress signal)."""

    def __init__(self, log_path: str) -> None:
        self.log = open(log_path, "ab")
        self.lock = threading.Lock()
        self.bytes = 0
        self.threads: list = []

    def start(self, pipe: IO[bytes], sink: IO[bytes]) -> None:
        t = threading.Thread(target=self._pump, args=(pipe, sink), daemon=True)
        t.start()
        self.threads.append(t)

    def _pump(self, pipe: IO[bytes], sink: IO[bytes]) -> None:
        fd = pipe.fileno()
        while True:
            chunk = os.read(fd, 65536)
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
        self.log.close()


class _Watch:
    """The ranks of the job (found through the handler's ``proc-<pid>.json``) and their progress."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.ranks: dict = {}
        self.deaths: list = []
        self.launchers: set = set()

    def discover(self) -> None:
        for path in glob.glob(os.path.join(self.run_dir, "proc-*.json")):
            pid = int(os.path.basename(path)[5:-5])
            if pid in self.ranks or pid in self.launchers:
                continue
            try:
                with open(path) as f:
                    info = json.load(f)
            except (OSError, ValueError):
                continue
            rank = int(info["rank"]) if info.get("rank") not in (None, "") else None
            if rank is None and _is_launcher(info.get("argv") or []):
                self.launchers.add(pid)
                continue
            self.ranks[pid] = _Rank(pid, rank, info["beat_file"], cpu=_cpu(pid))

    def rank_procs(self) -> list:
        """Registered processes that are ranks (those with RANK; else the single launched process)."""
        with_rank = [r for r in self.ranks.values() if r.rank is not None]
        return with_rank or list(self.ranks.values())

    def progressed(self, dt: float) -> bool:
        moved = False
        for r in self.rank_procs():
            if not r.alive:
                continue
            if not psutil.pid_exists(r.pid) or _zombie(r.pid):
                r.alive = False
                self.deaths.append(r)
                continue
            try:
                with open(r.beat_file, "rb") as f:
                    beat = f.read(13)
            except OSError:
                beat = r.beat
            cpu = _cpu(r.pid)
            if beat != r.beat or (cpu - r.cpu) > CPU_BUSY * dt:
                moved = True
            r.beat, r.cpu = beat, cpu
        return moved


_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "accelerate", "deepspeed")


def _is_launcher(argv: list) -> bool:
    return any(os.path.basename(a) in _LAUNCHERS or a in _LAUNCHERS for a in argv[:3])


def _cpu(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _signal_job(proc: subprocess.Popen, ranks: list, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except OSError:
        pass
    for r in ranks:
        try:
            os.kill(r.pid, sig)
        except OSError:
            pass


def _stop(proc: subprocess.Popen, watch: _Watch, grace: float) -> None:
    """SIGTERM to the launcher's group and every rank, ``grace`` seconds, then SIGKILL."""
    everyone = list(watch.ranks.values())
    _signal_job(proc, everyone, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(psutil.pid_exists(r.pid) and not _zombie(r.pid) for r in everyone):
        time.sleep(0.05)
    _signal_job(proc, everyone, signal.SIGKILL)
    proc.wait()


def _read_live(watch: _Watch, run_dir: str, wait: float, only_read: bool = False) -> list:
    from ddpdoctor.postmortem.stacks import RankProcess, read_stacks

    live = [r for r in watch.rank_procs() if r.alive and psutil.pid_exists(r.pid) and not _zombie(r.pid)]
    readings = read_stacks([RankProcess(r.pid, r.rank, run_dir=run_dir) for r in live], wait)
    return [r for r in readings if r.stack or not only_read]


def _verdict(spec: RunSpec, run_dir: str, watch: _Watch, headline: str, with_stacks: bool,
             readings: Optional[list] = None) -> list:
    """Grouped stacks (when asked) and what explain makes of the log; saved in the run directory."""
    from ddpdoctor.causes.matcher import explain_text, first_failure
    from ddpdoctor.postmortem.explain import render_matches
    from ddpdoctor.postmortem.stacks import render_groups

    lines = [f"ddpdoctor run: {headline}"]
    readings = list(readings or [])
    if with_stacks:
        readings = _read_live(watch, run_dir, spec.stack_wait)
    if readings:
        if not with_stacks:
            lines.append("  where the other ranks were when the first one died:")
        lines += ["  " + line for line in render_groups(readings)]
    for r in watch.deaths:
        lines.append(f"  rank {r.rank if r.rank is not None else '?'} (pid {r.pid}) died")
    log_path = os.path.join(run_dir, "output.log")
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    matches = explain_text(text)
    first = first_failure(text)
    if matches or first:
        lines += ["  " + line for line in render_matches(matches, "explain (output.log)", first)]
    with open(os.path.join(run_dir, "stacks.txt"), "w") as f:
        for r in readings:
            f.write(f"--- {r.proc.label} (pid {r.proc.pid}), read with {r.method}: {r.place}\n{r.stack or r.error}\n")
    lines.append(f"  saved in {run_dir} (output.log, stacks.txt, verdict.txt, verdict.json)")
    with open(os.path.join(run_dir, "verdict.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(run_dir, "verdict.json"), "w") as f:
        json.dump({"schema": 1, "headline": headline, "first_failure": first,
                   "causes": [m.to_dict() for m in matches],
                   "stacks": [{"rank": r.proc.rank, "pid": r.proc.pid, "method": r.method, "place": r.place}
                              for r in readings],
                   "deaths": [{"rank": r.rank, "pid": r.pid} for r in watch.deaths]}, f, indent=2)
    return lines


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run_job(spec: RunSpec) -> int:
    """Run ``spec.command``; returns the job's exit code, or 124 when it hung.

    Raises:
        UsageError: the command cannot be started.
    """
    from ddpdoctor.errors import UsageError

    run_dir, inject = _prepare_dir(spec)
    env = job_env(run_dir, inject, dict(os.environ))
    env.setdefault("DDPDOCTOR_BEAT_S", f"{max(0.05, min(1.0, spec.hang_timeout / 10)):g}")
    tee = _Tee(os.path.join(run_dir, "output.log"))
    try:
        proc = subprocess.Popen(spec.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=_die_with_parent)
    except OSError as exc:
        tee.close()
        raise UsageError("cannot-start", f"cannot start {spec.command[0]!r}: {exc.strerror}",
                         "check the command after --") from None
    tee.start(proc.stdout, sys.stdout.buffer)
    tee.start(proc.stderr, sys.stderr.buffer)
    watch = _Watch(run_dir)
    forwarded: list = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        sig = signal.SIGKILL if len(forwarded) > 2 else signum
        _signal_job(proc, list(watch.ranks.values()) if sig == signal.SIGKILL else [], sig)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    hung = False
    try:
        last_progress = last = time.monotonic()
        out_bytes = 0
        deaths_seen = 0
        snapshot: list = []
        poll = max(POLL, min(1.0, spec.hang_timeout / 20))
        while proc.poll() is None:
            try:
                proc.wait(timeout=poll)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            watch.discover()
            moved = watch.progressed(now - last)
            if tee.bytes != out_bytes:
                moved, out_bytes = True, tee.bytes
            last = now
            if moved or not watch.ranks:
                last_progress = now
            if len(watch.deaths) > deaths_seen:
                deaths_seen = len(watch.deaths)
                if not snapshot:  # where the survivors were when a rank died (before torchrun stops them)
                    snapshot = _read_live(watch, run_dir, wait=1.0, only_read=True)
            if not hung and not forwarded and watch.ranks and now - last_progress >= spec.hang_timeout:
                hung = True
                lines = _verdict(spec, run_dir, watch,
                                 f"hung: no rank made progress for {spec.hang_timeout:g}s", True)
                if not spec.keep_hung:
                    lines.append(f"  stopping the job (SIGTERM, SIGKILL after {spec.stop_grace:g}s); "
                                 f"exit {int(ExitCode.HUNG)}")
                _say(spec, lines)
                if not spec.keep_hung:
                    _stop(proc, watch, spec.stop_grace)
                    break
        proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _reap(watch)
        tee.close()
    code = _exit_code(proc.returncode)
    if hung and not spec.keep_hung:
        return ExitCode.HUNG
    if code != 0 and not forwarded and not hung:
        _say(spec, _verdict(spec, run_dir, watch, f"the job failed (exit {code})", False, snapshot))
    return code


def _reap(watch: _Watch) -> None:
    """Nothing may outlive the command: kill ranks the launcher left behind."""
    for r in watch.ranks.values():
        if psutil.pid_exists(r.pid) and not _zombie(r.pid):
            try:
                os.kill(r.pid, signal.SIGKILL)
            except OSError:
                pass


def _say(spec: RunSpec, lines: list) -> None:
    spec.err.write("\n".join(lines) + "\n")
    spec.err.flush()
