"""Find the catalogue's causes in an error message or a whole job log.

A log may interleave several ranks (torchrun's ``[rank1]:`` or ``[default1]:`` prefixes, NCCL's
``[Rank 1]``) and end with torchrun's ChildFailedError summary (``rank : 1``, ``exitcode : -9``);
each match remembers the ranks it came from.
"""

from __future__ import annotations

import re
import signal
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

from ddpdoctor.causes.catalogue import CAUSES, Cause
from ddpdoctor.causes.evidence import refine
from ddpdoctor.system.redact import shorten, shorten_middle
from ddpdoctor.system.signals import signal_hint
from ddpdoctor.system.stackframes import is_user, shown_path

__all__ = ["Match", "explain_text", "first_failure", "ranks_of_lines", "LogScanner", "ScanResult", "scan_text",
           "LINE_CAP"]

@dataclass
class Match:
    """A cause found in the text: the ranks that said it and the first line that did."""

    cause: Cause
    ranks: set = field(default_factory=set)
    evidence: str = ""
    count: int = 0
    extra: str = ""
    groups: dict = field(default_factory=dict)  # the first match's named groups: fill ``{name}`` in the text
    ranked: list = field(default_factory=list)  # a family's candidates as the log's evidence ordered them
    decided: bool = False  # the log's evidence decided a family: it is named as its one cause

    def to_dict(self) -> dict:
        doc = {"id": self.cause.id, "title": self.cause.title, "ranks": sorted(self.ranks),
               "evidence": self.evidence, "count": self.count, "meaning": self.meaning,
               "confirm": self.confirm, "fix": self.fix}
        if self.candidates:
            doc["candidates"] = [{"id": cid, "how_to_tell": how} for cid, how in self.candidates]
        return doc

    @property
    def candidates(self) -> list:
        """A family's candidate causes, likeliest first, as (id, how to tell); empty for a single cause, and
        for a family the log's evidence decided (``decided``)."""
        return [] if self.decided else list(self.ranked or self.cause.candidates)

    @property
    def meaning(self) -> str:
        """What the message means: the family's own text while the log leaves it a family (``undecided``)."""
        text = self.cause.undecided if self.cause.undecided and self.candidates else self.cause.meaning
        return _fill(text, self.groups) + (f" {self.extra}" if self.extra else "")

    @property
    def fix(self) -> str:
        if self.cause.id == "killed-by-signal" and self.extra:
            return self._signal_fix()
        return _fill(self.cause.fix, self.groups)

    @property
    def confirm(self) -> str:
        return _fill(self.cause.confirm, self.groups)

    def _signal_fix(self) -> str:
        name = self.extra.split()[0].rstrip(".") if self.extra else ""
        try:
            return signal_hint(int(signal.Signals[name]))
        except KeyError:
            return signal_hint(-1)



def _fill(text: str, groups: dict) -> str:
    """``{name}`` in a catalogue text replaced by the named group of the same name (unknown names stay)."""
    if not groups or "{" not in text:
        return text
    return re.sub(r"\{(\w+)\}", lambda m: str(groups.get(m.group(1), m.group(0))), text)



# Every number read with int() below has at most 9 digits and ends there (a rank, an exit code, a process
# index): int() refuses more than 4300 digits (a log line with a 5,000-digit rank ended explain with exit 3),
# and a longer number is no rank. The evidence pass (evidence.py) bounds its numbers the same way.
_PREFIX = re.compile(r"^\s*\[(?:rank|default|Rank )(\d{1,9})\]:?")



_NCCL_RANK = re.compile(r"\[(?:PG [^\][\n]*)?Rank (\d{1,9})\]")  # no "[" inside: linear



_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d{1,9})(?!\d)")



_LOOPBACK = re.compile(r"\b127\.\d+\.\d+\.\d+\b|\[::1\]|localhost")



_STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")



_SUMMARY_END = re.compile(r"^\s*(\[\d+\]:|Root Cause|Other Failures|=+\s*$)")



