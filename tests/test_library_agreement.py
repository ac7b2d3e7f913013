"""The agreement rule: when ranks disagree, every rank raises the same error and the next call is right.

The disagreement matrix runs in one world of 3 gloo ranks: for each collective helper, rank 1 passes
a bad or different input; every rank must raise the same CollectiveMismatchError naming rank 1, and
the following call must return the right answer on every rank. Ranks that never call (or raise
before calling) are covered with short timeouts, and the happy path's cost is counted in calls.
"""

from __future__ import annotations

import datetime
import os
import re
import time

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler, TensorDataset

from ddpdoctor.training import (BarrierTimeoutError, CollectiveMismatchError, CollectiveTimeoutError,
                               all_reduce_mean, all_reduce_params, barrier, broadcast_object, collect_results,
                               gather, gather_all_tensors, gather_for_metrics, gather_object,
                               pad_across_processes, reduce, reduce_dict, zero_first)
from worlds import run_world


def _model(extra: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 2), *([torch.nn.Linear(2, 2)] if extra else []))


def _sampler(rank_override=None):
    return DistributedSampler(TensorDataset(torch.arange(7.0)), shuffle=False,
                              **({} if rank_override is None else {"rank": rank_override}))


def _scenarios(rank):
    """(name, call on a bad rank 1 / good elsewhere, follow-up call, expected follow-up result)."""
    bad = rank == 1
    x = torch.full((2, 3), float(rank))
    return [
        # accelerate test_ops.py test_op_checker: different shapes / dtypes into gather
        ("gather/dtype", lambda: gather(x.double() if bad else x)),
        ("gather/shape", lambda: gather(torch.zeros(2, 4) if bad else x)),
        ("gather/ndim-over-8", lambda: gather(torch.zeros([1] * 10) if bad else torch.zeros([1] * 9))),
        ("gather/non-tensor", lambda: gather([1, 2] if bad else x)),
        ("gather/keys", lambda: gather({"a": x, **({"b": x} if bad else {})})),
        ("gather/tuple-vs-list", lambda: gather((x,) if bad else [x])),
        ("gather/dst", lambda: gather(x, dst=1 if bad else 0)),
        ("gather/bad-dst", lambda: gather(x, dst=9 if bad else 0)),
        # mmengine test_dist.py test_gather_object / torch gather_object: dst and unpicklable objects
        ("gather_object/unpicklable", lambda: gather_object((lambda: 0) if bad else rank)),
        ("gather_object/dst", lambda: gather_object(rank, dst=2 if bad else 0)),
        # mmengine test_broadcast_object_list: src must agree
        ("broadcast_object/src", lambda: broadcast_object(rank, src=2 if bad else 0)),
        ("broadcast_object/unpicklable-src", lambda: broadcast_object((lambda: 0) if bad else None, src=1)),
        # mmengine test_all_reduce: sum / mean / max / min of int and float data
        ("reduce/dtype", lambda: reduce(torch.tensor([1, 2]) if bad else torch.tensor([1.0, 2.0]), "sum")),
        ("reduce/shape", lambda: reduce(torch.zeros(3) if bad else torch.zeros(2), "sum")),
        ("reduce/op", lambda: reduce(torch.zeros(2), "max" if bad else "sum")),
        ("reduce/bad-op", lambda: reduce(torch.zeros(2), "median" if bad else "sum")),
        ("reduce/non-tensor", lambda: reduce("loss" if bad else torch.zeros(2), "sum")),
        # detectron2 comm.reduce_dict / mmengine test_all_reduce_dict: different keys
        ("reduce_dict/keys", lambda: reduce_dict({"loss": 1.0, **({"acc": 0.5} if bad else {})})),
        ("reduce_dict/one-of-40-shapes", lambda: reduce_dict({f"metric_{i:02d}": torch.zeros(3 if bad and i == 37 else 2)
                                                              for i in range(40)})),
        ("reduce_dict/non-dict", lambda: reduce_dict([1.0] if bad else {"loss": 1.0})),
        ("all_reduce_mean/shape", lambda: all_reduce_mean(torch.zeros(3 if bad else 2))),
        # accelerate test_ops.py test_pad_across_processes
        ("pad_across_processes/ndim", lambda: pad_across_processes(torch.zeros(2) if bad else x)),
        # torchmetrics test_distributed.py gather_all_tensors: same ndim and dtype required
        ("gather_all_tensors/ndim", lambda: gather_all_tensors(torch.zeros(2) if bad else x)),
        ("gather_all_tensors/non-tensor", lambda: gather_all_tensors(3 if bad else x)),
        # accelerate test_metrics.py: per-sample results and the sampler must match
        ("gather_for_metrics/length", lambda: gather_for_metrics(torch.zeros(2 if bad else 3), _sampler())),
        ("gather_for_metrics/sampler-rank", lambda: gather_for_metrics(torch.zeros(3),
                                                                        _sampler(0 if bad else None))),
        ("gather_for_metrics/list-vs-tensor", lambda: gather_for_metrics([0] * 3 if bad else torch.zeros(3),
                                                                         _sampler())),
        ("gather_for_metrics/bad-total", lambda: gather_for_metrics(x, total=-1 if bad else 7)),
        ("gather_for_metrics/tuple-with-str", lambda: gather_for_metrics((torch.zeros(3), "labels" if bad else torch.zeros(3)),
                                                                         _sampler())),
        # mmengine test_all_reduce_params: different models
        ("all_reduce_params/model", lambda: all_reduce_params(_model(bad), grads=False)),
        ("collect_results/unpicklable", lambda: collect_results([(lambda: 0)] if bad else [rank], 3)),
        # A rank that called another helper (the wrong-answer bug: calls paired across helpers)
        ("helpers/differ", lambda: reduce_dict({"loss": 1.0}) if bad else gather(x)),
    ]


