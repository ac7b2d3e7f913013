"""Cross-rank verdicts of the process-group check, on identities as ranks report them."""

from __future__ import annotations

from ddpdoctor.check import WorldInfo
from ddpdoctor.checks.process_group import ProcessGroupCheck, identity_table
from ddpdoctor.result import Outcome, Status


def ident(rank, host="n1", gpu=None, uuid=None, ws=2, foreign=(), result=None):
    return Outcome(rank, Status.PASS, "joined", data={
        "host": host, "pid": 100 + rank, "rank": rank, "world_size": ws, "local_rank": rank,
        "device": f"cuda:{rank}" if uuid else "cpu", "gpu_index": gpu, "gpu_uuid": uuid, "init_seconds": 0.5,
        "first_all_reduce_seconds": 0.01, "all_reduce_result": float(ws if result is None else result),
        "foreign_gpu_memory": list(foreign)})


W2 = WorldInfo(world_size=2, backend="nccl")


def merge(outcomes, world=W2):
    return ProcessGroupCheck().merge(outcomes, world)


def test_two_ranks_on_one_gpu_fail_with_the_fix():
    r = merge([ident(0, gpu=0, uuid="GPU-a"), ident(1, gpu=0, uuid="GPU-a")])
    assert r.status == Status.FAIL and r.finding == "duplicate-gpu" and r.ranks == (0, 1)
    assert r.summary == "ranks 0-1 share one GPU (GPU-a) on n1"
    assert "torch.cuda.set_device(LOCAL_RANK)" in r.hint


def test_same_gpu_uuid_on_different_hosts_is_not_shared():
    r = merge([ident(0, host="n1", gpu=0, uuid="GPU-a"), ident(1, host="n2", gpu=0, uuid="GPU-a")])
    assert r.status == Status.PASS and r.summary.startswith("2 ranks on 2 nodes joined in 500 ms (nccl)")


def test_duplicate_and_missing_ranks_and_world_size_disagreement():
    r = merge([ident(0), ident(0)])
    assert r.status == Status.FAIL and r.summary == "rank 0 appears twice; rank 1 is missing"
    r = merge([ident(0, ws=2), ident(1, ws=3)])
    assert r.finding == "world-size-mismatch" and "[2, 3]" in r.summary


def test_wrong_all_reduce_names_the_rank():
    r = merge([ident(0), ident(1, result=3)])
    assert r.status == Status.FAIL and r.ranks == (1,) and r.finding == "wrong-all-reduce"


def test_foreign_memory_names_rank_gpu_and_megabytes():
    r = merge([ident(0, gpu=0, uuid="GPU-a"), ident(1, gpu=1, uuid="GPU-b", foreign=[{"gpu": 0, "mb": 1536}])])
    assert r.status == Status.WARN
    assert r.summary == "rank 1 holds 1536 MiB on GPU 0, which is not its own (GPU 1)"


def test_identity_table_is_aligned():
    rows = identity_table([ident(1, gpu=1, uuid="GPU-b").data, ident(0, gpu=0, uuid="GPU-a").data])
    assert rows == [
        "rank  host  pid  local  device  gpu      init",
        "0     n1    100  0      cuda:0  0 GPU-a  500 ms",
        "1     n1    101  1      cuda:1  1 GPU-b  500 ms",
    ]
