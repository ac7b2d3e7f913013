"""The run's report on a terminal: one line per check, details with -v, the header and the footer.

Status glyphs live here and only here. Plain ASCII when the stream is not a TTY or NO_COLOR is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import IO, Optional, Sequence

from ddpdoctor import __version__
from ddpdoctor.check import WorldInfo
from ddpdoctor.report.document import RunReport
from ddpdoctor.report.progress import Progress
from ddpdoctor.result import CheckResult, Status
from ddpdoctor.system.redact import safe_text

__all__ = ["Style", "render", "render_result", "header", "footer", "command_seconds", "TerminalProgress"]

_GLYPHS = {
    Status.PASS: ("✓", "[ok]"),
    Status.SKIP: ("-", "[skip]"),
    Status.WARN: ("!", "[warn]"),
    Status.FAIL: ("✗", "[FAIL]"),
    Status.TIMEOUT: ("⧗", "[TIME]"),
    Status.CRASH: ("✗", "[CRASH]"),
}
_COLORS = {Status.PASS: "32", Status.SKIP: "2", Status.WARN: "33", Status.FAIL: "31",
           Status.TIMEOUT: "35", Status.CRASH: "31;1"}


@dataclass(frozen=True)
class Style:
    """How to draw: unicode glyphs and colors for a TTY, ASCII otherwise."""

    fancy: bool = False

    @classmethod
    def for_stream(cls, stream: IO[str]) -> "Style":
        tty = hasattr(stream, "isatty") and stream.isatty()
        return cls(fancy=bool(tty) and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb")

    def glyph(self, status: Status) -> str:
        fancy, plain = _GLYPHS[status]
        if not self.fancy:
            return plain.ljust(7)
        return f"\x1b[{_COLORS[status]}m{fancy}\x1b[0m"

    def dim(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[0m" if self.fancy else text


def _line(result: CheckResult, style: Style, width: int) -> str:
    return f"{style.glyph(result.status)} {result.name.ljust(width)}  {safe_text(result.summary)}  " \
           f"{style.dim(f'({result.duration:.2f}s)')}"


def render_result(result: CheckResult, style: Style, width: int, verbose: bool) -> list[str]:
    """The result's lines; text quoted from outside (logs, names, variables) is redacted and escaped."""
    lines = [_line(result, style, width)]
    pad = " " * (8 if not style.fancy else 2) + " " * (width + 2)
    if result.hint:
        lines.append(f"{pad}{'fix' if result.status >= Status.WARN else 'tip'}: {safe_text(result.hint)}")
    if not verbose:
        return lines
    for d in result.details:
        lines.append(f"{pad}{safe_text(d)}")
    statuses = {o.status for o in result.outcomes}
    for o in result.outcomes:
        if o.status == Status.PASS and len(statuses) == 1 and not o.details:
            continue
        lines.append(f"{pad}rank {o.rank}: {o.status.label}: {safe_text(o.summary)}")
        if o.status >= Status.WARN and o.hint and o.hint != result.hint:
            lines.append(f"{pad}  fix: {safe_text(o.hint)}")
        for d in o.details:
            lines.append(f"{pad}  {safe_text(d)}")
    return lines


def header(world: WorldInfo) -> str:
    nodes = world.nodes
    where = f"{world.launcher} job" if world.mode == "joined" else "local world"
    return (f"ddpdoctor {__version__}: {where} of {world.world_size} rank{'s' if world.world_size != 1 else ''} "
            f"({world.backend}) on {nodes} node{'s' if nodes != 1 else ''}"
            + (f": {world.purpose}" if world.purpose else ""))


def footer(report: RunReport, strict: bool, code: Optional[int] = None, seconds: Optional[float] = None) -> str:
    """The last line: counts, time and exit code.

    ``code``: the command's real exit code when it differs from the report's (``--json`` not written: 74);
    ``seconds``: the whole command's time (start-up and world included), else the report's own.
    """
    order = ["pass", "warn", "fail", "timeout", "crash", "skip"]
    names = {"pass": "passed", "warn": "warned", "fail": "failed", "timeout": "timed out", "crash": "crashed",
             "skip": "skipped"}
    counts = report.counts()
    parts = [f"{counts[k]} {names[k]}" for k in order if counts.get(k)]
    took = report.duration if seconds is None else seconds
    shown = int(report.exit_code(strict)) if code is None else int(code)
    text = f"{', '.join(parts) or 'no checks'} in {took:.1f}s; exit {shown}"
    if report.interrupted:
        text += f" (interrupted by {report.interrupted})"
    return text


def command_seconds() -> Optional[float]:
    """Seconds since this process started (interpreter start-up and imports included): the time a user
    waited for the command, which the footer reports; None when the system does not say.

    Read from ``/proc/self/stat`` against the boot clock (10 ms ticks): psutil's ``create_time`` adds the
    boot time, which Linux gives in whole seconds, and is off by up to a second.
    """
    import time

    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, counted after the command's name
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def render(report: RunReport, style: Style, verbose: bool = False, strict: bool = False,
           with_header: bool = True) -> str:
    width = max((len(r.name) for r in report.results), default=4)
    lines = [header(report.world)] if with_header else []
    worlds = {w.purpose: w for w in report.worlds}
    shown = report.world.purpose
    for r in report.results:
        purpose = r.world.get("purpose", "")
        if with_header and purpose != shown and purpose in worlds:  # a run in several worlds: one header each
            lines.append(header(worlds[purpose]))
            shown = purpose
        lines.extend(render_result(r, style, width, verbose))
    lines.append(footer(report, strict))
    return "\n".join(lines)


class TerminalProgress(Progress):
    """Shows each check as it starts (TTY only) and prints its line as it ends."""

    def __init__(self, stream: IO[str], style: Style, verbose: bool, names: Sequence[str]) -> None:
        self.stream = stream
        self.style = style
        self.verbose = verbose
        self.width = max((len(n) for n in names), default=4)
        self.printed: list[str] = []

    def greeted(self, world: WorldInfo) -> None:
        self.stream.write(header(world) + "\n")
        self.stream.flush()

    def started(self, name: str) -> None:
        if self.style.fancy:
            self.stream.write(f"\r… {name} ")
            self.stream.flush()

    def finished(self, result: CheckResult) -> None:
        if self.style.fancy:
            self.stream.write("\r\x1b[K")
        self.stream.write("\n".join(render_result(result, self.style, self.width, self.verbose)) + "\n")
        self.stream.flush()
        self.printed.append(result.name)
