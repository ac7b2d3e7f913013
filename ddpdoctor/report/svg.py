"""Pictures as plain SVG text: a timeline of rows, a line chart, a graph of nodes and links.

Written by hand rather than with a drawing library: the pictures are rectangles, lines and text, a
page must open from disk with no script or font fetched, and ``pip install ddpdoctor`` stays free of a
plotting stack (matplotlib and its numpy: tens of MB; plotly: a 3 MB script in every page). Every
string that goes in is redacted and escaped here (:func:`text`), so a caller cannot forget it.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from ddpdoctor.system.redact import safe_text

__all__ = ["text", "Bar", "Row", "timeline", "line_chart", "Edge", "Graph", "graph", "PALETTE"]

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")


def text(value: object) -> str:
    """``value`` as SVG/HTML text: redacted, control characters escaped, then ``& < > " '`` escaped."""
    return html.escape(safe_text(str(value)), quote=True)


def _num(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".") if math.isfinite(x) else "0"


@dataclass(frozen=True)
class Bar:
    """One interval on a row: ``band`` 0 (upper: steps) or 1 (lower: collectives); ``title``: its tooltip."""

    start: float
    end: float
    band: int
    label: str
    title: str = ""


@dataclass(frozen=True)
class Row:
    """One row of a timeline (one rank): its bars and, where something happened, a mark."""

    key: str
    label: str
    bars: Sequence[Bar] = ()
    mark_at: Optional[float] = None
    mark_kind: str = ""
    mark_text: str = ""


def _ticks(lo: float, hi: float, count: int = 6) -> list:
    span = max(hi - lo, 1e-9)
    raw = span / count
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * step:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def timeline(rows: Sequence[Row], start: float, end: float, width: int = 1100, unit: str = "s") -> str:
    """One row per entry of ``rows`` on a shared time axis from ``start`` to ``end`` (seconds: shown from
    0); bars narrower than a pixel are drawn one pixel wide; a mark is a red line with its kind on the
    row. Each row is ``<g class="row" data-key=...>``, each mark ``<g class="mark mark-KIND" data-key=...>``."""
    left, right, row_h, top = 190, 20, 34, 24
    span = max(end - start, 1e-9)
    inner = width - left - right

    def x(t: float) -> float:
        return left + (min(max(t, start), end) - start) / span * inner

    height = top + row_h * len(rows) + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="timeline per rank">']
    for t in _ticks(0.0, span):
        px = _num(left + t / span * inner)
        out.append(f'<line x1="{px}" y1="{top - 4}" x2="{px}" y2="{height - 10}" stroke="#ddd"/>'
                   f'<text x="{px}" y="{top - 8}" font-size="10" text-anchor="middle" fill="#555">'
                   f'{_num(t)}{text(unit)}</text>')
    for i, row in enumerate(rows):
        y = top + i * row_h
        out.append(f'<g class="row" data-key="{text(row.key)}">'
                   f'<text class="row-label" x="4" y="{y + 20}" font-size="12">{text(row.label)}</text>'
                   f'<rect x="{left}" y="{y + 2}" width="{inner}" height="{row_h - 4}" fill="#f6f6f6"/>')
        for b in row.bars:
            x0, x1 = x(b.start), x(b.end)
            by = y + 4 if b.band == 0 else y + 18
            color = "#9ecae1" if b.band == 0 else "#fd8d3c"
            out.append(f'<rect class="bar band{b.band}" x="{_num(x0)}" y="{by}" width="{_num(max(1.0, x1 - x0))}" '
                       f'height="12" fill="{color}" stroke="#fff" stroke-width="0.3"><title>'
                       f'{text(b.title or b.label)}</title></rect>')
        if row.mark_at is not None:
            mx = _num(x(row.mark_at))
            out.append(f'<g class="mark mark-{text(row.mark_kind)}" data-key="{text(row.key)}">'
                       f'<line x1="{mx}" y1="{y}" x2="{mx}" y2="{y + row_h}" stroke="#c00" stroke-width="3"/>'
                       f'<text x="{mx}" y="{y + 13}" dx="-4" font-size="11" font-weight="bold" fill="#c00" '
                       f'text-anchor="end">{text(row.mark_kind)}</text><title>{text(row.mark_text)}</title></g>')
        out.append('</g>')
    out.append('</svg>')
    return "".join(out)


