"""The collectives check on real gloo worlds: exact results, the bad rank named, hangs, stragglers, busbw."""

from __future__ import annotations

import collective_faults
import pytest

from ddpdoctor.result import Status
from ddpdoctor.runner.options import RunOptions
from ddpdoctor.runner.local import run_checks

PER_RANK = 69  # results each rank checks on one node: see CollectivesCheck.cases (avg int64 skipped)


def _run(only, **kw):
    out = run_checks(RunOptions(only=only, **kw))
    assert out.report is not None
    return out, {r.name: r for r in out.report.results}


def _fault(env, **values):
    env.setenv("DDPDOCTOR_PLUGINS", "collective_faults")
    for key, value in values.items():
        env.setenv(f"FAULT_{key.upper()}", str(value))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("nproc", [2, 3, 4])
def test_healthy_world_every_result_exact_with_nccl_tests_bandwidth(clean_launcher_env, nproc):
    out, res = _run(["collectives"], nproc=nproc, timeout=30)
    r = res["collectives"]
    assert out.exit_code == 0 and r.status == Status.PASS, r.summary
    assert r.summary.startswith(f"{PER_RANK * nproc} results exact on every rank ({nproc} ranks, 2 skipped); "
                                "all_reduce busbw "), r.summary
    assert r.summary.endswith(" GB/s at 1.0 MiB")
    assert "skipped: all_reduce(avg) int64 (world): AVG needs a floating dtype" in r.details
    assert "skipped: intra-/inter-node passes: one node, no inter-node link to check" in r.details
    for o in r.outcomes:
        assert o.data["checked"] == PER_RANK and o.data["wrong"] == []
        assert [t["op"] for t in o.data["timings"]] == ["all_reduce(sum)", "all_gather(tensor)", "reduce_scatter",
                                                       "all_to_all", "broadcast(root=last)", "send_recv(ring)"]
    from ddpdoctor.checks.collectives import bench_rows

    rows = {row["op"]: row for row in bench_rows(r.outcomes, nproc)}
    factors = {"all_reduce(sum)": 2 * (nproc - 1) / nproc, "all_gather(tensor)": (nproc - 1) / nproc,
               "reduce_scatter": (nproc - 1) / nproc, "all_to_all": (nproc - 1) / nproc,
               "broadcast(root=last)": 1.0, "send_recv(ring)": 1.0}
    for op, factor in factors.items():
        row = rows[op]
        assert row["busbw"] == pytest.approx(row["algbw"] * factor)
        assert row["algbw"] == pytest.approx(row["size"] / row["time_us"] / 1e3)
        assert sorted(row["rank_time_us"]) == [str(k) for k in range(nproc)]
    assert rows["all_reduce(sum)"]["size"] == 262147 * 4
    assert rows["all_gather(tensor)"]["size"] == 262147 * 4 * nproc  # nccl-tests: the whole buffer


@pytest.mark.timeout(90)
@pytest.mark.parametrize("nproc,rank,op,dtype,count,index,expected", [
    (3, 1, "all_reduce(sum)", "float32", 8, 5, 9),
    (4, 2, "all_gather(list)", "bfloat16", 1531, 1531 + 7, 4),  # rank 1's block, element 7
    (2, 0, "reduce_scatter", "int64", 1531, 1530, 7),
    (4, 3, "send_recv(ring)", "float16", 1531, 0, 3),
    (3, 2, "broadcast(root=0)", "float32", 1531, 1530, 3),
])
def test_perturbed_result_names_the_rank_op_dtype_index_and_values(clean_launcher_env, nproc, rank, op, dtype,
                                                                   count, index, expected):
    _fault(clean_launcher_env, rank=rank, op=op, dtype=dtype, count=count, index=index)
    out, res = _run(["coll-perturb"], nproc=nproc, timeout=30)
    r = res["coll-perturb"]
    assert out.exit_code == 1
    assert r.status == Status.FAIL and r.finding == "collective-wrong-result" and r.ranks == (rank,)
    assert r.summary == (f"{op} {dtype} x{count} wrong on rank {rank} (world): first wrong index {index}: "
                         f"expected {expected}, got {expected + 1} (1 of {r.outcomes[rank].data['wrong'][0]['of']} "
                         "elements wrong)")
    assert f"rank {rank} received wrong data" in r.hint
    assert r.details[0] == "wrong: " + r.summary  # -v lists every wrong result, one line each
    assert [o.status for o in r.outcomes] == [Status.FAIL if k == rank else Status.PASS for k in range(nproc)]


@pytest.mark.timeout(90)
def test_fake_two_nodes_isolate_a_bad_inter_node_link(clean_launcher_env):
    # Testing aid: fake_local_world_size=2 pretends ranks 0,1 and 2,3 are two nodes.
    _fault(clean_launcher_env, rank=3, op="all_reduce(sum)", dtype="float32", count=8, index=5,
           group="inter-node")
    out, res = _run(["coll-perturb"], nproc=4, timeout=30, options={"fake_local_world_size": 2})
    r = res["coll-perturb"]
    assert r.status == Status.FAIL and r.ranks == (3,)
    assert r.summary == ("all_reduce(sum) float32 x8 wrong on rank 3 (inter-node (local rank 1: ranks 1,3)): "
                         "first wrong index 5: expected 5, got 6 (1 of 8 elements wrong)")
    assert r.outcomes[0].data["groups"] == ["world", "intra-node (node 0: ranks 0-1)",
                                            "inter-node (local rank 0: ranks 0,2)"]
    assert r.outcomes[3].data["groups"] == ["world", "intra-node (node 1: ranks 2-3)",
                                            "inter-node (local rank 1: ranks 1,3)"]


