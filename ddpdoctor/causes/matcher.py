"""Find the catalogue's causes in an error message or a whole job log.

A log may interleave several ranks (torchrun's ``[rank1]:`` or ``[default1]:`` prefixes, NCCL's
``[Rank 1]``) and end with torchrun's ChildFailedError summary (``rank : 1``, ``exitcode : -9``);
each match remembers the ranks it came from.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from ddpdoctor.causes.catalogue import CAUSES, Cause
from ddpdoctor.causes.evidence import refine
from ddpdoctor.system.signals import signal_hint

__all__ = ["Match", "explain_text", "first_failure", "ranks_of_lines"]

@dataclass
class Match:
    """A cause found in the text: the ranks that said it and the first line that did."""

    cause: Cause
    ranks: set = field(default_factory=set)
    evidence: str = ""
    count: int = 0
    extra: str = ""

    def to_dict(self) -> dict:
        return {"id": self.cause.id, "title": self.cause.title, "ranks": sorted(self.ranks),
                "evidence": self.evidence, "count": self.count, "meaning": self.meaning,
                "confirm": self.cause.confirm, "fix": self.fix}

    @property
    def meaning(self) -> str:
        return self.cause.meaning + (f" {self.extra}" if self.extra else "")

    @property
    def fix(self) -> str:
        if self.cause.id == "killed-by-signal" and self.extra:
            return self._signal_fix()
        return self.cause.fix

    def _signal_fix(self) -> str:
        name = self.extra.split()[0].rstrip(".") if self.extra else ""
        try:
            return signal_hint(int(signal.Signals[name]))
        except KeyError:
            return signal_hint(-1)



_PREFIX = re.compile(r"^\s*\[(?:rank|default|Rank )(\d+)\]:?")



_NCCL_RANK = re.compile(r"\[(?:PG [^\]]*)?Rank (\d+)\]")



_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")



_LOOPBACK = re.compile(r"\b127\.\d+\.\d+\.\d+\b|\[::1\]|localhost")



_STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")



_SUMMARY_END = re.compile(r"^\s*(\[\d+\]:|Root Cause|Other Failures|=+\s*$)")



def ranks_of_lines(lines: Sequence[str]) -> list:
    """The rank each line came from (``None`` when it does not say), using prefixes and summaries."""
    ranks: list = []
    summary_rank: Optional[int] = None
    for line in lines:
        m = _PREFIX.match(line)
        if m:
            ranks.append(int(m.group(1)))
            continue
        s = _SUMMARY_RANK.match(line)
        if s:
            summary_rank = int(s.group(1))
        elif _SUMMARY_END.match(line):
            summary_rank = None
        n = _NCCL_RANK.search(line)
        ranks.append(int(n.group(1)) if n else summary_rank)
    return ranks



def _signal_name(m: re.Match) -> str:
    token = m.group(1) if m.groups() else ""
    if token.isdigit():
        try:
            return signal.Signals(int(token)).name
        except ValueError:
            return f"signal {token}"
    return token



def _first_hit(line: str, table: list):
    """The first cause (in table order) whose regex matches ``line``, with the regex match."""
    for cause, regexes in table:
        for rx in regexes:
            m = rx.search(line)
            if m and not (cause.id == "killed-by-signal" and _signal_name(m) in _STOP_SIGNALS):
                return cause, m  # SIGTERM/SIGINT is how torchrun or a scheduler stops survivors
    return None, None



def explain_text(text: str, causes: Iterable[Cause] = CAUSES) -> list:
    """Every known cause in ``text``, in table order, with the ranks that reported it.

    One cause per line: the most specific (earliest in the table) wins.
    """
    lines = text.splitlines()
    found: dict = {}
    table = [(c, c.compiled()) for c in causes]
    for line, rank in zip(lines, ranks_of_lines(lines)):
        cause, m = _first_hit(line, table)
        if cause is None:
            continue
        match = found.setdefault(cause.id, Match(cause))
        match.count += 1
        if not match.evidence:
            match.evidence = _PREFIX.sub("", line).strip()[:240]
        if rank is not None:
            match.ranks.add(rank)
        if cause.id == "killed-by-signal" and not match.extra:
            match.extra = f"{_signal_name(m)}."
        if cause.id == "gloo-connect-full-mesh" and _LOOPBACK.search(line):
            match.extra = ("The address in the message is a loopback address: on a multi-node job this "
                           "node's hostname resolves to loopback, so the other nodes cannot reach it.")
    refine(lines, found, {c.id: c for c, _ in table}, Match)  # counts, settings, versions; generic vs specific
    if "port-in-use" in found and "rendezvous-unreachable" in found:
        # EADDRINUSE on the master makes the others time out: the timeout is a consequence.
        found["rendezvous-unreachable"].extra = "Here most likely because the master could not listen (port-in-use)."
    return [found[c.id] for c, _ in table if c.id in found]



_ROOT = re.compile(r"Root Cause \(first observed failure\)")



_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")



_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt)\b:?.*")



_TB_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')



def first_failure(text: str) -> Optional[str]:
    """torchrun's root cause in one line: ``rank 1 exited with code 1: RuntimeError: boom (train.py:22)``.

    Returns None when the text has no torchrun failure summary.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _ROOT.search(line)), None)
    if start is None:
        return None
    rank = code = None
    for line in lines[start:start + 12]:
        r, c = _SUMMARY_RANK.match(line), _EXITCODE.match(line)
        if r and rank is None:
            rank = int(r.group(1))
        if c and code is None:
            code = int(c.group(1))
    if rank is None or code is None:
        return None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} was killed by {name}"
    exc, where = "", ""
    for line, lr in zip(lines, ranks_of_lines(lines)):
        if lr != rank:
            continue
        body = _PREFIX.sub("", line).strip()
        f = _TB_FRAME.search(body)
        if f and "/site-packages/" not in f.group("file") and "/lib/python" not in f.group("file"):
            where = f"{f.group('func')} ({'/'.join(f.group('file').split('/')[-2:])}:{f.group('line')})"
        elif _EXC_LINE.match(body) and not body.startswith("Traceback"):
            exc = body if len(body) <= 160 else body[:157] + "..."
    text_out = f"rank {rank} exited with code {code}"
    if exc:
        text_out += f": {exc}"
    if where:
        text_out += f" at {where}"
    return text_out
