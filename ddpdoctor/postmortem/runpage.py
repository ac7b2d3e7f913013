"""``report.html`` of ``ddpdoctor run``: the verdict first (what failed or hung, the rank, the user's line,
the fix), then the timeline per rank with the hang or death marked, the straggler scores per window,
the silent-bug findings, and the verdict in full (the grouped stacks, what explain found).

Built from what run already has in hand (the verdict's JSON and lines, the ranks, the straggler
watch's windows) and the timeline (:mod:`ddpdoctor.postmortem.timeline`); drawn as plain SVG by
:mod:`ddpdoctor.report.svg`, in one page with no script (:mod:`ddpdoctor.report.page`). Every text is
redacted and escaped on its way into the page.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ddpdoctor.postmortem.timeline import RankLine
from ddpdoctor.report.page import page, preformatted, section, table
from ddpdoctor.report.svg import Bar, Row, line_chart, text, timeline

__all__ = ["RunPicture", "render_run_page", "PAGE_LIMIT"]

PAGE_LIMIT = 2000  # events per rank drawn on the page (the trace holds more)


@dataclass
class RunPicture:
    """What the page shows.

    Args:
        kind: ``ok``, ``failed``, ``hung`` or ``interrupted``.
        headline: the verdict's first line (without ``ddpdoctor run:``).
        doc: ``verdict.json``'s content (None for a healthy run).
        lines: the verdict as printed (its grouped stacks, explain).
        ranks: the timeline rows, one per rank.
        scores: the straggler watch's windows: (when, {rank: score}).
        stragglers: one line per rank named a straggler.
        findings: the silent-bug findings (``Finding.to_dict``).
        trace: where the page links to ``trace.json`` ("" when no trace was kept).
        first: the rank that failed first, in words.
    """

    kind: str
    headline: str
    command: Sequence[str] = ()
    run_dir: str = ""
    exit_code: Optional[int] = None
    doc: Optional[dict] = None
    lines: Sequence[str] = ()
    ranks: Sequence[RankLine] = ()
    scores: Sequence[tuple] = ()
    stragglers: Sequence[str] = ()
    findings: Sequence[dict] = ()
    trace: str = ""
    first: str = ""  # the rank that failed first ("rank 1")
    started: float = field(default_factory=time.time)


def _verdict(p: RunPicture) -> str:
    doc = p.doc or {}
    ok = p.kind == "ok" and not p.findings
    parts = [f'<p class="headline" id="headline">{text(p.headline)}</p>']
    cause = doc.get("cause") or doc.get("first_failure")
    if cause:
        parts.append(f'<p id="cause"><b>Cause:</b> {text(cause)}</p>')
    deaths = [f"rank {d['rank']}" if d.get("rank") is not None else f"pid {d.get('pid')}"
              for d in doc.get("deaths") or []]
    if p.kind == "failed" and (p.first or deaths):
        first = p.first or deaths[0]
        after = [d for d in deaths if d != first][:8]
        parts.append(f'<p id="who"><b>Rank:</b> {text(first)}, the first to fail'
                     + (f" (after it: {text(', '.join(after))})" if after else "") + "</p>")
    odd = [line.strip() for line in p.lines if "the odd one out" in line]
    places = [(s.get("rank"), s.get("place")) for s in doc.get("stacks") or [] if s.get("place")]
    if places and p.kind != "ok":
        items = "".join(f"<li>{text(f'rank {r}' if r is not None else 'a process')}: {text(pl)}</li>"
                        for r, pl in sorted(places, key=lambda x: str(x[0])))
        parts.append(f'<p><b>Where the ranks were:</b></p><ul id="places">{items}</ul>')
    if odd:
        parts.append(f'<p id="odd"><b>The odd one out:</b> {text(odd[0])}</p>')
    lead = next((line.strip() for line in p.lines if line.strip().startswith("Flight Recorder:")), "")
    if lead:
        parts.append(f'<p id="recorder">{text(lead)}</p>')
    fixes = [c.get("fix") for c in doc.get("causes") or [] if c.get("fix")]
    fixes += [f"{f.get('fix')}" for f in p.findings if f.get("fix")]
    if not fixes and p.kind == "hung" and odd:
        fixes.append("the odd one out never reached the collective the others wait in: look at its line")
    if fixes:
        parts.append(f'<p class="fix" id="fix"><b>Fix:</b> {text(fixes[0])}</p>')
    return f'<div class="verdict{" ok" if ok else ""}" id="verdict">' + "".join(parts) + "</div>"


def _timeline(ranks: Sequence[RankLine]) -> str:
    rows, starts, ends = [], [], []
    for line in ranks:
        slices = line.slices[-PAGE_LIMIT:] if len(line.slices) > PAGE_LIMIT else line.slices
        bars = []
        for s in slices:
            if s.kind == "step":
                title = f"{s.name}: {(s.end - s.start) * 1e3:.1f} ms"
            else:
                title = f"#{s.n} {s.name}, {s.nbytes} bytes: {(s.end - s.start) * 1e3:.2f} ms"
            bars.append(Bar(s.start, s.end, 0 if s.kind == "step" else 1, s.name, title))
            starts.append(s.start)
            ends.append(s.end)
        mark = line.mark
        if mark is not None:
            ends.append(mark.at)
            starts.append(mark.at)
        key = str(line.rank)
        rows.append(Row(key, line.label, bars, mark.at if mark else None, mark.kind if mark else "",
                        mark.text if mark else ""))
    if not starts:
        return ('<p class="muted" id="no-timeline">no step or collective was recorded (the job ended before its '
                'first one, or DDPDOCTOR_STRAGGLER=0)</p>') + timeline(rows, 0.0, 1.0)
    lo, hi = min(starts), max(ends)
    hi += (hi - lo) * 0.02 + 1e-3
    return ('<p class="muted">upper band (blue): optimizer steps; lower band (orange): collectives (DDP\'s '
            'backward with its gradient all-reduce as one); red line: where the rank hung or died. Times in seconds '
            'from the first event shown; hover for numbers and sizes.</p>'
            f'<div class="scroll">{timeline(rows, lo, hi)}</div>')


def _scores(p: RunPicture) -> str:
    if not p.scores:
        return '<p class="muted" id="no-scores">no straggler window closed (a run shorter than --straggler-window)</p>'
    t0 = p.scores[0][0]
    ranks = sorted({r for _, s in p.scores for r in s}, key=str)
    series = {f"rank {r}": [(w - t0, s[r]) for w, s in p.scores if r in s] for r in ranks}
    shown = p.scores[-40:]
    header = ["rank"] + [f"{w - t0:.0f}s" for w, _ in shown]
    rows = [[f"rank {r}"] + [f"{s[r]:.2f}" if r in s else "" for _, s in shown] for r in ranks]
    flagged = "".join(f"<p><b>{text(line)}</b></p>" for line in p.stragglers)
    return (flagged + '<p class="muted">per window: the fastest rank\'s own work (between collectives) over this '
            'rank\'s; 1.00 is as fast as the fastest, under 0.80 for several windows in a row is a straggler.</p>'
            + line_chart(series, "seconds since the first window", "score", y_floor=0.0)
            + table(header, rows, cls="scores"))


def _findings(findings: Sequence[dict]) -> str:
    if not findings:
        return '<p class="muted" id="no-findings">none</p>'
    rows = [[f.get("watch", ""), ",".join(map(str, f.get("ranks", []))), f.get("what", ""), f.get("where", ""),
             f.get("fix", "")] for f in findings]
    return table(["watch", "ranks", "what", "where", "fix"], rows, left=5, cls="findings")


def render_run_page(p: RunPicture) -> str:
    """The whole page, as text."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.started))
    meta = f"{when}; exit {p.exit_code}" + (f"; run directory {p.run_dir}" if p.run_dir else "")
    trace = (f'<p><a id="trace-link" href="{text(p.trace)}">trace.json</a>: the same timeline in the Chrome '
             'trace-event format (open it in ui.perfetto.dev or chrome://tracing)</p>') if p.trace else ""
    body = [f"<h1>ddpdoctor run: {text(' '.join(p.command))}</h1>", f'<p class="muted">{text(meta)}</p>',
            _verdict(p),
            section("Timeline per rank", _timeline(p.ranks), trace, key="timeline"),
            section("Straggler scores per window", _scores(p), key="stragglers"),
            section("Silent-bug findings", _findings(p.findings), key="findings")]
    if p.lines:
        body.append(section("The verdict in full (grouped stacks, explain)", preformatted(p.lines), key="full"))
    return page(f"ddpdoctor run: {p.headline}", body)
