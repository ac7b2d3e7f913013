"""The run's report as a document: every check's merged result, the world, the exit code; JSON schema 1."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ddpdoctor import __version__
from ddpdoctor.check import WorldInfo
from ddpdoctor.exitcodes import ExitCode
from ddpdoctor.errors import UsageError
from ddpdoctor.result import CheckResult, Status
from ddpdoctor.system.redact import redact_text, safe_data, safe_text

__all__ = ["save_json", "save_output", "said", "RunReport", "SCHEMA", "write_json_file", "write_file_atomically",
           "check_json_target", "redacted"]

SCHEMA = 1



@dataclass(frozen=True)
class RunReport:
    """One run over every rank: the world and one result per check."""

    world: WorldInfo
    results: tuple[CheckResult, ...]
    duration: float = 0.0
    interrupted: Optional[str] = None
    started: float = field(default_factory=time.time)
    #: every world the checks ran in, when there were several (``world`` is the first)
    worlds: tuple[WorldInfo, ...] = ()

    @property
    def status(self) -> Status:
        return max((r.status for r in self.results), default=Status.PASS)

    def exit_code(self, strict: bool = False) -> ExitCode:
        if self.interrupted:
            return ExitCode.INTERRUPTED
        worst = self.status
        if worst.is_failure or (strict and worst == Status.WARN):
            return ExitCode.CHECK_FAILED
        return ExitCode.OK

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status.label] = out.get(r.status.label, 0) + 1
        return out

    def to_dict(self, strict: bool = False) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tool": {"name": "ddpdoctor", "version": __version__},
            "status": self.status.label,
            "exit_code": int(self.exit_code(strict)),
            "interrupted": self.interrupted,
            "started": round(self.started, 3),
            "duration": round(self.duration, 4),
            "world": self.world.to_dict(),
            "worlds": [w.to_dict() for w in self.worlds or (self.world,)],
            "counts": self.counts(),
            "checks": [r.to_dict() for r in self.results],
        }

    def write_json(self, path: str, strict: bool = False) -> None:
        """Write :meth:`to_dict` to ``path`` (see :func:`write_json_file`)."""
        write_json_file(path, self.to_dict(strict))


def redacted(value: Any) -> Any:
    """``value`` (JSON-like) with every string redacted and escaped (:func:`~ddpdoctor.system.redact.safe_data`):
    what the JSON report holds is what the terminal shows."""
    return safe_data(value)


def save_json(path: str, doc: Any, code: int) -> int:
    """Write the ``--json`` report once the terminal report is out; the command's exit code.

    When the file cannot be written (disk full, permissions), one line says so on standard error and the
    code is 74 (output failed) if the verdict was 0: a CI gate must not pass without its report, and it is
    no usage error (the work ran). A failing verdict (1) keeps its own code.
    """
    return said(*save_output(path, lambda: write_json_file(path, doc), code, "--json"))


def save_output(path: str, write: Callable[[], None], code: int, flag: str) -> tuple[int, Optional[str]]:
    """Run ``write`` (the file ``--json`` or ``--html`` asked for, written after the terminal report);
    the command's exit code and, when the write failed (disk full, permissions), the one line that says
    so: 74 (output failed) if the verdict was 0, a failing verdict keeping its own code."""
    try:
        write()
    except OSError as exc:
        kind = flag.lstrip("-")
        return (int(ExitCode.OUTPUT_FAILED) if code == 0 else code,
                f"error[{kind}-write]: cannot write {safe_text(path)}: {exc.strerror or exc}; the report above is "
                f"complete; free space there or choose another {flag} path")
    return code, None


def said(code: int, line: Optional[str]) -> int:
    """``code``, after ``line`` (if any) on standard error."""
    if line:
        import sys

        print(line, file=sys.stderr, flush=True)
    return code


def check_json_target(path: str, flag: str = "--json") -> None:
    """Refuse, before any work, a path that :func:`write_json_file` would not write.

    Raises:
        UsageError: a symbolic link, a directory or another non-regular file, a folder that does not
            exist or cannot be written.
    """
    import stat

    shown = redact_text(path).encode("unicode_escape").decode("ascii")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UsageError("json-path", f"{flag} {shown}: {exc.strerror}", "choose a writable path") from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise UsageError("json-path", f"{flag} {shown} is a symbolic link; ddpdoctor does not write through links",
                         "remove the link or choose another path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UsageError("json-path", f"{flag} {shown} exists and is not a regular file", "choose a file path")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError("json-path", f"{flag} {shown}: the folder {folder} does not exist",
                         "create it first or choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError("json-path", f"{flag} {shown}: the folder {folder} is not writable",
                         "choose a path in a folder you can write")


def write_json_file(path: str, doc: Any) -> None:
    """Write ``doc`` (redacted) as JSON to ``path`` atomically (see :func:`write_file_atomically`).

    Raises:
        UsageError: ``path`` is a link or not a regular file (see :func:`check_json_target`).
        OSError: the folder cannot be written (disk full, permissions).
    """
    write_file_atomically(path, json.dumps(redacted(doc), indent=2) + "\n")


def write_file_atomically(path: str, text: str, flag: str = "--json") -> None:
    """Write ``text`` to ``path`` (``--json``'s or ``--html``'s, named by ``flag``): a new file beside it,
    then a rename.

    An existing regular file is replaced whole (readers never see half a report; its permissions are
    kept); a symbolic link at ``path`` is refused, never written through or replaced.

    Raises:
        UsageError: ``path`` is a link or not a regular file (see :func:`check_json_target`).
        OSError: the folder cannot be written (disk full, permissions).
    """
    import tempfile

    check_json_target(path, flag)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        if os.path.islink(path):  # planted while we wrote: refuse rather than replace it
            raise UsageError("json-path", f"{flag} {path} became a symbolic link", "remove the link")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
