"""Name the known causes in an error message or a whole job log: what it means, how to confirm, the fix.

The command's part: where the text comes from and how the matches are printed. The causes
themselves are data in :mod:`ddpdoctor.causes.catalogue`, found by :mod:`ddpdoctor.causes.matcher`.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ddpdoctor.causes.matcher import Match, explain_text, first_failure
from ddpdoctor.result import format_ranks

__all__ = ["explain_command", "read_input", "render_matches"]


def render_matches(matches: Sequence[Match], source: str, first: Optional[str] = None) -> list:
    """The lines ``ddpdoctor explain`` prints (``first``: torchrun's first failure, if known)."""
    head = [f"first failure: {first}"] if first else []
    if not matches:
        if first:
            return head + [f"{source}: no other known cause found; read that rank's lines above its exit."]
        return [f"{source}: no known cause found in this text.",
                "  Run 'ddpdoctor check' on the same nodes (it proves ports, process group and environment),",
                "  and 'ddpdoctor stacks' while a job hangs."]
    out = head + [f"{source}: {len(matches)} known cause{'s' if len(matches) != 1 else ''}"]
    for m in matches:
        who = f" (rank{'s' if len(m.ranks) != 1 else ''} {format_ranks(m.ranks)})" if m.ranks else ""
        out.append(f"- {m.cause.id}: {m.cause.title}{who}")
        out.append(f"    seen:    {m.evidence}" + (f"  [x{m.count}]" if m.count > 1 else ""))
        out.append(f"    means:   {m.meaning}")
        out.append(f"    confirm: {m.cause.confirm}")
        out.append(f"    fix:     {m.fix}")
    return out


def read_input(text: Sequence[str], log_path: Optional[str]) -> tuple:
    """The text to explain and a name for it, from TEXT words, ``--log FILE`` or ``-`` (stdin).

    Raises:
        UsageError: nothing to read, or both TEXT and --log given.
    """
    import sys

    from ddpdoctor.errors import UsageError

    if log_path and text:
        raise UsageError("explain-input", "give either TEXT or --log FILE, not both", "drop one of them")
    if log_path:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            return f.read(), log_path
    if list(text) == ["-"] or (not text and not sys.stdin.isatty()):
        return sys.stdin.read(), "stdin"
    if not text:
        raise UsageError("explain-input", "nothing to explain",
                         "pass the error text, --log FILE, or - to read standard input")
    return " ".join(text), "the message"


def explain_command(text: Sequence[str], log_path: Optional[str], as_json: bool, here: bool = False,
                    probe=None) -> int:
    """``ddpdoctor explain``: print the known causes; exit 0 (finding nothing is not an error).

    ``here``: also confirm or rule out the causes with this machine's facts (``probe``: the seam to it).
    """
    import json

    import click

    body, source = read_input(text, log_path)
    matches = explain_text(body)
    first = first_failure(body)
    facts = checks = None
    if here:
        from ddpdoctor.causes.here import check_here, gather_facts

        facts = gather_facts(probe, body)
        checks = check_here(matches, body, facts)
    if as_json:
        doc = {"schema": 1, "source": source, "first_failure": first, "causes": [m.to_dict() for m in matches]}
        if here:
            doc["here"] = {"facts": facts.to_dict(), "checks": [c.to_dict() for c in checks]}
        click.echo(json.dumps(doc, indent=2))
    else:
        lines = render_matches(matches, source, first)
        if here:
            from ddpdoctor.causes.here import render_here

            lines += render_here(facts, checks)
        click.echo("\n".join(lines))
    return 0
