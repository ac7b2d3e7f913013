"""Name the known causes in an error message or a whole job log: what it means, how to confirm, the fix.

The command's part: where the text comes from and how the matches are printed. The causes
themselves are data in :mod:`ddpdoctor.causes.catalogue`, found by :mod:`ddpdoctor.causes.matcher`.

A log is read in 1 MiB pieces and never held whole (a 1 GB log takes well under 100 MB of memory).
A regular file is read up to the size it had when opened; anything else (a pipe, a FIFO, a device such
as /dev/zero, a file that says it is empty, such as /proc files) is read for at most
:data:`STREAM_BUDGET_BYTES` and ``--max-wait`` seconds, and the output says where it stopped.
"""

from __future__ import annotations

import codecs
import os
import select
import stat
import time
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from ddpdoctor.causes.matcher import EVIDENCE_WHOLE_CHARS, LINE_CAP, LogScanner, Match, ScanResult
from ddpdoctor.errors import UsageError
from ddpdoctor.result import format_ranks
from ddpdoctor.system.redact import safe_data, safe_text

__all__ = ["render_matches", "read_input", "explain_command", "scan_source", "Source",
           "STREAM_BUDGET_BYTES", "CHUNK_BYTES"]

CHUNK_BYTES = 1 << 20
STREAM_BUDGET_BYTES = 256 << 20
"""The most read from a pipe, FIFO or device (a regular file is read whole)."""


@dataclass
class Source:
    """Where the text comes from: a name to print, and an open descriptor or the text itself."""

    name: str
    fd: Optional[int] = None
    text: Optional[str] = None
    regular_size: Optional[int] = None  # a regular file's size when opened (read up to it)


def render_matches(matches: Sequence[Match], source: str, first: Optional[str] = None,
                   notes: Sequence[str] = ()) -> list:
    """The lines ``ddpdoctor explain`` prints (``first``: torchrun's first failure; ``notes``: what was cut).

    They quote the log (the evidence, the first failure, notes on what was found): whoever prints or saves
    them passes each through :func:`~ddpdoctor.system.redact.safe_text` (explain's output, run's verdict).
    """
    head = [f"first failure: {first}"] if first else []
    tail = [f"note: {n}" for n in notes]
    if not matches:
        if first:
            return head + [f"{source}: no other known cause found; read that rank's lines above its exit."] + tail
        return [f"{source}: no known cause found in this text.",
                "  Run 'ddpdoctor check' on the same nodes (it proves ports, process group and environment),",
                "  and 'ddpdoctor stacks' while a job hangs."] + tail
    out = head + [f"{source}: {len(matches)} known cause{'s' if len(matches) != 1 else ''}"]
    for m in matches:
        who = f" (rank{'s' if len(m.ranks) != 1 else ''} {format_ranks(m.ranks)})" if m.ranks else ""
        out.append(f"- {m.cause.id}: {m.cause.title}{who}")
        out.append(f"    seen:    {m.evidence}" + (f"  [x{m.count}]" if m.count > 1 else ""))
        out.append(f"    means:   {m.meaning}")
        if m.candidates:
            out.append(f"    one of {len(m.candidates)} causes, the likeliest first; to tell them apart:")
            out += [f"      {i}. {cid}: {how}" for i, (cid, how) in enumerate(m.candidates, 1)]
        out.append(f"    confirm: {m.confirm}")
        out.append(f"    fix:     {m.fix}")
    return out + tail


def read_input(text: Sequence[str], log_path: Optional[str]) -> Source:
    """Where to read: TEXT words, ``--log FILE`` or ``-`` (stdin); opened now, so that a bad path or a
    closed stdin is a usage error (exit 2) before any reading.

    Raises:
        UsageError: nothing to read, both TEXT and --log given, a path that cannot be read, stdin closed.
    """

    if log_path and text:
        raise UsageError("explain-input", "give either TEXT or --log FILE, not both", "drop one of them")
    if log_path:
        return _open_log(log_path)
    wants_stdin = list(text) == ["-"]
    if wants_stdin or not text:
        try:
            st = os.fstat(0)
        except OSError:
            if wants_stdin:
                raise UsageError("stdin-closed", "explain -: standard input is closed",
                                 "pipe the log in (ddpdoctor explain - < job.log) or use --log FILE") from None
            st = None
        if st is not None and (wants_stdin or not os.isatty(0)):
            if stat.S_ISDIR(st.st_mode):
                raise UsageError("stdin-directory", "standard input is a directory", "use --log FILE")
            size = st.st_size if stat.S_ISREG(st.st_mode) and st.st_size > 0 else None
            return Source("stdin", fd=0, regular_size=size)
    if not text:
        raise UsageError("explain-input", "nothing to explain",
                         "pass the error text, --log FILE, or - to read standard input")
    return Source("the message", text=" ".join(text))