_SPAWN_BLOCK = re.compile(r"^-- Process (\d{1,9}) terminated with the following error:")



_SPAWN_EXITED = re.compile(r"ProcessExitedException: process (\d{1,9}) terminated with "
                           r"(?:exit code (-?\d{1,9})(?!\d)|signal (\w{1,32})\b)")



def ranks_of_lines(lines: Sequence[str]) -> list:
    """The rank each line came from (``None`` when it does not say), using prefixes and summaries.

    ``mp.spawn``'s report (``-- Process 1 terminated with the following error:`` and the child's
    traceback after it, up to its exception line) belongs to that process index.
    """
    ranks: list = []
    summary_rank: Optional[int] = None
    spawn_rank: Optional[int] = None
    for line in lines:
        m = _PREFIX.match(line)
        if m:
            ranks.append(int(m.group(1)))
            continue
        sp = _SPAWN_BLOCK.match(line)
        if sp:
            spawn_rank = int(sp.group(1))
            ranks.append(spawn_rank)
            continue
        if spawn_rank is not None:
            ranks.append(spawn_rank)
            if line and not line[0].isspace() and not line.startswith(("Traceback", "The above exception",
                                                                          "During handling")):
                spawn_rank = None  # the child's exception line ends its traceback
            continue
        ex = _SPAWN_EXITED.search(line)
        if ex:
            ranks.append(int(ex.group(1)))
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



def _first_hit(line: str, table: list, rank: Optional[int] = None):
    """The first cause (in table order) whose regex matches ``line``, with the regex match."""
    for cause, regexes in table:
        if cause.from_ranks and rank is None:
            continue
        for rx in regexes:
            m = rx.search(line)
            if m and not (cause.id == "killed-by-signal" and _signal_name(m) in _STOP_SIGNALS):
                return cause, m  # SIGTERM/SIGINT is how torchrun or a scheduler stops survivors
    return None, None





_ROOT_TEXT = "Root Cause (first observed failure)"



_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d{1,9})(?!\d)")



_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt)\b:?.*")



_TB_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')



def _spawn_failure(lines: Sequence[str]) -> Optional[str]:
    """``mp.spawn``'s report in one line: ``process 1 of mp.spawn raised RuntimeError: boom at train
    (proj/train.py:22)``, ``... exited with code 3`` or ``... was killed by SIGKILL``."""
    for i, line in enumerate(lines):
        ex = _SPAWN_EXITED.search(line)
        if ex:
            who = f"process {ex.group(1)} of mp.spawn"
            return f"{who} was killed by {ex.group(3)}" if ex.group(3) else f"{who} exited with code {ex.group(2)}"
        sp = _SPAWN_BLOCK.match(line)
        if not sp:
            continue
        exc, where = "", ""
        for body in lines[i + 1:]:
            f = _TB_FRAME.search(body)
            if f:
                if is_user(f.group("file")):
                    where = f"{f.group('func')} ({shown_path(f.group('file'))}:{f.group('line')})"
                continue
            if body and not body[0].isspace() and not body.startswith(("Traceback", "The above exception",
                                                                         "During handling")):
                exc = shorten_middle(body.strip(), EXCEPTION_CHARS)
                break
        out = f"process {sp.group(1)} of mp.spawn raised" + (f" {exc}" if exc else " an exception")
        return out + (f" at {where}" if where else "")
    return None



def first_failure(text: str) -> Optional[str]:
    """torchrun's root cause in one line: ``rank 1 exited with code 1: RuntimeError: boom (train.py:22)``.

    Returns None when the text has no torchrun failure summary.
    """
    return scan_text(text).first_failure


EXCEPTION_CHARS = 400
"""Longest exception quoted in a first failure; a longer one is cut in the middle, keeping its end (where
torch puts the error's name: ``name: EADDRINUSE, message: address already in use``)."""

LINE_CAP = 8192
"""Longest line matched whole; a longer line is matched on its first and last LINE_CAP // 2 characters."""