def line_chart(series: dict, x_label: str, y_label: str, log_x: bool = False, width: int = 720,
               height: int = 340, y_floor: Optional[float] = 0.0, x_format=_num) -> str:
    """Lines through ``series`` (name -> [(x, y)]): one color per name, a legend, axes with ticks
    (``log_x``: base-2 ticks, for sizes). Each line is ``<g class="series" data-name=...>``."""
    left, right, top, bottom = 64, 160, 16, 44
    points = [(x, y) for pts in series.values() for x, y in pts if math.isfinite(x) and math.isfinite(y)]
    if log_x:
        points = [(x, y) for x, y in points if x > 0]
    xs = [math.log2(x) if log_x else x for x, _ in points] or [0.0, 1.0]
    ys = [y for _, y in points] or [0.0, 1.0]
    x_lo, x_hi = min(xs), max(xs)
    y_lo = min(ys) if y_floor is None else min(y_floor, min(ys))
    y_hi = max(ys) if max(ys) > y_lo else y_lo + 1.0
    x_hi = x_hi if x_hi > x_lo else x_lo + 1.0
    y_hi *= 1.05
    inner_w, inner_h = width - left - right, height - top - bottom

    def px(xv: float) -> float:
        v = math.log2(xv) if log_x else xv
        return left + (v - x_lo) / (x_hi - x_lo) * inner_w

    def py(yv: float) -> float:
        return top + inner_h - (yv - y_lo) / (y_hi - y_lo) * inner_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{text(y_label)} against {text(x_label)}">',
           f'<rect x="{left}" y="{top}" width="{inner_w}" height="{inner_h}" fill="#fafafa" stroke="#999"/>']
    xticks = [2 ** e for e in range(math.ceil(x_lo), math.floor(x_hi) + 1)] if log_x else _ticks(x_lo, x_hi)
    if log_x and len(xticks) > 10:
        stride = math.ceil(len(xticks) / 10)
        xticks = xticks[::stride]
    for t in xticks:
        p = _num(px(t))
        out.append(f'<line x1="{p}" y1="{top}" x2="{p}" y2="{top + inner_h}" stroke="#e4e4e4"/>'
                   f'<text x="{p}" y="{top + inner_h + 14}" font-size="10" text-anchor="middle">{text(x_format(t))}</text>')
    for t in _ticks(y_lo, y_hi, 5):
        p = _num(py(t))
        out.append(f'<line x1="{left}" y1="{p}" x2="{left + inner_w}" y2="{p}" stroke="#e4e4e4"/>'
                   f'<text x="{left - 4}" y="{p}" dy="3" font-size="10" text-anchor="end">{t:.3g}</text>')
    out.append(f'<text x="{left + inner_w / 2:.0f}" y="{height - 8}" font-size="12" text-anchor="middle">'
               f'{text(x_label)}</text><text x="14" y="{top + inner_h / 2:.0f}" font-size="12" text-anchor="middle" '
               f'transform="rotate(-90 14 {top + inner_h / 2:.0f})">{text(y_label)}</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        good = sorted((x, y) for x, y in pts if math.isfinite(x) and math.isfinite(y) and (x > 0 or not log_x))
        path = " ".join(f"{_num(px(x))},{_num(py(y))}" for x, y in good)
        out.append(f'<g class="series" data-name="{text(name)}">'
                   f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [f'<circle cx="{_num(px(x))}" cy="{_num(py(y))}" r="2.5" fill="{color}"><title>{text(name)}: '
                f'{text(x_format(x))}, {y:.4g}</title></circle>' for x, y in good]
        ly = top + 14 + i * 16
        out.append(f'<line x1="{width - right + 10}" y1="{ly - 4}" x2="{width - right + 28}" y2="{ly - 4}" '
                   f'stroke="{color}" stroke-width="3"/><text x="{width - right + 32}" y="{ly}" font-size="11">'
                   f'{text(name)}</text></g>')
    out.append('</svg>')
    return "".join(out)


@dataclass(frozen=True)
class Edge:
    """A tested pair: its figure (GB/s, or None when it failed) and whether it was slow."""

    a: str
    b: str
    label: str
    slow: bool = False


@dataclass
class Graph:
    """Nodes on a circle and the pairs between them; ``suspects`` drawn red, ``cut`` the nodes cut off."""

    nodes: Sequence[str]
    edges: Sequence[Edge] = ()
    suspects: Sequence[str] = ()
    title: str = ""
    groups: Sequence[tuple] = ()  # (nodes, label, slow): a test of three or more nodes together


def graph(g: Graph, size: int = 300) -> str:
    """The nodes around a circle, each tested pair a line (red: slow or failed) with its figure, a test of
    three or more nodes a dashed polygon through them; a suspect node red. Nodes are ``<g class="node" data-node=...>``, pairs ``<g class="edge" data-slow=...>``."""
    n = max(len(g.nodes), 1)
    cx = cy = size / 2
    r = size / 2 - 46
    where = {}
    for i, name in enumerate(g.nodes):
        angle = -math.pi / 2 + 2 * math.pi * i / n
        where[name] = (cx + r * math.cos(angle), cy + r * math.sin(angle))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{size}" height="{size + 18}" '
           f'viewBox="0 0 {size} {size + 18}" role="img" aria-label="{text(g.title)}">',
           f'<text x="{cx:.0f}" y="14" font-size="12" font-weight="bold" text-anchor="middle">{text(g.title)}</text>']
    for nodes, label, slow in g.groups:
        pts = [where[n] for n in nodes if n in where]
        if len(pts) < 3:
            continue
        color = "#c00" if slow else "#2a2"
        cx_, cy_ = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts) + 18
        poly = " ".join(f"{x:.1f},{y + 18:.1f}" for x, y in pts)
        out.append(f'<g class="group" data-slow="{str(slow).lower()}"><polygon points="{poly}" fill="{color}" '
                   f'fill-opacity="0.12" stroke="{color}" stroke-dasharray="4 3" stroke-width="2"/>'
                   f'<text x="{cx_:.1f}" y="{cy_:.1f}" font-size="10" text-anchor="middle" fill="{color}" '
                   f'stroke="#fff" stroke-width="3" paint-order="stroke">{text(label)}</text></g>')
    for e in g.edges:
        if e.a not in where or e.b not in where:
            continue
        (x1, y1), (x2, y2) = where[e.a], where[e.b]
        color = "#c00" if e.slow else "#2a2"
        out.append(f'<g class="edge" data-slow="{str(e.slow).lower()}"><line x1="{x1:.1f}" y1="{y1 + 18:.1f}" '
                   f'x2="{x2:.1f}" y2="{y2 + 18:.1f}" stroke="{color}" stroke-width="{3 if e.slow else 2}"/>'
                   f'<text x="{(x1 + x2) / 2:.1f}" y="{(y1 + y2) / 2 + 18:.1f}" font-size="10" text-anchor="middle" '
                   f'fill="{color}" stroke="#fff" stroke-width="3" paint-order="stroke">{text(e.label)}</text></g>')
    for name, (x, y) in where.items():
        bad = name in g.suspects
        out.append(f'<g class="node{" suspect" if bad else ""}" data-node="{text(name)}"><circle cx="{x:.1f}" '
                   f'cy="{y + 18:.1f}" r="16" fill="{"#fdd" if bad else "#def"}" stroke="{"#c00" if bad else "#357"}" '
                   f'stroke-width="2"/><text x="{x:.1f}" y="{y + 22:.1f}" font-size="10" text-anchor="middle">'
                   f'{text(name)}</text></g>')
    out.append('</svg>')
    return "".join(out)
