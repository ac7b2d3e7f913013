"""``ddpdoctor bench`` and ``check --min-busbw`` as a user runs them, plus the pure helpers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from browser import console_errors, open_page

from ddpdoctor.diagnostics.collective_plan import BUS_FACTORS, bandwidth, format_bytes, select_ops

CMD = [sys.executable, "-m", "ddpdoctor"]


def run(args, env, timeout=90):
    return subprocess.run(CMD + args, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(120)
def test_bench_prints_an_nccl_tests_table_and_writes_json(cli_env, tmp_path):
    path = tmp_path / "bench.json"
    page = tmp_path / "bench.html"
    p = run(["bench", "--nproc", "3", "--min-bytes", "8", "--max-bytes", "64", "--ops", "all_reduce,send_recv",
             "--iters", "2", "--warmup", "1", "--json", str(path), "--html", str(page)], cli_env)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "ddpdoctor 0.1.0: local world of 3 ranks (gloo) on 1 node"
    assert lines[2].split() == ["#", "size", "count", "type", "op", "time", "algbw", "busbw", "#wrong"]
    body = [line.split() for line in lines[4:-2]]
    assert [(b[0], b[1], b[2], b[3], b[-1]) for b in body[:5]] == [
        ("8", "2", "float32", "all_reduce(sum)", "0"), ("8", "2", "float32", "all_reduce(max)", "0"),
        ("8", "2", "float32", "all_reduce(min)", "0"), ("8", "2", "float32", "all_reduce(avg)", "0"),
        ("8", "2", "float32", "send_recv(ring)", "0")]
    assert len(body) == 4 * 5  # 8, 16, 32, 64 bytes x 5 operations
    assert lines[-2].startswith("[ok]    collectives-bench  20 rows exact on every rank; avg busbw ")
    assert lines[-1].startswith("1 passed in ") and lines[-1].endswith("; exit 0")
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1 and doc["exit_code"] == 0 and doc["world"]["world_size"] == 3
    assert doc["settings"]["ops"] == ["all_reduce(sum)", "all_reduce(max)", "all_reduce(min)", "all_reduce(avg)",
                                      "send_recv(ring)"]
    for row in doc["rows"]:
        assert row["busbw"] == pytest.approx(row["algbw"] * (4 / 3 if row["family"] == "all_reduce" else 1.0))
        assert sorted(row["rank_time_us"]) == ["0", "1", "2"]
    # --html: bus and algorithm bandwidth against size, one line per operation with a point per size
    with open_page(page, tmp_path) as drv:
        for key in ("busbw", "algbw"):
            lines = drv.find_elements("css selector", f".chart-{key} g.series")
            assert [g.get_attribute("data-name") for g in lines] == doc["settings"]["ops"]
            for g, op in zip(lines, doc["settings"]["ops"]):
                shown = [c.find_element("tag name", "title").get_attribute("textContent") for c in
                         g.find_elements("tag name", "circle")]
                want = sorted((r["size"], r[key]) for r in doc["rows"] if r["op"] == op)
                assert len(shown) == 4 and [s.split(": ")[1].split(",")[0] for s in shown] == [str(n) for n, _ in want]
        assert "all_reduce(sum)" in drv.find_element("id", "table").text
        assert console_errors(drv) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,message", [
    (["--ops", "allreduce"], "error[unknown-collective]: no collective named 'allreduce'; use one of: "),
    (["--max-bytes", "lots"], "error[usage]: Invalid value for '--max-bytes': 'lots' is not a size in bytes"),
    (["--min-bytes", "1M", "--max-bytes", "1K"], "error[bad-size]: --min-bytes 1M is larger than --max-bytes 1K"),
])
def test_bench_usage_errors_exit_2_before_anything_runs(cli_env, args, message):
    p = run(["bench"] + args, cli_env)
    assert p.returncode == 2
    assert p.stderr.startswith(message), p.stderr


@pytest.mark.timeout(120)
def test_check_min_busbw_fails_the_run(cli_env):
    p = run(["check", "--only", "collectives", "--min-busbw", "5000"], cli_env)
    assert p.returncode == 1, p.stdout + p.stderr
    line = next(x for x in p.stdout.splitlines() if "collectives" in x)
    tag, name, summary = line.split(None, 2)
    assert (tag, name) == ("[FAIL]", "collectives")
    assert summary.startswith("busbw below --min-busbw 5000 GB/s: ")
    assert "fix: the interconnect is slower than --min-busbw" in p.stdout


@pytest.mark.timeout(60)
def test_list_marks_the_bench_as_on_request(cli_env):
    p = run(["list"], cli_env)
    names = {line.split()[0]: line for line in p.stdout.splitlines()}
    assert "collectives" in names and not names["collectives"].endswith(")")
    assert names["collectives-bench"].endswith("(slow) (on request)")


def test_bus_factors_are_nccl_tests():
    n = 8
    assert {k: f(n) for k, f in BUS_FACTORS.items()} == {
        "all_reduce": 1.75, "all_gather": 0.875, "reduce_scatter": 0.875, "all_to_all": 0.875,
        "broadcast": 1.0, "send_recv": 1.0, "barrier": 0.0}
    assert bandwidth(1_000_000, 100.0, "all_reduce", 4) == (10.0, 15.0)


def test_select_ops_accepts_families_and_names_in_run_order():
    assert select_ops(["send_recv", "all_reduce(max)", "broadcast"]) == [
        "all_reduce(max)", "broadcast(root=0)", "broadcast(root=last)", "send_recv(ring)"]
    with pytest.raises(ValueError, match="no collective named 'gather'"):
        select_ops(["gather"])
    assert format_bytes(1048588) == "1.0 MiB" and format_bytes(8) == "8 B"


@pytest.mark.timeout(150)
def test_bench_joins_a_torchrun_world_and_reports_once(cli_env):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "ddpdoctor",
           "bench", "--max-bytes", "32", "--ops", "all_reduce(sum),all_to_all", "--iters", "2", "--warmup", "1"]
    p = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("ddpdoctor 0.1.0: torchrun job of 2 ranks (gloo) on 1 node") == 1
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith("  ")]
    assert [(r[0], r[3]) for r in rows] == [("8", "all_reduce(sum)"), ("8", "all_to_all"), ("16", "all_reduce(sum)"),
                                            ("16", "all_to_all"), ("32", "all_reduce(sum)"), ("32", "all_to_all")]
    assert "collectives-bench  6 rows exact on every rank" in p.stdout