_HALF = LINE_CAP // 2
_LOOKBACK_LINES = 32  # how far back a line without a rank prefix looks for torchrun's "rank : N"
_LOOKBACK_CHARS = 4096
_MAX_RANKS = 65536  # ranks whose last exception and frame are remembered for first_failure
_MAX_KEPT = 20000
_MAX_PLAUSIBLE = 4096  # sets of literals whose patterns are remembered (a log holds a few dozen)
EVIDENCE_WHOLE_CHARS = 2 << 20
"""Up to this size the evidence pass reads every line; beyond, only the candidate lines (bounded memory)."""
_ROOT_WINDOW = 12  # lines of torchrun's Root Cause block read for the rank and the exit code
# Lines that matter to first_failure besides the catalogue's: exceptions, traceback frames, Root Cause.
_EXTRA_TRIGGERS = ("Error", "Exception", "Interrupt", 'File "', "Root Cause (first observed failure)",
                   "terminated with")


@dataclass
class _Tables:
    """What a scanner needs of a catalogue, built once per catalogue (a few tens of ms) and shared."""

    table: list  # (cause, its compiled patterns), table order
    literals: tuple  # the literals every candidate line holds one of
    fallback: tuple  # patterns with no such literal (searched whole)
    plan: tuple  # the passes that find the literals (_scan_plan)
    flat: list  # (cause, pattern) in table order
    always: list  # indices in flat of the patterns with no literal: tried on every candidate line
    by_literal: dict  # literal -> indices in flat of the patterns that need it
    plausible: dict  # the literals a line holds -> the (cause, pattern) to try on it, in table order


_TABLES: dict = {}


def _compiled(causes: tuple) -> _Tables:
    tables = _TABLES.get(causes)
    if tables is not None:
        return tables
    table = [(c, c.compiled()) for c in causes]
    literals, fallback = _triggers(causes)
    flat = [(c, rx) for c, rxs in table for rx in rxs]
    always: list = []
    by_literal: dict = {lit: [] for lit in literals}
    for i, (_, rx) in enumerate(flat):  # a candidate line skips the patterns it cannot match
        need = _covering(literals, _TRIGGER_CACHE["needs"].get(rx.pattern))
        for lit in need if need is not None else ():
            by_literal[lit].append(i)
        if need is None:
            always.append(i)
    if len(_TABLES) >= 64:  # callers with ever new catalogues (tests): bounded
        _TABLES.clear()
    tables = _TABLES[causes] = _Tables(table, literals, fallback, _scan_plan(literals), flat, always,
                                       by_literal, {})
    return tables


@dataclass
class ScanResult:
    """What one pass over a text found: the causes, torchrun's first failure, and what was cut."""

    matches: list
    first_failure: Optional[str]
    cut_lines: int = 0
    chars: int = 0
    kept: list = field(default_factory=list)  # the candidate lines (at most 20,000), for --here
    evidence_partial: bool = False  # the text was too long for the evidence pass to read every line


