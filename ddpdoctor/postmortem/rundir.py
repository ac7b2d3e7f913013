"""The run directory of ``ddpdoctor run``: where the job's output, stacks and verdict go, and the rule
that ddpdoctor removes only what it created.

Every run writes a marker, ``.ddpdoctor-run`` (JSON), into its directory before the job starts: the
files this run made (rewritten when the run ends, with everything it made by then), the names that
were there before it (never its own), and whether the list is complete (a run killed by SIGKILL
leaves ``"complete": false``). An existing ``--dir`` is used only when it is empty or holds that
marker; then only the files a marker lists are cleared before the new run (after an incomplete run,
also the names of ddpdoctor's own patterns that were not there before it). Any other existing folder
is refused (exit 2) before the job starts, and so is ``--dir ""`` (an unset variable, which would
mean the working directory). The cleanup after a successful run removes the listed files and the
marker, and the directory only when this run created it and nothing else is left in it.

A name counts as the run's only when it matches one of :data:`OWN_PATTERNS` (what the hook in the
ranks, PyTorch's Flight Recorder and the verdict write; a new file kind belongs there) or lies under
``.inject/``: a file the job itself writes into the folder (a checkpoint in ``--dir .``) is never
listed, so never removed.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Optional

from ddpdoctor.system.redact import escape_controls

__all__ = ["RunDir", "prepare_run_dir", "default_runs_root", "write_private", "inject_files", "remove_recorded",
           "MARKER", "OWN_PATTERNS", "HOOK_FILES", "take_records"]

MARKER = ".ddpdoctor-run"
INJECT = ".inject"
OWN_PATTERNS = (MARKER + ".*.tmp", "proc-*.json", "beat-*", "coll-*.txt", "stacks-*.txt", "exit-*.json", ".proc-*", ".exit-*",
                "output.raw.log", "stacks.txt", "verdict.txt", "verdict.json", "report.html", "trace.json", "flight-recorder-rank*",
                "finding-*.json", ".finding-*", "desync-*", ".desync-*", "bn-[0-9]*-*.json", ".bn-[0-9]*", "plan-*.json", ".plan-*",
                ".flight-recorder-rank*", "frdump-*.json", ".frdump-*", "fr-request", ".fr-request.*",
                "solo-*", ".solo-*", "count-*.json", ".count-*",
                "frprog-*.json", ".frprog-*", "torch-dump-rank*", "stackreq-*", "stackans-*.txt")
# what .inject/ holds from ddpdoctor/postmortem/inject/ (inject_files() adds the library's fingerprint and
# the stack thread, ddpdoctor/system/threadstacks.py)
HOOK_FILES = ("sitecustomize.py", "_ddpdoctor_recorder.py", "_ddpdoctor_watches.py")
FIXED_NAMES = (INJECT, "output.raw.log", "stacks.txt", "verdict.txt", "verdict.json", "report.html", "trace.json")  # what every run may write


def take_records(run_dir: str, pattern: str) -> list:
    """The JSON records the ranks left in ``run_dir`` under ``pattern`` (``desync-[0-9]*-*.json``), each
    removed once read: a record is read once. One being written (not yet renamed into place) or
    unreadable is left for the next look."""
    records = []
    for path in glob.glob(os.path.join(glob.escape(run_dir), pattern)):
        try:
            with open(path) as f:
                record = json.load(f)
            os.unlink(path)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def default_runs_root() -> str:
    """``$XDG_STATE_HOME/ddpdoctor/runs`` (``~/.local/state/ddpdoctor/runs`` when unset or relative)."""
    state = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "ddpdoctor", "runs")


def write_private(path: str, data: str) -> None:
    """Write a file of the run directory: never through a link, user-only.

    Raises:
        OSError: the file cannot be written (a full disk).
    """
    if os.path.islink(path):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(data)


def _own(name: str) -> bool:
    """A top-level name of one of ddpdoctor's own kinds (the marker and ``.inject`` included)."""
    return name in (MARKER, INJECT) or any(fnmatch.fnmatchcase(name, p) for p in OWN_PATTERNS)