def _follow_ups(rank, world):
    x = torch.full((1, 2), float(rank))
    return {
        "gather": lambda: gather(x).tolist(),
        "gather_object": lambda: gather_object(rank),
        "broadcast_object": lambda: broadcast_object({"from": rank}, src=2),
        "reduce": lambda: reduce(torch.tensor([rank, 1]), "sum").tolist(),
        "reduce_dict": lambda: reduce_dict({"n": rank + 1}, average=False),
        "all_reduce_mean": lambda: all_reduce_mean(torch.tensor([2.0 * rank])).tolist(),
        "pad_across_processes": lambda: pad_across_processes(torch.ones(rank + 1)).tolist(),
        "gather_all_tensors": lambda: [t.tolist() for t in gather_all_tensors(torch.ones(rank))],
        "gather_for_metrics": lambda: gather_for_metrics(torch.tensor(list(_sampler())), _sampler()).tolist(),
        "all_reduce_params": lambda: _reduced_params(rank),
        "collect_results": lambda: collect_results([rank, rank + 10], 5),
        "helpers": lambda: gather(x).tolist(),
    }


def _reduced_params(rank):
    m = _model(False)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(rank)
    all_reduce_params(m, grads=False)
    return sorted({round(v, 6) for p in m.parameters() for v in p.flatten().tolist()})


def _matrix(rank, world):
    out = {}
    follow = _follow_ups(rank, world)
    for name, call in _scenarios(rank):
        start = time.monotonic()
        try:
            call()
            got = ("no error", "")
        except CollectiveMismatchError as exc:
            got = (type(exc).__name__, str(exc))
        except Exception as exc:  # noqa: BLE001 - a lone local error is exactly what must not happen
            got = (type(exc).__name__, str(exc))
        out[name] = (*got, time.monotonic() - start, follow[name.split("/")[0]]())
    return out


_EXPECTED_FOLLOW_UPS = {
    "gather": [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]],
    "gather_object": [0, 1, 2],
    "broadcast_object": {"from": 2},
    "reduce": [3, 3],
    "reduce_dict": {"n": 6},
    "all_reduce_mean": [2.0],
    "pad_across_processes": [1.0, 0.0, 0.0],  # rank 0's view; ranks differ only in how many ones
    "gather_all_tensors": [[], [1.0], [1.0, 1.0]],
    "gather_for_metrics": [0, 1, 2, 3, 4, 5, 6],
    "all_reduce_params": [1.0],
    "collect_results": [0, 1, 2, 10, 11],
    "helpers": [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]],
}