class LogScanner:
    """Find the catalogue's causes in a log fed in pieces: linear time, bounded memory.

    Feed any split of the text to :meth:`feed` (a 1 GB log in 1 MB pieces), then call :meth:`finish`.
    Only what the answer needs is kept: the matches, the last exception and frame of each rank, torchrun's
    Root Cause block, and the end of the previous piece (for the rank of a summary line). A line longer
    than :data:`LINE_CAP` is matched on its head and tail (counted in ``cut_lines``).

    How it stays fast: every catalogue pattern needs some literal text (``EADDRINUSE``, ``Watchdog caught``),
    found from the pattern itself. The lines that contain one of those literals (the candidates) are found
    in each piece by a few passes (see :func:`_scan_plan`: two regexes and three ``str.find`` for today's
    ~90 literals, instead of one ``str.find`` pass per literal), which also say which literals each
    candidate holds; only those lines go through the patterns that need those literals, in table order,
    exactly as a line-by-line pass would. A pattern with no such literal is searched whole (slower, still
    linear).
    """

    def __init__(self, causes: Iterable[Cause] = CAUSES) -> None:
        tables = _compiled(tuple(causes))
        self._table, self._literals, self._fallback = tables.table, tables.literals, tables.fallback
        self._plan, self._flat, self._always = tables.plan, tables.flat, tables.always
        self._by_literal, self._plausible = tables.by_literal, tables.plausible
        self._found: dict = {}
        self._head = ""
        self._tail = ""
        self._cut = False
        self._prev = ""
        self._root: Optional[list] = None
        self._root_need = 0
        self._per_rank: dict = {}
        self._spawn_rank: Optional[int] = None
        self._spawn_line: Optional[int] = None
        self._kept: list = []  # candidate lines, for the evidence pass when streaming
        # every line while the text is at most EVIDENCE_WHOLE_CHARS (the evidence pass reads them all)
        self._all: Optional[list] = []
        self.evidence_partial = False
        self.cut_lines = 0
        self.chars = 0

    def feed(self, chunk: str) -> None:
        """Scan the next piece of the text (it may end in the middle of a line)."""
        if not chunk:
            return
        self.chars += len(chunk)
        if "\r" in chunk:  # progress bars: each \r starts a new line, as str.splitlines would say
            chunk = chunk.replace("\r\n", "\n").replace("\r", "\n")
        first = chunk.find("\n")
        if first == -1:
            self._extend(chunk)
            return
        start = 0
        if self._head:
            self._extend(chunk[:first])
            line, cut = self._take()
            self._block(line + "\n", cut)
            start = first + 1
        last = chunk.rfind("\n")
        if last >= start:
            self._block(chunk if start == 0 and last == len(chunk) - 1 else chunk[start:last + 1])
        self._extend(chunk[last + 1:])

    def finish(self, lines: Optional[Sequence[str]] = None) -> ScanResult:
        """The causes found (table order) and torchrun's first failure; call once, after the last piece.

        ``lines``: the whole text's lines when the caller holds them (the evidence pass reads them all);
        else the evidence pass reads the candidate lines kept while streaming (at most 20,000).
        """
        if self._head:
            line, cut = self._take()
            self._block(line + "\n", cut)
        found = self._found
        if lines is None:
            lines = self._all if self._all is not None else self._kept
        refine(lines, found, {c.id: c for c, _ in self._table}, Match)
        for refused in ("rendezvous-unreachable", "connection-refused"):
            if "port-in-use" in found and refused in found:
                # EADDRINUSE on the master makes the others time out or be refused: a consequence.
                found[refused].extra = "Here most likely because the master could not listen (port-in-use)."
        matches = [found[c.id] for c, _ in self._table if c.id in found]
        return ScanResult(matches, self._first_failure(), self.cut_lines, self.chars,
                          self._all if self._all is not None else self._kept, self.evidence_partial)

    # -- the partial last line of the pieces so far: its head and tail only ------------------------
    def _extend(self, piece: str) -> None:
        if not piece:
            return
        if not self._cut and len(self._head) + len(piece) <= LINE_CAP:
            self._head += piece
            return
        if not self._cut:
            whole = self._head + piece
            self._head, self._tail, self._cut = whole[:_HALF], whole[-_HALF:], True
        else:
            self._tail = (self._tail + piece[-_HALF:])[-_HALF:]

    def _take(self) -> tuple:
        line = f"{self._head} {self._tail}" if self._cut else self._head
        cut = self._cut
        self._head, self._tail, self._cut = "", "", False
        return line, cut

    # -- complete lines --------------------------------------------------------------------------
    def _block(self, block: str, cut: bool = False) -> None:
        """Scan ``block``: whole lines, each ending with a newline."""
        if self._root_need:
            parts = block.split("\n", self._root_need)
            take = parts[:self._root_need] if len(parts) > self._root_need else parts[:-1]
            self._root.extend(_capped(x) for x in take)  # type: ignore[union-attr]
            self._root_need -= len(take)
        if cut:
            self.cut_lines += 1
        if self._all is not None:
            if self.chars <= EVIDENCE_WHOLE_CHARS:
                self._all.extend(block.split("\n")[:-1])
            else:
                self._all, self.evidence_partial = None, True
        # The candidate lines and the literals each holds, in a few passes (see _scan_plan).
        found: dict = {}
        find, rfind = block.find, block.rfind
        for rx, literal_of in self._plan:
            if rx is None:  # a few literals, one str.find pass each
                for literal in literal_of:
                    i = find(literal)
                    while i != -1:
                        ls = rfind("\n", 0, i) + 1
                        held = found.get(ls)
                        if held is None:
                            found[ls] = held = []
                        held.append(literal)
                        i = find(literal, find("\n", i) + 1)
                continue
            for m in rx.finditer(block):
                ls = rfind("\n", 0, m.start()) + 1
                held = found.get(ls)
                if held is None:
                    found[ls] = held = []
                held.extend(literal_of[m.lastindex])
        for rx in self._fallback:  # patterns without a literal to search for: run whole (none today)
            m = rx.search(block)
            while m is not None:
                found.setdefault(rfind("\n", 0, m.start()) + 1, [])
                m = rx.search(block, find("\n", m.start()) + 1)
        literals = self._literals
        for ls in sorted(found):
            line = block[ls:find("\n", ls)]
            if len(line) > LINE_CAP:
                if not cut:
                    self.cut_lines += 1
                line = _capped(line)  # the patterns see the head and tail only: so do the literals
                held_now = frozenset(lit for lit in literals if lit in line)
            else:
                held_now = frozenset(found[ls])
            self._line(line, block, ls, held_now)
        self._prev = (self._prev + block[-_LOOKBACK_CHARS:])[-_LOOKBACK_CHARS:]

    def _line(self, line: str, block: str, ls: int, held: frozenset) -> None:
        """One candidate line (``held``: the literals in it). Each regex below is tried only where the text
        it needs is in the line (``in`` is much cheaper than a regex call): the answer is the same."""
        if len(self._kept) < _MAX_KEPT:
            self._kept.append(line)
        m = _PREFIX.match(line)
        spawn_text = "terminated with" in line  # both mp.spawn regexes need it
        sp = _SPAWN_BLOCK.match(line) if spawn_text else None
        if m:
            rank: Optional[int] = int(m.group(1))
        elif sp:  # mp.spawn's report: the child's traceback after it belongs to that process index
            rank = self._spawn_rank = int(sp.group(1))
        elif self._spawn_rank is not None:
            rank = self._spawn_rank
            if line and not line[0].isspace() and not line.startswith(("Traceback", "The above exception",
                                                                          "During handling")):
                self._spawn_rank = None  # the child's exception line ends its traceback
        else:
            n = _NCCL_RANK.search(line) if "Rank " in line else None
            ex = _SPAWN_EXITED.search(line) if spawn_text else None
            rank = int(n.group(1)) if n else (int(ex.group(1)) if ex else self._summary_rank(line, block, ls))
        if self._spawn_line is None and spawn_text and (sp or _SPAWN_EXITED.search(line)):
            self._spawn_line = len(self._kept) - 1
        cause, hit = self._first_hit(line, rank, held)
        if cause is not None:
            match = self._found.setdefault(cause.id, Match(cause))
            match.count += 1
            if not match.evidence:
                match.evidence = shorten(_PREFIX.sub("", line).strip(), 240)
                match.groups = {k: v for k, v in hit.groupdict().items() if v is not None}
            if rank is not None:
                match.ranks.add(rank)
            if cause.id == "killed-by-signal" and not match.extra:
                match.extra = f"{_signal_name(hit)}."
            if cause.id == "gloo-connect-full-mesh" and _LOOPBACK.search(line):
                match.extra = ("The address in the message is a loopback address: on a multi-node job this "
                               "node's hostname resolves to loopback, so the other nodes cannot reach it.")
        if self._root is None and _ROOT_TEXT in line:
            parts = block[ls:].split("\n", _ROOT_WINDOW)
            self._root = [_capped(x) for x in (parts[:_ROOT_WINDOW] if len(parts) > _ROOT_WINDOW else parts[:-1])]
            self._root_need = _ROOT_WINDOW - len(self._root)
        if rank is None or (rank not in self._per_rank and len(self._per_rank) >= _MAX_RANKS):
            return
        body = (line[m.end():] if m else line).strip()  # _PREFIX.sub("", line): the prefix is at the start
        f = _TB_FRAME.search(body) if 'File "' in body else None
        if f and is_user(f.group("file")):
            where = f"{f.group('func')} ({shown_path(f.group('file'))}:{f.group('line')})"
            self._per_rank.setdefault(rank, ["", ""])[1] = where
        elif ("Error" in body or "Exception" in body or "Interrupt" in body) and _EXC_LINE.match(body) \
                and not body.startswith("Traceback"):
            self._per_rank.setdefault(rank, ["", ""])[0] = body if len(body) <= EXCEPTION_CHARS else \
                shorten_middle(body, EXCEPTION_CHARS)

    def _first_hit(self, line: str, rank: Optional[int], held: frozenset) -> tuple:
        """:func:`_first_hit`, skipping the patterns whose literals are not in the line (``held``)."""
        order = self._plausible.get(held)
        if order is None:
            plausible = set(self._always)
            for lit in held:
                plausible.update(self._by_literal.get(lit, ()))
            order = tuple(self._flat[i] for i in sorted(plausible))
            if len(self._plausible) < _MAX_PLAUSIBLE:
                self._plausible[held] = order
        for cause, rx in order:
            if cause.from_ranks and rank is None:
                continue
            m = rx.search(line)
            if m and not (cause.id == "killed-by-signal" and _signal_name(m) in _STOP_SIGNALS):
                return cause, m
        return None, None

    def _summary_rank(self, line: str, block: str, ls: int) -> Optional[int]:
        """The rank torchrun's summary gives this line: the nearest ``rank : N`` above, within a window."""
        back = block[max(0, ls - _LOOKBACK_CHARS):ls]
        if ls < _LOOKBACK_CHARS:
            back = self._prev + back
        above = back.split("\n")[:-1]
        if len(above) > _LOOKBACK_LINES:
            above = above[-_LOOKBACK_LINES:]
        elif len(back) >= _LOOKBACK_CHARS and above:
            above = above[1:]  # the first piece may be the end of a longer line
        # The nearest line that is either summary line. Each regex needs, after the indent (its \s* is what
        # str.lstrip strips), "rank", "[" and a digit, "Root Cause", "Other Failures" or "=": the regexes run
        # only on lines that start so. A line with a rank prefix ("[rank1]:", skipped by this walk) never does.
        for candidate in [line] + above[::-1]:
            start = candidate.lstrip()[:2]
            if start and (start[0] in "rRO=" or (start[0] == "[" and start[1:].isdecimal())):
                s = _SUMMARY_RANK.match(candidate)
                if s:
                    return int(s.group(1))
                if _SUMMARY_END.match(candidate):
                    return None
        return None

    def _first_failure(self) -> Optional[str]:
        if self._root is None:
            if self._spawn_line is not None:
                return _spawn_failure(self._kept[self._spawn_line:])
            return None
        rank = code = None
        for line in self._root:
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
        exc, where = self._per_rank.get(rank, ("", ""))
        text_out = f"rank {rank} exited with code {code}"
        if exc:
            text_out += f": {exc}"
        if where:
            text_out += f" at {where}"
        return text_out