@dataclass
class RunDir:
    """A prepared run directory.

    Args:
        path: the directory (absolute).
        inject: its ``.inject`` folder (the hook, on the job's ``PYTHONPATH``).
        created: this run created the directory itself (so it may remove it once it is empty).
        before: the top-level names that were in it when this run started: not this run's.
    """

    path: str
    inject: str
    created: bool
    before: frozenset = field(default_factory=frozenset)

    def made(self) -> list:
        """What this run made, relative to ``path``: its own kinds of top-level names not there before it,
        and everything under ``.inject/`` (folders end in ``/``, listed after their contents)."""
        try:
            names = sorted(os.listdir(self.path))
        except OSError:
            return []
        out = []
        for name in names:
            if name in self.before or not _own(name):
                continue
            full = os.path.join(self.path, name)
            if name == INJECT and os.path.isdir(full) and not os.path.islink(full):
                for root, dirs, files in os.walk(full, topdown=False):
                    rel = os.path.relpath(root, self.path)
                    out += [os.path.join(rel, f) for f in sorted(files + [d for d in dirs
                                                                          if os.path.islink(os.path.join(root, d))])]
                    out.append(rel + "/")
            else:
                out.append(name)
        return out

    def seal(self, complete: bool = True) -> Optional[str]:
        """Write the marker with everything this run made so far; the error in words when it cannot be
        written (a full disk), else None."""
        files = [n for n in self.made() if n != MARKER] + [MARKER]
        record = {"schema": 1, "tool": "ddpdoctor run", "complete": complete, "pid": os.getpid(),
                  "written": time.time(), "files": files, "before": sorted(self.before)}
        tmp = os.path.join(self.path, f"{MARKER}.{os.getpid()}.tmp")
        try:  # whole or not at all: a full disk leaves the earlier marker as it was, never an empty one
            write_private(tmp, json.dumps(record, indent=1) + "\n")
            os.replace(tmp, os.path.join(self.path, MARKER))
        except OSError as exc:
            _unlink(tmp)
            return f"{MARKER}: {exc.strerror or exc}"
        return None

    def remove(self) -> None:
        """Remove what this run made (and the marker); the directory too when this run created it and it
        is empty now. Never anything else, never through a link."""
        _remove_listed(self.path, self.made(), whole_inject=False)
        _unlink(os.path.join(self.path, MARKER))
        if self.created:
            try:
                os.rmdir(self.path)
            except OSError:
                pass


def _unlink(path: str) -> None:
    try:
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        pass


def _remove_listed(path: str, names: list, whole_inject: bool) -> None:
    """Remove ``names`` (relative; folders end in ``/`` and are removed only when empty) from ``path``.

    Only names of ddpdoctor's own kinds are touched, whatever a marker says; ``whole_inject``: the
    ``.inject`` folder is ours whole (a run that died before listing what Python cached there)."""
    folders = []
    for rel in names:
        parts = rel.rstrip("/").split("/")
        if not parts or any(p in ("", ".", "..") for p in parts) or os.path.isabs(rel) or not _own(parts[0]):
            continue
        full = os.path.join(path, *parts)
        if len(parts) > 1 and os.path.islink(os.path.join(path, parts[0])):
            continue  # never through a link planted in place of .inject
        if rel.endswith("/"):
            folders.append(full)
        else:
            _unlink(full)
    inject = os.path.join(path, INJECT)
    if whole_inject and os.path.isdir(inject) and not os.path.islink(inject):
        shutil.rmtree(inject, ignore_errors=True)
    for folder in sorted(folders, key=len, reverse=True):  # contents before their folder
        try:
            if os.path.islink(folder):
                os.unlink(folder)
            else:
                os.rmdir(folder)
        except OSError:
            pass


def _usage_error(message: str, hint: str) -> Exception:
    from ddpdoctor.errors import UsageError

    return UsageError("run-dir", message, hint)


def _read_marker(path: str, shown: str) -> dict:
    """The marker of an earlier run in ``path``.

    Raises:
        UsageError: the marker is a link, not a file, or not one ddpdoctor wrote.
    """
    marker = os.path.join(path, MARKER)
    hint = f"remove {os.path.join(shown, MARKER)} if this folder holds nothing of yours, or pass a new path"
    if os.path.islink(marker) or not os.path.isfile(marker):
        raise _usage_error(f"--dir {shown} holds a {MARKER} that is not a regular file", hint)
    try:
        with open(marker, encoding="utf-8") as f:
            record = json.load(f)
        if not (isinstance(record, dict) and isinstance(record.get("files"), list)
                and all(isinstance(n, str) for n in record["files"])):
            raise ValueError("not a run marker")
    except (OSError, ValueError) as exc:
        raise _usage_error(f"--dir {shown} holds a {MARKER} that cannot be read ({exc})", hint) from None
    return record


def _earlier_run(path: str, record: dict) -> tuple:
    """What the earlier run's marker lists (after a run that never finished its list: also the names of
    ddpdoctor's kinds that were not there before it), and whether its ``.inject`` is ours whole."""
    names = list(record["files"])
    whole_inject = INJECT + "/" in names
    if record.get("complete") is not True:
        before = set(n for n in record.get("before", []) if isinstance(n, str))
        whole_inject = whole_inject or INJECT not in before
        try:
            names += [n for n in os.listdir(path) if _own(n) and n not in before and n != INJECT]
        except OSError:
            pass
    return names, whole_inject


def remove_recorded(path: str, record: dict) -> bool:
    """Remove an earlier run's directory by its marker's ``record`` (``ddpdoctor run --prune``): what it
    lists (of ddpdoctor's own kinds only), the marker, then the directory when nothing else is left.
    True when the directory is gone; False when it holds files that are not ddpdoctor's (they stay)."""
    names, whole_inject = _earlier_run(path, record)
    _remove_listed(path, [n for n in names if n != MARKER], whole_inject)
    _unlink(os.path.join(path, MARKER))
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