@pytest.mark.timeout(90)
def test_disagreement_matrix_every_rank_raises_the_same_error_and_the_next_call_is_right():
    results = run_world(_matrix, 3, timeout=75)
    names = [name for name, _ in _scenarios(0)]
    for name in names:
        kinds = {results[r][name][0] for r in range(3)}
        messages = {results[r][name][1] for r in range(3)}
        assert kinds == {"CollectiveMismatchError"}, (name, [results[r][name][:2] for r in range(3)])
        assert len(messages) == 1, (name, messages)
        message = messages.pop()
        assert "rank 1" in message or "rank(s) [1]" in message, (name, message)
        assert "\n" not in message
        for r in range(3):
            assert results[r][name][2] < 10, (name, r, results[r][name][2])  # raised at once, no timeout
            follow = results[r][name][3]
            family = name.split("/")[0]
            expected = _EXPECTED_FOLLOW_UPS[family]
            if family == "pad_across_processes":
                expected = [1.0] * (r + 1) + [0.0] * (2 - r)
            assert follow == expected, (name, r, follow)
    # The messages name the difference, not only that there is one.
    one = results[0]
    assert one["gather/dtype"][1] == ("gather(): ranks disagree: rank 0: float32[2, 3]; rank 1: float64[2, 3]; "
                                      "rank 2: float32[2, 3]")
    assert one["gather/ndim-over-8"][1].startswith("gather(): ranks disagree: rank 0: float32[1, 1, 1, 1, 1, 1, 1, 1, 1]; "
                                                   "rank 1: float32[1, 1, 1, 1, 1, 1, 1, 1, 1, 1]")
    assert one["gather/non-tensor"][1].startswith("gather(): bad input on rank(s) [1]: rank 1: TypeError: gather() "
                                                  "takes tensors (or dicts, lists, tuples of them), got int")
    # Keys and entries are named exactly (a second exchange, on the error path only).
    assert one["reduce_dict/keys"][1] == "reduce_dict(): ranks disagree: acc only on rank(s) [1]"
    assert one["reduce_dict/one-of-40-shapes"][1] == ("reduce_dict(): ranks disagree: metric_37: rank 0 float32[2], "
                                                      "rank 1 float32[3], rank 2 float32[2]")
    assert one["gather/keys"][1] == "gather(): ranks disagree: b only on rank(s) [1]"
    assert one["reduce/op"][1] == ("reduce(): ranks disagree: rank 0: sum of float32[2]; rank 1: max of float32[2]; "
                                   "rank 2: sum of float32[2]")
    assert one["reduce/bad-op"][1].startswith("reduce(): bad input on rank(s) [1]: rank 1: ValueError: reduce(): "
                                              "reduction='median'")
    assert re.fullmatch(r"call #\d+: ranks called different helpers: rank 0: gather\(\), rank 1: reduce_dict\(\), "
                        r"rank 2: gather\(\)", one["helpers/differ"][1]), one["helpers/differ"][1]
    assert "rank 1: ValueError: this rank's sampler has num_replicas=3, rank=0" in one["gather_for_metrics/sampler-rank"][1]


# --- ranks that never call -------------------------------------------------------------------------

def _never_calls(rank, world):
    out = {}
    # barrier: rank 2 arrives after the others gave up. It must not pass a barrier nobody else is at,
    # and since a store barrier leaves nothing pending, the next barrier works on every rank.
    if rank == 2:
        time.sleep(1.5)
    start = time.monotonic()
    try:
        barrier(timeout=0.5)
        out["barrier"] = ("passed", time.monotonic() - start)
    except BarrierTimeoutError as exc:
        out["barrier"] = (str(exc), time.monotonic() - start)
    barrier(timeout=10)
    out["barrier-after"] = "passed"
    # gather: rank 2 raises before calling (it never calls); the others give up after their timeout,
    # rank 2's next call finds them gone, and every later call says the group is unusable.
    x = torch.tensor([float(rank)])
    start = time.monotonic()
    try:
        if rank == 2:
            raise RuntimeError("data loader failed on this rank")
        gather(x, timeout=1.0)
        out["gather"] = ("returned", 0.0)
    except CollectiveTimeoutError as exc:
        out["gather"] = (str(exc), time.monotonic() - start)
    except RuntimeError:
        time.sleep(2.5)
        start = time.monotonic()
        try:
            gather(x, timeout=1.0)
            out["gather"] = ("returned", 0.0)
        except CollectiveTimeoutError as exc:
            out["gather"] = (str(exc), time.monotonic() - start)
    start = time.monotonic()
    try:
        reduce_dict({"n": 1})
        out["next"] = ("returned", 0.0)
    except CollectiveTimeoutError as exc:
        out["next"] = (str(exc), time.monotonic() - start)
    barrier(timeout=20)  # the store's barrier still works: stay until rank 2 has made its late call
    return out


@pytest.mark.timeout(60)
def test_a_rank_that_never_calls_makes_every_rank_raise_within_the_timeout():
    results = run_world(_never_calls, 3, timeout=45)
    for r in (0, 1):
        message, waited = results[r]["barrier"]
        assert message == f"only 2 of 3 ranks reached barrier() within 0.5s (rank {r} did)"
        assert waited < 10
    message, waited = results[2]["barrier"]
    assert message == ("only 2 of 3 ranks reached barrier() within the others' timeout; rank 2 arrived after "
                       "they gave up")
    assert all(out["barrier-after"] == "passed" for out in results)
    gathered = {out["gather"][0] for out in results}
    assert gathered == {"gather(): call #0 was abandoned: rank(s) [2] did not reach it within 1s (raised before "
                        "calling it, took another code path, or are stuck); this process group is unusable from "
                        "here (the abandoned collective would pair with the next one)"}, gathered
    for r in range(3):
        assert results[r]["gather"][1] < 10, results[r]  # the timeout and a short grace, not the group's 60 s
        message, waited = results[r]["next"]
        assert message.startswith("reduce_dict(): call #0 was abandoned: rank(s) [2]"), message
        assert waited < 2  # at once: no collective is attempted