def _capped(line: str) -> str:
    return line if len(line) <= LINE_CAP else f"{line[:_HALF]} {line[-_HALF:]}"


def _required_literals(items: Any) -> Optional[list]:
    """Literals one of which every match of the parsed regex ``items`` contains (None: no such set)."""
    best: Optional[list] = None
    run: list = []

    def consider(options: Optional[list]) -> None:
        nonlocal best
        if options and (best is None or _quality(options) > _quality(best)):
            best = options

    for op, av in list(items):
        name = str(op)
        if name == "LITERAL":
            run.append(chr(av))
            continue
        consider(["".join(run)] if run else None)
        run = []
        if name == "SUBPATTERN":
            consider(_required_literals(av[-1]))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") and av[0] >= 1:
            consider(_required_literals(av[2]))
        elif name == "ATOMIC_GROUP":
            consider(_required_literals(av))
        elif name == "BRANCH":
            options: Optional[list] = []
            for branch in av[1]:
                sub = _required_literals(branch)
                if sub is None:
                    options = None
                    break
                options.extend(sub)  # type: ignore[union-attr]
            consider(options)
    consider(["".join(run)] if run else None)
    return best


def _covering(literals: tuple, options: Optional[tuple]) -> Optional[frozenset]:
    """The searched literals that find a pattern needing one of ``options`` (None: run it on every line)."""
    if options is None:
        return None
    return frozenset(lit for lit in literals if any(lit in o for o in options))


