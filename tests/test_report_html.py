"""The HTML pictures' building blocks without a job: the SVG writer (escaping, redaction, rows, marks), the
Chrome trace of overlapping calls, the page's write rules (``--html``: links refused before any work)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ddpdoctor.postmortem.timeline import Mark, RankLine, Slice, read_rank, trace_events
from ddpdoctor.report.page import page, save_page, table
from ddpdoctor.report.svg import Bar, Row, line_chart, text, timeline
from secret_shapes import SHAPES, leaks
from traces import check_trace


def test_every_text_is_redacted_and_escaped():
    hostile = '<script>alert(1)</script> "quoted" \x1b[31m ' + " ".join(s.text for s in SHAPES)
    svg = timeline([Row("0", hostile, [Bar(0.0, 1.0, 1, hostile, hostile)], 0.5, "died", hostile)], 0.0, 2.0)
    doc = page(hostile, [svg, table([hostile], [[hostile]]), line_chart({hostile: [(1, 2), (2, 3)]}, hostile, hostile)])
    assert "<script" not in doc and "\x1b" not in doc
    assert not leaks(doc), leaks(doc)
    assert text("<a & 'b'>") == "&lt;a &amp; &#x27;b&#x27;&gt;"
    # no script, nothing to fetch: no source, link, import or url() (the URLs left are text)
    assert not re.search(r"<(script|link|img|iframe|object)\b|\b(src|href)=|@import|url\(", doc)


def test_timeline_has_one_row_per_entry_and_its_marks():
    rows = [Row(str(r), f"rank {r}", [Bar(0.0, 1e-9, 1, "tiny"), Bar(0.5, 1.5, 0, "step 1")],
                2.0 if r == 1 else None, "died" if r == 1 else "") for r in range(3)]
    svg = timeline(rows, 0.0, 2.5)
    assert re.findall(r'<g class="row" data-key="(\d)"', svg) == ["0", "1", "2"]
    assert re.findall(r'<g class="mark mark-died" data-key="(\d)"', svg) == ["1"]
    assert 'width="1"' in svg  # a bar narrower than a pixel is still drawn, one pixel wide


def test_trace_of_overlapping_calls_nests_one_thread_per_lane(tmp_path):
    line = RankLine(0, 4242, "node1", [Slice("step", "step 1", 0.0, 2.0, 1),
                                       Slice("collective", "all_reduce", 0.1, 0.5, 1, 64),
                                       Slice("collective", "broadcast", 0.4, 0.9, 2, 8),  # overlaps without nesting
                                       Slice("collective", "barrier", 1.0, 1.1, 3)],
                    Mark("died", 1.5, "rank 0 raised"))
    other = RankLine(1, 4243, "node1", [Slice("collective", "all_reduce", 0.1, 0.6, 1, 64)])
    doc = trace_events([line, other])
    assert check_trace(doc) == {4242: 0, 4243: 1}
    lanes = {e["name"]: e["tid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert lanes["broadcast"] != lanes["all_reduce"] and lanes["barrier"] == lanes["all_reduce"]
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 4242 and e["name"] == "all_reduce"]
    assert xs[0]["args"] == {"n": 1, "op": "all_reduce", "bytes": 64} and xs[0]["ts"] == 100000.0
    # the hook's file: steps end at the next one, an open call that never completed ends at the death
    (tmp_path / "coll-7.txt").write_text("1.0 1.5 all_reduce 16 1\nstep 1.6 1\nopen 2.0 barrier 0 2\n"
                                         "step 2.1 2\nbad line\n3.0 3.1\n")
    rank = read_rank(str(tmp_path), 7, 0, end=4.0)
    assert [(s.name, s.start, s.end) for s in rank.slices] == [
        ("step 1", 1.6, 2.1), ("step 2", 2.1, 4.0), ("all_reduce", 1.0, 1.5),
        ("barrier (not completed)", 2.0, 4.0), ("collective", 3.0, 3.1)]


def test_page_keeps_an_existing_files_mode_and_refuses_a_link(tmp_path):
    from ddpdoctor.errors import UsageError

    target = tmp_path / "r.html"
    target.write_text("old")
    os.chmod(target, 0o640)
    save_page(str(target), "<p>new</p>")
    assert target.read_text() == "<p>new</p>" and (target.stat().st_mode & 0o777) == 0o640
    link = tmp_path / "link.html"
    link.symlink_to(target)
    with pytest.raises(UsageError):
        save_page(str(link), "x")
    assert target.read_text() == "<p>new</p>" and sorted(p.name for p in tmp_path.iterdir()) == ["link.html", "r.html"]


@pytest.mark.timeout(60)
def test_run_html_link_is_refused_before_the_job_starts(cli_env, tmp_path):
    (tmp_path / "elsewhere").write_text("mine")
    (tmp_path / "r.html").symlink_to(tmp_path / "elsewhere")
    marker = tmp_path / "started"
    p = subprocess.run([sys.executable, "-m", "ddpdoctor", "run", "--dir", str(tmp_path / "run"), "--html",
                        str(tmp_path / "r.html"), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                       env=cli_env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error[json-path]: --html ") and "symbolic link" in p.stderr
    assert not marker.exists() and not (tmp_path / "run").exists()
    assert (tmp_path / "elsewhere").read_text() == "mine"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [["bench", "--nproc", "2"], ["locate", "--nproc", "2"]])
def test_bench_and_locate_refuse_an_html_link_before_any_work(cli_env, tmp_path, command):
    (tmp_path / "elsewhere").write_text("mine")
    (tmp_path / "r.html").symlink_to(tmp_path / "elsewhere")
    p = subprocess.run([sys.executable, "-m", "ddpdoctor", *command, "--html", str(tmp_path / "r.html")],
                       env=cli_env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error[json-path]: --html ") and "symbolic link" in p.stderr
    assert p.stdout == "" and (tmp_path / "elsewhere").read_text() == "mine"
