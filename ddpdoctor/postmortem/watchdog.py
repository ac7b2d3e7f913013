"""The watchdog: starts the job's launcher for ``ddpdoctor run`` and ends the whole job if ``run`` dies,
even by SIGKILL, even the processes that left the job's session and cleared their environment.

How the job is tracked, by what a process cannot shed:

* **Ancestry (a child subreaper), everywhere on Linux.** The watchdog marks itself
  ``PR_SET_CHILD_SUBREAPER`` and starts the launcher as its own child. Every process of the job is
  then its descendant for good: a process whose parent ends (a daemonising double fork, a rank whose
  launcher died) is adopted by the nearest subreaper ancestor, the watchdog, never by init.
  ``setsid`` and a cleared environment do not change ancestry. The watchdog reaps what it adopts.
* **The environment tag**, as a second net: every process of the job inherits
  ``DDPDOCTOR_RUN_ID=<id>``; a tagged process of this user is part of the job wherever it is.
* **The launcher's process group**, killed first (it holds most of the job at once).

Not a cgroup: moving the job into a cgroup of its own would take it out of the one that Slurm,
Kubernetes or systemd put it in (their accounting, limits and cleanup), and ancestry already holds
every process of the job without moving anything.

The watchdog runs in its own session (a Ctrl-C, or a ``kill -9 -PGID`` aimed at ``run``'s group, does
not reach it) and outlives ``run``. Protocol, one line each:

* ``run`` -> watchdog (its stdin): ``{"argv": [...], "env": {...}}`` (JSON), later ``done``.
* watchdog -> ``run`` (its stdout): ``started PID`` or ``error ERRNO MESSAGE``, later ``exit CODE``
  (``Popen.returncode``'s convention: ``-N`` for signal N).

When its stdin reaches end-of-file without ``done`` (``run`` died: SIGKILL, a crash), it SIGKILLs the
launcher's process group, every descendant and every tagged process, until none is left, then exits.
SIGKILL because the job may ignore SIGTERM, and nobody is left to wait for a graceful end. After
``done`` it does the same to whatever is still below it (``run`` has already stopped the job).

Run as ``python -I -S watchdog.py RUN_ID STDIN_FD STDOUT_FD STDERR_FD`` (``-`` for no stdin: the job
reads /dev/null); standard library only (it starts in milliseconds).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

__all__ = ["tagged_pids", "descendants", "job_pids", "become_subreaper", "sweep", "main"]

_PR_SET_CHILD_SUBREAPER = 36


def tagged_pids(run_id: str) -> list:
    """PIDs of this user's processes whose environment holds ``DDPDOCTOR_RUN_ID=run_id``."""
    needle = f"DDPDOCTOR_RUN_ID={run_id}".encode()
    me, uid, out = os.getpid(), os.getuid(), []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid and uid != 0:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(name))
    return out


def _parents() -> dict:
    """``{pid: ppid}`` of every live (not zombie) process, from ``/proc/<pid>/stat``."""
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after the command name, which may hold spaces
        if len(fields) > 1 and fields[0] not in (b"Z", b"X"):
            out[int(name)] = int(fields[1])
    return out


def descendants(root: int) -> list:
    """PIDs of every live process below ``root`` (its children, theirs, ...), ``root`` excluded."""
    return _below(_parents(), root)


def _below(parents: dict, root: int) -> list:
    children: dict = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            if pid != root and pid not in out:
                out.append(pid)
                todo.append(pid)
    return out


def job_pids(root: int, run_id: str) -> list:
    """The job's live processes, in one pass over ``/proc``: those below ``root`` (the watchdog) and
    this user's processes tagged ``DDPDOCTOR_RUN_ID=run_id`` elsewhere (``root`` itself excluded)."""
    needle = f"DDPDOCTOR_RUN_ID={run_id}".encode()
    me, uid, parents, tagged = os.getpid(), os.getuid(), {}, []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) < 2 or fields[0] in (b"Z", b"X"):
            continue
        parents[pid] = int(fields[1])
        if pid in (me, root):
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid and uid != 0:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    tagged.append(pid)
        except OSError:
            continue
    below = _below(parents, root)
    return below + [p for p in tagged if p not in below]