def _quality(options: list) -> tuple:
    """Longer literals find fewer false candidates; fewer alternatives mean fewer searches."""
    return (min(min(len(o), 12) for o in options), -len(options))


_TRIGGER_CACHE: dict = {}


def _triggers(causes: tuple) -> tuple:
    """(the literals that every candidate line contains one of, patterns with no such literal)."""
    key = tuple((c.id, c.patterns) for c in causes)
    if key in _TRIGGER_CACHE:
        return _TRIGGER_CACHE[key]
    try:
        from re import _parser as sre_parse  # type: ignore[attr-defined]
    except ImportError:  # Python < 3.11
        import sre_parse  # type: ignore[no-redef]
    literals = set(_EXTRA_TRIGGERS)
    fallback = []
    needs = _TRIGGER_CACHE.setdefault("needs", {})
    for cause in causes:
        for pattern in cause.patterns:
            rx = re.compile(pattern)
            options = None if rx.flags & re.IGNORECASE else _required_literals(sre_parse.parse(pattern))
            if options and all(len(o) >= 3 for o in options):
                literals.update(options)
                needs[pattern] = tuple(options)
            else:
                fallback.append(re.compile(pattern, re.MULTILINE))
    # a literal that contains another is redundant: the shorter one finds its lines too
    kept = tuple(sorted(x for x in literals if not any(y != x and y in x for y in literals)))
    _TRIGGER_CACHE[key] = (kept, tuple(fallback))
    return _TRIGGER_CACHE[key]