def _reuse(path: str, shown: str) -> None:
    """Check that an existing ``--dir`` may be used, and clear the earlier run's files.

    Raises:
        UsageError: the folder holds files and no marker of an earlier run.
    """
    names = os.listdir(path)
    if not names:
        return
    if MARKER not in names:
        raise _usage_error(
            f"--dir {shown} is an existing folder with files in it and no {MARKER} marker (ddpdoctor run "
            f"did not create it, and removes only what it created)",
            "pass a new or empty directory, or leave --dir out for a new folder under "
            f"{default_runs_root()}")
    names, whole_inject = _earlier_run(path, _read_marker(path, shown))
    ours = {n.split("/", 1)[0] for n in names} | ({INJECT} if whole_inject else set())
    taken = sorted(set(os.listdir(path)) & set(FIXED_NAMES) - ours)
    if taken:  # checked before anything is cleared: a refused folder is left exactly as it was
        raise _usage_error(f"--dir {shown} holds {', '.join(taken)}, which its {MARKER} marker does not list "
                           "(not ddpdoctor's, and this run would write there)",
                           "move that file away, or pass a new or empty directory")
    _remove_listed(path, names, whole_inject)


def prepare_run_dir(run_dir: Optional[str]) -> RunDir:
    """Create (or reuse: empty, or an earlier run's) the run directory, user-only, with the hook in it
    and the marker written, before the job starts.

    Raises:
        UsageError: ``--dir ""``; the path is a symbolic link, not a directory, a folder that is not
            empty and holds no marker, or cannot be created.
    """
    from ddpdoctor.errors import UsageError

    explicit = run_dir is not None
    if explicit and not run_dir.strip():
        raise _usage_error(f"--dir {run_dir!r} is empty (an unset variable?); it would mean the working "
                           "directory", "pass a directory path, or leave --dir out for a new folder under "
                           f"{default_runs_root()}")
    if explicit:
        path = os.path.abspath(run_dir)
    else:
        path = os.path.join(default_runs_root(), f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    shown = escape_controls(run_dir) if explicit else path  # quoted in one line: no raw control characters
    created = False
    try:
        if os.path.islink(path):
            raise _usage_error(f"--dir {shown} is a symbolic link; ddpdoctor run does not write "
                               "through a link it did not create", "pass a real directory or a new path")
        if os.path.lexists(path):
            if not os.path.isdir(path):
                raise _usage_error(f"--dir {shown} exists and is not a directory", "pass a directory or a new path")
            _reuse(path, shown)
        else:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            os.mkdir(path, 0o700)
            created = True
        rd = RunDir(path, os.path.join(path, INJECT), created, frozenset(os.listdir(path)))
        note = rd.seal(complete=False)  # first: a run killed from here on leaves its files known
        if note:
            raise OSError(note)
        _write_hook(rd.inject)
        rd.seal(complete=False)
    except UsageError:
        raise
    except OSError as exc:
        if created:  # a new folder that cannot take the hook or the marker (a full disk): not left behind
            RunDir(path, os.path.join(path, INJECT), True).remove()
        raise _usage_error(f"cannot use --dir {shown}: {exc.strerror or exc}" if explicit else
                           f"cannot create the run directory {path}: {exc.strerror or exc}",
                           "pass a writable directory with --dir" if explicit else
                           "set XDG_STATE_HOME to a writable directory, or pass --dir") from None
    return rd


def inject_files() -> list:
    """(source, name in ``.inject``): the hook, the watches (:mod:`ddpdoctor.postmortem.watches`), the
    library's fingerprint they use, the Flight Recorder's dump and the thread that reads the stacks
    (:mod:`ddpdoctor.system.threadstacks`), as files: the job's interpreter need not be able to import
    ddpdoctor."""
    here = os.path.dirname(os.path.abspath(__file__))
    package = os.path.dirname(here)
    return [*((os.path.join(here, "inject", name), name) for name in HOOK_FILES),
            (os.path.join(package, "diagnostics", "fingerprint.py"), "_ddpdoctor_fingerprint.py"),
            (os.path.join(package, "system", "threadstacks.py"), "_ddpdoctor_threadstacks.py")]


def _write_hook(inject: str) -> None:
    """``.inject/``: the hook the ranks import and the modules it loads: the watches, the fingerprint and
    the Flight Recorder's dump (never written through a link)."""
    if os.path.islink(inject):
        os.unlink(inject)
    os.makedirs(inject, mode=0o700, exist_ok=True)
    for source, name in inject_files():
        target = os.path.join(inject, name)
        if os.path.lexists(target):
            os.unlink(target)
        with open(source, "rb") as src:
            data = src.read()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
