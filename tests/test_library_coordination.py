"""Coordination helpers in worlds of 1 (no process group), 2, 3 and 4 gloo ranks."""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

from ddpdoctor.training import (BarrierTimeoutError, NotInitializedError, barrier, broadcast_object, gather,
                            main_process_first, print0, rank_zero_only, seed_everything, zero_first)
from worlds import run_world

_LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


# Decorated at import time, before any launcher variable or process group exists.
@rank_zero_only
def _only_zero(x):
    return x * 2


@rank_zero_only(default="skipped")
def _only_zero_default():
    return "ran"


@pytest.fixture
def alone(monkeypatch):
    for name in _LAUNCH:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "argv", ["train.py"])


@pytest.mark.timeout(30)
def test_world_of_one_without_process_group(alone, capsys):
    barrier()
    barrier(timeout=1)
    runs = []
    with zero_first():
        runs.append("global")
    with main_process_first(local=True):
        runs.append("local")
    assert runs == ["global", "local"]
    assert _only_zero(21) == 42 and _only_zero_default() == "ran"
    print0("once", 1)
    assert capsys.readouterr().out == "once 1\n"
    assert broadcast_object({"a": 1}) == {"a": 1}
    assert seed_everything(7) == 7 and seed_everything(7, per_rank=True) == 7
    first = torch.rand(3)
    seed_everything(7)
    assert torch.equal(torch.rand(3), first)
    with pytest.raises(ValueError, match=r"seed=-1"):
        seed_everything(-1)
    with pytest.raises(ValueError, match=r"src=1.*ranks 0 to 0"):
        broadcast_object(1, src=1)
    assert not dist.is_initialized()


def _order(rank, world, tmp, local):
    if local:  # two "nodes" of two ranks each
        os.environ.update(LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2", GROUP_RANK=str(rank // 2))
    # zero_first must not depend on the store's (the process group's) timeout.
    dist.distributed_c10d._get_default_store().set_timeout(datetime.timedelta(seconds=1))
    with zero_first(local=local):
        start = time.time()
        first = (rank % 2 == 0) if local else rank == 0
        if first:
            time.sleep(1.5)
        with open(os.path.join(tmp, f"{rank}.json"), "w") as f:
            json.dump({"start": start, "end": time.time()}, f)
    barrier()
    return {r: json.load(open(os.path.join(tmp, f"{r}.json"))) for r in range(world)}


@pytest.mark.timeout(60)
def test_zero_first_runs_rank_zero_first_then_the_others(tmp_path):
    stamps = run_world(_order, 3, str(tmp_path), False, timeout=30)[0]
    for r in (1, 2):
        assert stamps[r]["start"] >= stamps[0]["end"], stamps


@pytest.mark.timeout(60)
def test_zero_first_local_lets_each_node_go_first(tmp_path):
    stamps = run_world(_order, 4, str(tmp_path), True, timeout=30)[0]
    assert stamps[1]["start"] >= stamps[0]["end"], stamps
    assert stamps[3]["start"] >= stamps[2]["end"], stamps
    # The nodes do not wait for each other: node 1's first rank starts before node 0's finishes.
    assert stamps[2]["start"] < stamps[0]["end"], stamps


def _first_raises(rank, world, tmp):
    entered = time.monotonic()
    ran = False
    try:
        with zero_first(timeout=3600):
            ran = True
            if rank == 0:
                time.sleep(0.3)
                raise ValueError("download failed: HTTP 503")
    except Exception as exc:
        return type(exc).__name__, str(exc), ran, time.monotonic() - entered
    return "no error", "", ran, time.monotonic() - entered


@pytest.mark.timeout(60)
def test_an_exception_in_the_first_block_reaches_every_rank_within_seconds(tmp_path):
    results = run_world(_first_raises, 3, str(tmp_path), timeout=30)
    assert results[0][:3] == ("ValueError", "download failed: HTTP 503", True)
    for r in (1, 2):
        kind, message, ran, waited = results[r]
        assert kind == "ZeroFirstError"
        assert message == (f"rank 0 raised inside zero_first (ValueError: download failed: HTTP 503); "
                           f"rank {r} did not run the block")
        assert ran is False
        assert waited < 3.0


def _coordination(rank, world):
    out = {}
    barrier()
    barrier(timeout=10)
    out["zero"] = _only_zero(rank + 1)
    out["default"] = _only_zero_default()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print0("hello from", rank)
    out["printed"] = buf.getvalue()
    out["bcast"] = broadcast_object({"from": rank}, src=world - 1)
    seed_everything(11)
    out["same"] = gather(torch.rand(4)).view(world, 4).unique(dim=0).shape[0]
    out["seed"] = seed_everything(11, per_rank=True)
    out["differ"] = gather(torch.rand(4)).view(world, 4).unique(dim=0).shape[0]
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_rank_zero_only_print0_broadcast_and_seeds(world):
    results = run_world(_coordination, world, timeout=30)
    for r, out in enumerate(results):
        assert out == {
            "zero": 2 if r == 0 else None,
            "default": "ran" if r == 0 else "skipped",
            "printed": "hello from 0\n" if r == 0 else "",
            "bcast": {"from": world - 1},
            "same": 1,
            "seed": 11 + r,
            "differ": world,
        }


def _late_rank(rank, world):
    if rank == world - 1:
        return "did not come"
    try:
        barrier(timeout=0.5)
    except BarrierTimeoutError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(60)
def test_barrier_timeout_raises_on_the_ranks_that_arrived():
    results = run_world(_late_rank, 3, timeout=30)
    assert results == ["only 2 of 3 ranks reached barrier() within 0.5s (rank 0 did)",
                       "only 2 of 3 ranks reached barrier() within 0.5s (rank 1 did)", "did not come"]


def _not_initialized(rank, world):
    messages = []
    for call in (barrier, lambda: zero_first().__enter__(), lambda: broadcast_object(1),
                 lambda: gather(torch.ones(1))):
        try:
            call()
        except NotInitializedError as exc:
            messages.append(exc.one_line())
    return messages


@pytest.mark.timeout(60)
def test_launched_without_process_group_fails_loudly_instead_of_pretending():
    results = run_world(_not_initialized, 2, backend=None, timeout=30)
    for messages in results:
        assert len(messages) == 4
        assert messages[0] == ("error[no-process-group]: barrier() needs the other 1 ranks (WORLD_SIZE=2) but no "
                               "process group is initialized; call torch.distributed.init_process_group() first")