# Characters by how often they occur in job logs (tests/explain_corpus), most common first: the scan
# plan prefers rarer anchors when two cover as many literals. Only the speed depends on it.
_COMMON_CHARS = " eriatnolsc-/=dpuh.:1_0bgmy,k3f2()\"4v"
_COMMON_FIND = 12  # a group on one of the 12 commonest characters with at most _FIND_AT_MOST literals:
_FIND_AT_MOST = 4  # str.find each (measured: 3 finds 0.7 ms/MB, the regex pass on "l" 1.2 ms/MB)


def _scan_plan(literals: tuple) -> tuple:
    """The passes that find every occurrence of the literals, and say which literal each is.

    Python has no fast multi-string search: one ``str.find`` pass per literal costs about 0.25 ms per MB
    each (~90 literals: 20+ ms/MB), and one regex of all of them is slower still, as ``re`` checks each
    alternative at each position. Here the literals are grouped by a character they contain (greedily:
    the character in most literals, ``e`` in nearly all today; three groups in all). Each group is one
    regex that starts with that character, so ``re`` runs its fastest loop (a scan for one character)
    and tries the group only where the character is; after it comes a lookahead holding the rest of each
    literal as a trie (one branch per next character, so a position costs a few comparisons) and a
    lookbehind that checks the literal's head. The match is one character wide, so ``finditer`` tries
    every position and finds every occurrence: the candidate lines are exactly those with a literal.
    Linear time: at each position, at most the longest literal's length in comparisons per group.
    A small group on a common character (``l``, three literals today) is cheaper as one ``str.find``
    pass per literal (a regex pass stops at every occurrence of its character).

    Each literal's empty group, last in its branch, says which literal matched (``m.lastindex``). Where
    two literals of a group could match at the same position, only the first is said, so each index
    maps to the literal and those it could hide: the set of literals found for a line may hold more than
    the line does, never fewer (that set only narrows which patterns are tried on the line).

    Returns: ((regex, (None, literals said by group 1, by group 2, ...)) or (None, literals to find
    one by one), ...).
    """
    if literals in _PLAN_CACHE:
        return _PLAN_CACHE[literals]
    left = set(literals)
    groups = []
    while left:
        holding = Counter(ch for lit in left for ch in set(lit))  # character -> literals holding it
        ch = max(sorted(holding), key=lambda c: (holding[c], _rarity(c)))
        group = sorted(lit for lit in left if ch in lit)
        left.difference_update(group)
        groups.append((ch, group))
    plan: list = []
    for ch, group in groups:
        if len(group) <= _FIND_AT_MOST and _rarity(ch) < _COMMON_FIND:
            plan.append((None, tuple(group)))
            continue
        at = {lit: lit.index(ch) for lit in group}
        names = {lit: f"l{i}" for i, lit in enumerate(group)}
        # at the leaf (the literal's end), the head before the anchor: the rest is matched already
        branches = [(lit[at[lit] + 1:], (f"(?<={re.escape(lit[:at[lit]])}.{{{len(lit) - at[lit]}}})" if at[lit]
                                          else "") + f"(?P<{names[lit]}>)") for lit in group]
        rx = re.compile(re.escape(ch) + "(?=" + _trie(branches) + ")")
        said = [None] * (rx.groups + 1)
        by_next: dict = {}  # the character after the anchor ("": none): literals differing there never overlap
        for lit in group:
            by_next.setdefault(lit[at[lit] + 1:at[lit] + 2], []).append(lit)
        for lit in group:
            after = lit[at[lit] + 1:at[lit] + 2]
            near = group if not after else by_next.get(after, []) + by_next.get("", [])
            hidden = [other for other in near if other != lit and _overlap(lit, at[lit], other, at[other])]
            said[rx.groupindex[names[lit]]] = (lit, *hidden)
        plan.append((rx, tuple(said)))
    _PLAN_CACHE[literals] = tuple(plan)
    return _PLAN_CACHE[literals]