def become_subreaper() -> bool:
    """Mark this process a child subreaper (Linux 3.4+): orphans below it are adopted by it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError, ImportError):
        return False


def _reap(launcher: int) -> object:
    """Reap every ended child; the launcher's ``returncode`` when it was among them, else None."""
    code = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code
        if pid == 0:
            return code
        if pid == launcher:
            code = os.waitstatus_to_exitcode(status)


def sweep(run_id: str, pgid: int = 0, deadline_s: float = 5.0, tagged: bool = True) -> int:
    """SIGKILL the job's process group, every descendant of this process and (``tagged``) every
    tagged process until none is left (reaping as it goes); how many were hit."""
    hit = 0
    end = time.monotonic() + deadline_s
    me = os.getpid()
    while True:
        if pgid > 1:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        pids = descendants(me) + (tagged_pids(run_id) if tagged else [])
        for pid in dict.fromkeys(pids):
            try:
                os.kill(pid, signal.SIGKILL)
                hit += 1
            except OSError:
                pass
        _reap(0)
        if not pids or time.monotonic() > end:
            return hit
        time.sleep(0.02)


def _say(line: str) -> None:
    try:
        os.write(1, line.encode("utf-8", "replace") + b"\n")
    except OSError:
        pass  # run is gone: nobody to tell


_IGNORED = (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE)  # by the watchdog; the job gets the defaults back


def _start(spec: dict, fds: list) -> int:
    """Start the launcher in a session of its own on the job's stdin/stdout/stderr; its PID.

    ``posix_spawnp``, not ``subprocess``: the job waits for this, and importing subprocess would cost
    the start of every job tens of milliseconds under load.
    """
    env = dict(spec["env"])
    env["DDPDOCTOR_RUN_PID"] = str(os.getpid())  # the launched command's parent: the hook's "top" test
    actions = [(os.POSIX_SPAWN_DUP2, fds[0], 0) if fds[0] >= 0 else
               (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
               (os.POSIX_SPAWN_DUP2, fds[1], 1), (os.POSIX_SPAWN_DUP2, fds[2], 2)]
    for fd in fds:
        if fd >= 0:
            os.set_inheritable(fd, False)  # only as 0, 1, 2 (dup2 makes those inheritable)
    argv = list(spec["argv"])
    return os.posix_spawnp(argv[0], argv, env, file_actions=actions, setsid=True, setsigdef=_IGNORED)


def main(argv: list) -> int:
    for s in _IGNORED:
        signal.signal(s, signal.SIG_IGN)
    become_subreaper()
    run_id = argv[1]
    fds = [-1 if a == "-" else int(a) for a in argv[2:5]]
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stdin = sys.stdin.buffer.raw
    first = b""
    while not first.endswith(b"\n"):
        chunk = os.read(0, 1 << 20) if select.select([0], [], [])[0] else b""
        if not chunk:
            return 0  # run died before it asked for anything
        first += chunk
    head, _, rest = first.partition(b"\n")
    launcher = 0
    try:
        launcher = _start(json.loads(head), fds)
        _say(f"started {launcher}")
    except OSError as exc:
        _say(f"error {exc.errno or 0} {exc.strerror or exc}")
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        _say(f"error 0 {exc}")
    for fd in fds:
        if fd >= 0:
            os.close(fd)  # the job's own copies are all that keep its output open now
    done, buf, reported = b"done" in rest.split(), b"", launcher == 0
    while True:
        ready = select.select([stdin, wake_r], [], [], 1.0)[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
        code = _reap(launcher)
        if code is not None and not reported:
            reported = True
            _say(f"exit {code}")
        if stdin in ready:
            chunk = os.read(0, 4096)
            if not chunk:
                break
            buf += chunk
            done = done or b"done" in buf.split()
    # run died: everything. After "done", run has stopped the job (both ways): what is still below
    # (a process that was starting while run looked) is all that can be left.
    sweep(run_id, 0 if done else launcher, deadline_s=5.0, tagged=not done)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
