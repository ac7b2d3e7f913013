"""The pages of ``bench --html`` and ``locate --html``: what they measured, drawn.

* bench: bus bandwidth and algorithm bandwidth against the message size, one line per operation,
  beside the nccl-tests table;
* locate: the nodes, the tests of each round (a pair as a line with its GB/s, three or more nodes as a
  dashed polygon through them, a node's own ranks in the table), the suspects in red and a cut as the
  red links across it.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ddpdoctor.report.page import page, preformatted, section, table
from ddpdoctor.report.svg import Edge, Graph, graph, line_chart, text

__all__ = ["bench_page", "locate_page", "size_label"]


def size_label(n: float) -> str:
    """``1048576`` -> ``1M`` (powers of 1024, as nccl-tests)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{n:.0f}"


def bench_page(rows: Sequence[dict], heading: Sequence[str], table_lines: Sequence[str], verdict: str) -> str:
    """``rows``: :func:`ddpdoctor.checks.collectives.bench_rows`; ``heading``: the world and the settings;
    ``table_lines``: the nccl-tests table as printed."""
    charts = []
    for key, name in (("busbw", "bus bandwidth (GB/s)"), ("algbw", "algorithm bandwidth (GB/s)")):
        series: dict = {}
        for r in rows:
            series.setdefault(r["op"], []).append((float(r["size"]), float(r[key])))
        charts.append(f'<div class="chart-{key}">' + line_chart(series, "message size (bytes)", name, log_x=True,
                                                                 x_format=size_label) + "</div>")
    body = ["<h1>ddpdoctor bench</h1>", "".join(f'<p class="muted">{text(h)}</p>' for h in heading),
            f'<div class="verdict ok" id="verdict"><p class="headline" id="headline">{text(verdict)}</p></div>',
            section("Bandwidth against size, one line per operation", *charts, key="charts"),
            section("The table (as nccl-tests prints it)", preformatted(table_lines), key="table")]
    return page("ddpdoctor bench", body)


def _slow(busbw: Optional[float], baseline: Optional[float], tolerance: float) -> bool:
    return busbw is None or (baseline is not None and busbw < baseline * (1 - tolerance))


def locate_page(data: dict, summary: str, hint: str, tolerance: float) -> str:
    """``data``: the locate check's lead outcome (``hosts``, ``ranks``, ``verdict``); ``summary`` and ``hint``:
    its result's words."""
    v = data.get("verdict") or {}
    hosts = list(data.get("hosts") or [])
    names = [f"node {i}" for i in range(len(hosts))]
    base = (v.get("baseline") or {}).get("median_busbw") if (v.get("baseline") or {}).get("count") else None
    rounds: dict = {}
    for r in v.get("readings") or []:
        rounds.setdefault(r["round"], []).append(r)
    suspects = v.get("suspects") or []
    bad = sorted({n for s in suspects if s["kind"] != "all" for n in s["nodes"] + s.get("other", [])})
    pictures, rows = [], []
    for no, readings in sorted(rounds.items()):
        edges, groups = [], []
        for r in readings:
            figure = "no answer" if r["busbw"] is None else f"{r['busbw']:.3g} GB/s"
            slow = _slow(r["busbw"], base, tolerance)
            if len(r["nodes"]) == 2:
                a, b = r["nodes"]
                edges.append(Edge(names[a], names[b], figure, slow))
            elif len(r["nodes"]) > 2:
                groups.append(([names[n] for n in r["nodes"] if n < len(names)], figure, slow))
            rows.append([no, r["kind"], ", ".join(names[n] for n in r["nodes"] if n < len(names)), figure,
                         "" if r.get("latency_us") is None else f"{r['latency_us']:.3g}",
                         ("slow" if slow else "ok") + (f" ({r['error']})" if r.get("error") else "")])
        kinds = ", ".join(sorted({r["kind"] for r in readings}))
        pictures.append(graph(Graph(names, edges, [], f"round {no}: {kinds}", groups)))
    cut_edges = [Edge(names[a], names[b], "cut", True) for s in suspects if s["kind"] == "cut"
                 for a in s["nodes"] for b in s.get("other", [])]
    pictures.append(graph(Graph(names, cut_edges, [names[n] for n in bad if n < len(names)], "suspects")))
    suspect_rows = [[s["kind"], ", ".join(names[n] for n in s["nodes"]),
                     ", ".join(names[n] for n in s.get("other", [])), "; ".join(s.get("evidence", []))]
                    for s in suspects]
    node_rows = [[names[i], h, ",".join(map(str, (data.get("ranks") or {}).get(str(i), [])))] for i, h in enumerate(hosts)]
    ok = not suspects
    body = ["<h1>ddpdoctor locate</h1>",
            f'<div class="verdict{" ok" if ok else ""}" id="verdict"><p class="headline" id="headline">{text(summary)}</p>'
            + (f'<p class="fix" id="fix"><b>Fix:</b> {text(hint)}</p>' if hint else "") + "</div>",
            section("The world, round by round", '<p class="muted">green: a pair at the healthy figure; red: slow or '
                    f'no answer (under {1 - tolerance:.0%} of the median pair'
                    + (f", {base:.3g} GB/s" if base is not None else "") + "); the last picture: the suspects in red, "
                    "a cut as the red links across it</p>", '<div class="graphs">' + "".join(pictures) + "</div>",
                    key="rounds"),
            section("Suspects", table(["kind", "nodes", "other side", "evidence"], suspect_rows, left=4, cls="suspects")
                    if suspects else '<p id="no-suspects">none</p>', key="suspects"),
            section("Every test", table(["round", "kind", "nodes", "busbw", "latency (us)", ""], rows, left=3,
                                        cls="readings"), key="readings"),
            section("Nodes", table(["node", "host", "ranks"], node_rows, left=3, cls="nodes"), key="nodes")]
    return page("ddpdoctor locate", body)