_PLAN_CACHE: dict = {}


def _rarity(ch: str) -> int:
    return _COMMON_CHARS.find(ch) if ch in _COMMON_CHARS else len(_COMMON_CHARS)


def _trie(branches: list) -> str:
    """A regex for (rest of a literal, its leaf regex) pairs: one alternative per next character."""
    by_next: dict = {}
    leaves = []
    for rest, leaf in branches:
        if rest:
            by_next.setdefault(rest[0], []).append((rest[1:], leaf))
        else:
            leaves.append(leaf)
    alternatives = [re.escape(ch) + _trie(sub) for ch, sub in sorted(by_next.items())] + leaves
    return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"


def _overlap(a: str, at_a: int, b: str, at_b: int) -> bool:
    """Whether literals ``a`` and ``b`` can both occur with their anchors (``a[at_a]``, ``b[at_b]``) at one
    position: they agree wherever they overlap."""
    lo, hi = max(-at_a, -at_b), min(len(a) - at_a, len(b) - at_b)
    return a[at_a + lo:at_a + hi] == b[at_b + lo:at_b + hi]


def scan_text(text: str, causes: Iterable[Cause] = CAUSES) -> ScanResult:
    """One pass over a whole text (see :class:`LogScanner` for pieces); the evidence pass reads every line."""
    scanner = LogScanner(causes)
    scanner.feed(text)
    return scanner.finish(text.splitlines())


def explain_text(text: str, causes: Iterable[Cause] = CAUSES) -> list:
    """Every known cause in ``text``, in table order, with the ranks that reported it.

    One cause per line: the most specific (earliest in the table) wins. Streaming: :class:`LogScanner`.
    """
    return scan_text(text, causes).matches