@pytest.mark.timeout(90)
def test_fake_two_nodes_healthy_check_every_group(clean_launcher_env):
    out, res = _run(["collectives"], nproc=4, timeout=30, options={"fake_local_world_size": 2})
    r = res["collectives"]
    assert r.status == Status.PASS, r.summary
    per_group = 11 * 2 + 1  # float32, small and odd sizes, every op, plus the barrier
    assert r.summary.startswith(f"{4 * (PER_RANK + 2 * per_group)} results exact on every rank, within and across "
                                "2 nodes (4 ranks, 1 skipped)")


@pytest.mark.timeout(60)
def test_rank_that_never_reaches_an_operation_is_named_with_it(clean_launcher_env):
    _fault(clean_launcher_env, rank=1, op="all_reduce(max)", dtype="float16", count=1531)
    out, res = _run(["coll-hang"], nproc=3, timeout=4)
    r = res["coll-hang"]
    assert r.status == Status.TIMEOUT and r.ranks == (0, 1, 2)
    assert r.summary.startswith(
        "rank 1 never reached #14 all_reduce(max) float16 x1531 in world "
        "(last entered #13 all_reduce(max) bfloat16 x1531); ranks 0,2 entered it; "), r.summary
    assert "ranks 0,2 stuck in all_reduce" in r.summary
    assert "rank 1 stuck in hang_before_entering (tests/collective_faults.py:" in r.summary
    assert "progress: rank 1: #13 all_reduce(max) bfloat16 x1531 (world)" in r.details


@pytest.mark.timeout(60)
def test_rank_that_skips_an_operation_is_named_with_it(clean_launcher_env):
    _fault(clean_launcher_env, rank=1, op="barrier", dtype="float32", count=0)
    out, res = _run(["coll-skip"], nproc=3, timeout=4)
    r = res["coll-skip"]
    assert r.status == Status.TIMEOUT and r.ranks == (0, 1, 2)
    assert r.summary.startswith(
        "rank 1 skipped #69 barrier; ranks 0,2 never reached #70 broadcast(plan: timed pass) in world "
        "(last entered #69 barrier); rank 1 entered it; "), r.summary
    assert "ranks 0,2 stuck in barrier" in r.summary


@pytest.mark.timeout(90)
def test_slowed_rank_is_named_as_the_straggler(clean_launcher_env):
    _fault(clean_launcher_env, rank=2, sleep=0.04)
    out, res = _run(["coll-slow"], nproc=3, timeout=30)
    r = res["coll-slow"]
    assert out.exit_code == 0  # a warning
    assert r.status == Status.WARN and r.finding == "collective-straggler" and r.ranks == (2,), r.summary
    assert r.summary.startswith("rank 2 is a straggler: it reaches each collective ")
    assert r.summary.endswith(" in 6/6 timed operations; the others wait for it")
    lag_ms = float(r.summary.split("each collective ")[1].split(" ms")[0])
    assert 35 <= lag_ms < 200
    assert "rank 2's host" in r.hint


@pytest.mark.timeout(90)
@pytest.mark.parametrize("floor,status", [(5000.0, Status.FAIL), (0.0, Status.PASS)])
def test_min_busbw_is_a_preflight_gate(clean_launcher_env, floor, status):
    out, res = _run(["collectives"], nproc=2, timeout=30, options={"min_busbw": floor})
    r = res["collectives"]
    assert r.status == status, r.summary
    if status == Status.FAIL:
        assert r.finding == "busbw-below-minimum"
        assert r.summary.startswith("busbw below --min-busbw 5000 GB/s: ")
        assert r.summary.endswith(" (+5 more operations below)")


@pytest.mark.timeout(90)
def test_bench_counts_wrong_elements_per_row(clean_launcher_env):
    _fault(clean_launcher_env, rank=1, op="all_to_all", dtype="float32", count=8, index=3)
    bench = {"min_bytes": 32, "max_bytes": 128, "ops": ["all_to_all", "all_reduce(sum)"], "iters": 2, "warmup": 1}
    out, res = _run(["coll-bench-perturb"], nproc=2, timeout=30, options={"bench": bench})
    r = res["coll-bench-perturb"]
    assert r.status == Status.FAIL and r.ranks == (1,)
    assert r.summary == ("all_to_all float32 x8 wrong on rank 1 (world): first wrong index 3: expected 5, got 6 "
                         "(1 of 16 elements wrong)")
    from ddpdoctor.checks.collectives import bench_rows

    rows = [(row["size"], row["op"], row["count"], row["wrong"]) for row in bench_rows(r.outcomes, 2)]
    assert rows == [(32, "all_reduce(sum)", 8, 0), (32, "all_to_all", 8, 0), (64, "all_reduce(sum)", 16, 0),
                    (64, "all_to_all", 16, 1), (128, "all_reduce(sum)", 32, 0), (128, "all_to_all", 32, 0)]


def test_fault_module_is_the_one_loaded():
    assert collective_faults.CHECKS[0].name == "coll-perturb"