def _open_log(path: str) -> Source:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UsageError("log-unreadable", f"--log {safe_text(path)}: {exc.strerror}",
                         "give a readable log file") from None
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise UsageError("log-unreadable", f"--log {safe_text(path)} is a directory", "give a log file")
    size = st.st_size if stat.S_ISREG(st.st_mode) and st.st_size > 0 else None
    return Source(path, fd=fd, regular_size=size)


def _chunks(source: Source, max_wait: float, notes: list) -> Iterator[str]:
    """The text in decoded pieces, within the budget (notes say where reading stopped, and why)."""
    if source.text is not None:
        yield source.text
        return
    fd = source.fd
    assert fd is not None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")  # undecodable bytes: shown as \xff
    limit = source.regular_size if source.regular_size is not None else STREAM_BUDGET_BYTES
    deadline = None if source.regular_size is not None else time.monotonic() + max_wait
    done = 0
    while done < limit:
        if deadline is not None:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                notes.append(f"stopped reading {source.name} after {max_wait:g} s "
                             f"({_size(done)} read): it is a stream that did not end; "
                             "save the log to a file and pass --log FILE, or raise --max-wait")
                break
        try:
            data = os.read(fd, min(CHUNK_BYTES, limit - done))
        except BlockingIOError:
            time.sleep(0.01)
            continue
        except OSError as exc:
            notes.append(f"stopped reading {source.name}: {exc.strerror}")
            break
        if not data:
            break
        done += len(data)
        yield decoder.decode(data)
    else:
        if source.regular_size is None:
            notes.append(f"read only the first {_size(limit)} of {source.name}: it is not a regular "
                         "file (a pipe, FIFO or device); save the log to a file and pass --log FILE")
    yield decoder.decode(b"", final=True)


def _size(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n >= (1 << 20) else f"{n} bytes"


def scan_source(source: Source, max_wait: float = 30.0) -> tuple:
    """(ScanResult, notes): one streaming pass over the source."""
    notes: list = []
    scanner = LogScanner()
    try:
        for piece in _chunks(source, max_wait, notes):
            scanner.feed(piece)
    finally:
        if source.fd is not None and source.fd != 0:
            os.close(source.fd)
    result: ScanResult = scanner.finish()
    if result.cut_lines:
        notes.insert(0, f"{result.cut_lines} line{'s' if result.cut_lines != 1 else ''} longer than "
                        f"{LINE_CAP // 1024} KB {'were' if result.cut_lines != 1 else 'was'} cut: matched on "
                        f"the first and last {LINE_CAP // 2048} KB")
    if result.evidence_partial:
        notes.append(f"the log is longer than {EVIDENCE_WHOLE_CHARS >> 20} MiB: the evidence pass (counts, "
                     "settings, versions) read only the matching lines")
    return result, notes


def explain_command(text: Sequence[str], log_path: Optional[str], as_json: bool, max_wait: float = 30.0,
                    here: bool = False, probe=None) -> int:
    """``ddpdoctor explain``: print the known causes; exit 0 (finding nothing is not an error).

    ``here``: also confirm or rule out the causes with this machine's facts (``probe``: the seam to it).
    """
    import json

    import click

    source = read_input(text, log_path)
    result, notes = scan_source(source, max_wait)
    matches, first = result.matches, result.first_failure
    facts = checks = None
    if here:
        from ddpdoctor.causes.here import check_here, gather_facts

        body = source.text if source.text is not None else "\n".join(result.kept)
        facts = gather_facts(probe, body)
        checks = check_here(matches, body, facts)
    if as_json:
        doc = {"schema": 1, "source": source.name, "first_failure": first,
               "causes": [m.to_dict() for m in matches], "cut_lines": result.cut_lines, "notes": notes}
        if here:
            doc["here"] = {"facts": facts.to_dict(), "checks": [c.to_dict() for c in checks]}
        click.echo(json.dumps(safe_data(doc), indent=2))  # the log's words: redacted and escaped
    else:
        lines = render_matches(matches, source.name, first, notes)
        if here:
            from ddpdoctor.causes.here import render_here

            lines += render_here(facts, checks)
        click.echo("\n".join(safe_text(line) for line in lines))  # the log's words: redacted and escaped
    return 0