# --- the happy path's cost ---------------------------------------------------------------------------

_COLLECTIVES = ("all_gather_single", "all_gather_into_tensor", "all_gather", "broadcast", "all_reduce", "gather",
                "reduce", "broadcast_object_list", "all_gather_object", "gather_object", "barrier", "scatter")


class _CountingStore:
    def __init__(self, store, counts):
        self._store, self._counts = store, counts

    def __getattr__(self, name):
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self._counts["store"] += 1
            return attr(*args, **kwargs)
        return counted


def _count(rank, world):
    counts = {"collectives": 0, "store": 0}
    for name in _COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None:
            continue

        def counted(*args, _original=original, **kwargs):
            counts["collectives"] += 1
            return _original(*args, **kwargs)
        setattr(dist, name, counted)
    real_store = dist.distributed_c10d._get_default_store
    dist.distributed_c10d._get_default_store = lambda: _CountingStore(real_store(), counts)

    def measure(fn):
        fn()  # warm: the eager size adapts to the previous call
        before = dict(counts)
        fn()
        return counts["collectives"] - before["collectives"], counts["store"] - before["store"]

    small = torch.randn(256)                   # 1 KiB
    large = torch.randn(256 * 1024)            # 1 MiB: beyond what rides with the agreement
    sampler = DistributedSampler(TensorDataset(torch.arange(64.0)), shuffle=True)
    return {
        "gather small": measure(lambda: gather(small)),
        "gather large": measure(lambda: gather(large)),
        "gather nested": measure(lambda: gather({"a": small, "b": [small.long(), small > 0]})),
        "gather_object": measure(lambda: gather_object({"rank": rank})),
        "broadcast_object": measure(lambda: broadcast_object({"rank": rank})),
        "reduce_dict small": measure(lambda: reduce_dict({"loss": torch.tensor(1.0), "n": 3})),
        "reduce large": measure(lambda: reduce(large, "sum")),
        "gather_for_metrics": measure(lambda: gather_for_metrics(torch.randn(len(sampler), 4), sampler)),
        "pad_across_processes": measure(lambda: pad_across_processes(small)),
        "barrier": measure(lambda: barrier(timeout=10)),
    }


@pytest.mark.timeout(60)
def test_the_happy_path_costs_at_most_one_extra_small_exchange():
    results = run_world(_count, 2, timeout=45)
    for counts in results:
        # Small inputs travel with the agreement itself: one collective in all, as the plain one.
        for name in ("gather small", "gather nested", "gather_object", "broadcast_object", "reduce_dict small",
                     "gather_for_metrics", "pad_across_processes"):
            assert counts[name] == (1, 0), (name, counts[name])
        # Large: the agreement plus the data (one broadcast per rank on gloo, one all_reduce).
        assert counts["gather large"] == (1 + 2, 0)
        assert counts["reduce large"] == (1 + 1, 0)
        # The barrier is the store's: an add, and a set (last rank) or a wait.
        assert counts["barrier"] == (0, 2)


# --- zero_first when rank 0 leaves right after its block --------------------------------------------

def _zero_first_tcp(rank, world, port_file):
    # Rank 0 hosts the TCPStore (as torchrun's rank 0 does); its process ends as soon as fn returns.
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=20))
        with open(port_file + ".tmp", "w") as f:
            f.write(str(store.port))
        os.replace(port_file + ".tmp", port_file)
    else:
        deadline = time.monotonic() + 20
        while not os.path.exists(port_file) and time.monotonic() < deadline:
            time.sleep(0.01)
        store = dist.TCPStore("127.0.0.1", int(open(port_file).read()), world, is_master=False,
                              timeout=datetime.timedelta(seconds=20))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    ran = []
    if rank != 0:
        time.sleep(0.6)  # the others are still on their way when rank 0 finishes its block
    with zero_first(timeout=20):
        ran.append(rank)
    return ran


@pytest.mark.timeout(60)
def test_zero_first_survives_rank_zero_leaving_right_after_its_block(tmp_path):
    results = run_world(_zero_first_tcp, 3, str(tmp_path / "port"), backend=None, timeout=40)
    assert results == [[0], [1], [2]]
