"""gather, gather_object, gather_for_metrics, reduce_dict, all_reduce_mean on worlds of 1, 2 and 3."""

from __future__ import annotations

import itertools
import logging
import sys

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpdoctor.training import (CollectiveMismatchError, all_reduce_mean, collect_results, gather, gather_for_metrics,
                            gather_object, reduce, reduce_dict)
from worlds import run_world

_LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


@pytest.fixture
def alone(monkeypatch):
    for name in _LAUNCH:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "argv", ["train.py"])


def _rows(rank, n, dtype=torch.float32):
    """Rank-specific rows: row i of rank r is [100r + i, -(100r + i)]."""
    base = torch.arange(n, dtype=torch.float64) + 100 * rank
    return torch.stack([base, -base], dim=1).to(dtype)


# --- gather ----------------------------------------------------------------------------------------

_SIZES = {2: [3, 3], 3: [2, 0, 5]}


def _gathers(rank, world):
    sizes = _SIZES[world]
    mine = _rows(rank, sizes[rank])
    out = {"all": gather(mine), "dst": gather(mine, dst=world - 1), "scalar": gather(torch.tensor(rank + 0.5)),
           "bool": gather(torch.tensor([True, False, True])[: rank + 1]),
           "bf16": gather(torch.full((rank + 1, 2), rank + 0.25, dtype=torch.bfloat16)),
           "empty": gather(torch.empty(0, 4, dtype=torch.int64)),
           "objects": gather_object({"rank": rank, "items": list(range(rank))}),
           "none": gather_object(None)}
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_gather_uneven_and_empty_shards(world):
    sizes = _SIZES[world]
    expected = torch.cat([_rows(r, sizes[r]) for r in range(world)])
    results = run_world(_gathers, world, timeout=30)
    for rank, out in enumerate(results):
        assert torch.equal(out["all"], expected)
        assert out["all"].dtype == torch.float32 and out["all"].shape == (sum(sizes), 2)
        if rank == world - 1:
            assert torch.equal(out["dst"], expected)
        else:
            assert out["dst"] is None
        assert torch.equal(out["scalar"], torch.arange(world) + 0.5)
        assert torch.equal(out["bool"], torch.cat([torch.tensor([True, False, True])[: r + 1] for r in range(world)]))
        assert torch.equal(out["bf16"], torch.cat([torch.full((r + 1, 2), r + 0.25, dtype=torch.bfloat16)
                                                   for r in range(world)]))
        assert out["empty"].shape == (0, 4) and out["empty"].dtype == torch.int64
        assert out["objects"] == [{"rank": r, "items": list(range(r))} for r in range(world)]
        assert out["none"] == [None] * world


@pytest.mark.timeout(30)
def test_world_of_one_returns_the_same_types(alone):
    t = _rows(0, 3)
    g = gather(t)
    assert torch.equal(g, t) and g.data_ptr() != t.data_ptr()
    assert torch.equal(gather(t, dst=0), t)
    assert torch.equal(gather(torch.tensor(2.0)), torch.tensor([2.0]))
    assert gather_object("x") == ["x"]
    assert collect_results([1, 2, 3], 2) == [1, 2]
    assert reduce_dict({"loss": torch.tensor(2.0), "n": 3}) == {"loss": torch.tensor(2.0), "n": 3.0}
    assert reduce_dict({"n": 3}, average=False) == {"n": 3}
    assert reduce_dict({}) == {}
    mean = all_reduce_mean(torch.tensor([1, 2]))
    assert torch.equal(mean, torch.tensor([1.0, 2.0])) and mean.dtype == torch.float32
    with pytest.raises(ValueError, match=r"gather\(\): dst=1 is not a rank"):
        gather(t, dst=1)


def _mismatches(rank, world):
    caught = []

    def attempt(fn):
        try:
            fn()
        except (CollectiveMismatchError, TypeError) as exc:
            caught.append(f"{type(exc).__name__}: {exc}")
        else:
            caught.append("no error")

    attempt(lambda: gather(torch.zeros(2, 3) if rank != 1 else torch.zeros(2)))            # ndim
    attempt(lambda: gather(torch.zeros(2, dtype=torch.float64 if rank == 2 else torch.float32)))  # dtype
    attempt(lambda: gather(torch.zeros(1, 3 + (rank == 0))))                                 # trailing shape
    attempt(lambda: gather(torch.zeros(1), dst=rank))                                       # dst
    attempt(lambda: gather(torch.zeros(1), dst=7 if rank == 1 else 0))                     # bad dst
    attempt(lambda: gather_object(lambda: None) if rank == 1 else gather_object(rank))     # unpicklable
    attempt(lambda: reduce_dict({"loss": 1.0, **({"acc": 0.5} if rank != 2 else {})}))      # keys
    attempt(lambda: all_reduce_mean(torch.zeros(2 + rank)))                                  # shape
    # The world is still in step after all of that.
    caught.append(gather(torch.tensor([rank])).tolist())
    return caught


@pytest.mark.timeout(60)
def test_mismatches_raise_the_same_clear_error_on_every_rank():
    results = run_world(_mismatches, 3, timeout=30)
    for rank, caught in enumerate(results):
        assert caught[0] == ("CollectiveMismatchError: gather(): ranks disagree: rank 0: float32[2, 3]; "
                             "rank 1: float32[2]; rank 2: float32[2, 3]")
        assert caught[1] == ("CollectiveMismatchError: gather(): ranks disagree: rank 0: float32[2]; "
                             "rank 1: float32[2]; rank 2: float64[2]")
        assert caught[2] == ("CollectiveMismatchError: gather(): ranks disagree: rank 0: float32[1, 4]; "
                             "rank 1: float32[1, 3]; rank 2: float32[1, 3]")
        assert caught[3] == ("CollectiveMismatchError: gather(): ranks disagree: rank 0: float32[1] dst=0; "
                             "rank 1: float32[1] dst=1; rank 2: float32[1] dst=2")
        assert caught[4] == ("CollectiveMismatchError: gather(): bad input on rank(s) [1]: rank 1: ValueError: "
                             "gather(): dst=7 is not a rank of this group (ranks 0 to 2); pass the same valid dst "
                             "on every rank, or dst=None")
        assert caught[5].startswith("CollectiveMismatchError: gather_object(): bad input on rank(s) [1]: rank 1: "
                                    "TypeError: this rank's function cannot be pickled")
        assert caught[6] == "CollectiveMismatchError: reduce_dict(): ranks disagree: acc missing on rank(s) [2]"
        assert caught[7] == ("CollectiveMismatchError: all_reduce_mean(): ranks disagree: rank 0: mean of float32[2]; "
                             "rank 1: mean of float32[3]; rank 2: mean of float32[4]")
        assert caught[8] == [0, 1, 2]


def _large(rank, world, broadcast):
    import ddpdoctor.training.gathering as gathering

    if not broadcast:
        gathering._BROADCAST_BACKENDS = ()
    sizes = [3000, 0, 1500, 20]  # 64-byte rows: ranks 0 and 2 exceed the eager part, 1 and 3 do not
    mine = _rows(rank, sizes[rank]).repeat(1, 8)
    blob = b"x" * (100_000 * rank)
    first = gather(mine)
    tiny = gather(torch.tensor([rank]))  # shrinks the next call's eager part to the minimum
    return first, gather(mine, dst=2), [len(b) for b in gather_object(blob)], tiny.tolist(), gather(mine)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("broadcast", [True, False], ids=["broadcast-rest", "padded-rest"])
def test_gather_of_shards_larger_than_the_eager_part(broadcast):
    sizes = [3000, 0, 1500, 20]
    expected = torch.cat([_rows(r, n).repeat(1, 8) for r, n in enumerate(sizes)])
    assert expected.element_size() * 16 * 1500 > 128 * 1024 // 4  # beyond the eager part of a world of 4
    results = run_world(_large, 4, broadcast, timeout=20)
    for rank, (whole, to_two, blobs, tiny, again) in enumerate(results):
        assert torch.equal(whole, expected) and torch.equal(again, expected)
        assert tiny == [0, 1, 2, 3]
        assert torch.equal(to_two, expected) if rank == 2 else to_two is None
        assert blobs == [0, 100_000, 200_000, 300_000]


# --- reduce_dict / all_reduce_mean -----------------------------------------------------------------

def _reductions(rank, world):
    d = {"loss": torch.tensor(float(rank + 1)), "count": rank + 1, "vec": torch.tensor([rank, 2 * rank]),
         "half": torch.tensor(rank, dtype=torch.float16)}
    return reduce_dict(d), reduce_dict(d, average=False), all_reduce_mean(torch.tensor([[rank, 1], [2, rank]]))


@pytest.mark.timeout(60)
def test_reduce_dict_and_all_reduce_mean_are_valid_on_every_rank():
    results = run_world(_reductions, 3, timeout=30)
    for avg, total, mean in results:
        assert avg.keys() == {"loss", "count", "vec", "half"}
        assert torch.equal(avg["loss"], torch.tensor(2.0))
        assert avg["count"] == 2.0 and isinstance(avg["count"], float)
        # An integer tensor keeps its dtype, as mmengine's all_reduce(op="mean"): 1 and 2 exactly here.
        assert torch.equal(avg["vec"], torch.tensor([1, 2])) and avg["vec"].dtype == torch.int64
        assert avg["half"].dtype == torch.float16 and avg["half"].item() == 1.0
        assert torch.equal(total["loss"], torch.tensor(6.0))
        assert total["count"] == 6 and isinstance(total["count"], int)
        assert torch.equal(total["vec"], torch.tensor([3, 6]))
        assert torch.equal(mean, torch.tensor([[1.0, 1.0], [2.0, 1.0]]))


def _overflow(call):
    """The OverflowError text of ``call()``, or its result: a wrapped value must never come back."""
    try:
        return ("result", call())
    except OverflowError as exc:
        return ("overflow", str(exc))


def _exact_sums(rank, world):
    big = 40_000  # 320 KB of int64: past the eager part, so one all_reduce per dtype carries it
    sign = -1 if rank % 2 else 1
    return {
        "reduce_dict": reduce_dict({"a": 2**62, "huge": 10**40 * (rank + 1), "neg": -(2**63)}, average=False),
        "mean": reduce_dict({"a": 2**62 + 1, "f": 0.1}),
        "max": reduce({"m": sign * 2**62, "t": torch.tensor([rank, -rank])}, "max"),
        "small": _overflow(lambda: reduce({"t": torch.tensor([1, 2**62])}, "sum")),
        "negative": _overflow(lambda: reduce({"t": torch.tensor(-(2**62) - 1)}, "sum")),
        "int32": _overflow(lambda: reduce(torch.full((2,), 2**30, dtype=torch.int32), "sum")),
        "uint8": _overflow(lambda: reduce_dict({"u": torch.tensor([200], dtype=torch.uint8)}, average=False)),
        "int_mean": _overflow(lambda: reduce(torch.tensor([2**62]), "mean")),
        "large": _overflow(lambda: reduce(torch.full((big,), 2**62), "sum")),
        "large_mean": _overflow(lambda: reduce(torch.full((big,), 2**62), "mean")),
        "fits": reduce(torch.full((big,), 2**62 // world), "sum")[:2].tolist(),
        "after": reduce_dict({"n": torch.tensor([rank, 1])}, average=False),  # the next call is still aligned
    }


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_integer_sums_are_exact_or_raise_overflow_on_every_rank(world):
    # reduce_dict({"a": 2**62}) over 2 ranks used to return -9223372036854775808: a wrapped int64.
    results = run_world(_exact_sums, world, timeout=60)
    first = results[0]
    for out in results:
        assert out["reduce_dict"] == {"a": world * 2**62, "huge": 10**40 * world * (world + 1) // 2,
                                      "neg": -world * 2**63}
        assert all(type(v) is int for v in out["reduce_dict"].values())
        assert out["mean"] == {"a": float(2**62 + 1), "f": sum([0.1] * world) / world}  # float64, not float32
        assert out["max"]["m"] == 2**62 and torch.equal(out["max"]["t"], torch.tensor([world - 1, 0]))
        for key in ("small", "negative", "int32", "uint8", "int_mean", "large", "large_mean"):
            # The same error on every rank, naming the value, the exact sum and the dtype's range.
            assert out[key] == first[key] and out[key][0] == "overflow", (key, out[key])
        assert first["small"][1] == (f"reduce(): the sum of t (element 1) over {world} ranks is {world * 2**62}, "
                                     f"outside int64's range [-9223372036854775808, 9223372036854775807]; reduce "
                                     f"it as a Python int (exact at any size) or in float64")
        assert f"is {-world * (2**62 + 1)}, outside int64's range" in first["negative"][1]
        assert f"is {world * 2**30}, outside int32's range [-2147483648, 2147483647]" in first["int32"][1]
        assert f"the result for u over {world} ranks is {world * 200}, outside uint8's range" in first["uint8"][1]
        assert f"is {world * 2**62}, outside int64's range" in first["large"][1]
        assert out["fits"] == [2**62 // world * world] * 2
        assert torch.equal(out["after"]["n"], torch.tensor([world * (world - 1) // 2, world]))


# --- gather_for_metrics ----------------------------------------------------------------------------

_LENGTHS = (7, 10, 11)


def _evaluate(model_input):
    """A per-sample 'model' whose output bits do not depend on the batch a sample is in."""
    return torch.sin(model_input * 1.37) + model_input.square() / 7.0


def _dataset(n):
    return TensorDataset(torch.linspace(-3.0, 5.0, n * 3).reshape(n, 3))


def _metrics(rank, world):
    out = {}
    for n, shuffle, drop_last in itertools.product(_LENGTHS, (False, True), (False, True)):
        dataset = _dataset(n)
        sampler = DistributedSampler(dataset, shuffle=shuffle, drop_last=drop_last, seed=5)
        sampler.set_epoch(1)
        rows = [_evaluate(x) for (x,) in DataLoader(dataset, batch_size=2, sampler=sampler)]
        values = torch.cat(rows)
        indices = list(iter(sampler))
        labels = [None if i % 4 == 0 else f"sample-{i}" for i in indices]
        out[(n, shuffle, drop_last)] = (gather_for_metrics(values, sampler), gather_for_metrics(labels, sampler))
    return out


def _single_process(n, covered):
    (features,) = _dataset(n).tensors
    values = torch.cat([_evaluate(x) for (x,) in DataLoader(TensorDataset(features), batch_size=1)])
    return values[covered], [None if i % 4 == 0 else f"sample-{i}" for i in covered]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_gather_for_metrics_equals_a_single_process_evaluation(world):
    results = run_world(_metrics, world, timeout=30)
    for n, shuffle, drop_last in itertools.product(_LENGTHS, (False, True), (False, True)):
        if drop_last:  # the sampler never yields the dataset's tail; which samples depends on the shuffle
            covered = _covered(n, world, shuffle)
            assert len(covered) == world * (n // world)
        else:
            covered = list(range(n))
        expected_values, expected_labels = _single_process(n, covered)
        for rank, out in enumerate(results):
            values, labels = out[(n, shuffle, drop_last)]
            assert values.shape == expected_values.shape, (n, shuffle, drop_last, rank)
            assert torch.equal(values, expected_values), (n, shuffle, drop_last, rank)
            assert labels == expected_labels, (n, shuffle, drop_last, rank)


def _covered(n, world, shuffle):
    covered = set()
    for r in range(world):
        sampler = DistributedSampler(_dataset(n), num_replicas=world, rank=r, shuffle=shuffle, drop_last=True, seed=5)
        sampler.set_epoch(1)
        covered.update(sampler)
    return sorted(covered)


@pytest.mark.timeout(30)
def test_gather_for_metrics_in_a_world_of_one(alone):
    dataset = _dataset(5)
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=3)
    (features,) = dataset.tensors
    order = list(sampler)
    values = _evaluate(features[order])
    assert torch.equal(gather_for_metrics(values, sampler), _evaluate(features))
    assert gather_for_metrics([f"s{i}" for i in order], sampler) == [f"s{i}" for i in range(5)]


def _short_values(rank, world):
    dataset = _dataset(7)
    sampler = DistributedSampler(dataset)
    values = torch.zeros(len(sampler) - (rank == 1), 3)
    try:
        gather_for_metrics(values, sampler)
    except CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


def _drop_last_warning(rank, world):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("ddpdoctor.training.gathering").addHandler(handler)
    sampler = DistributedSampler(_dataset(7), drop_last=True)
    gather_for_metrics(list(sampler), sampler)
    return [r.getMessage() for r in records]


@pytest.mark.timeout(60)
def test_gather_for_metrics_reports_wrong_lengths_on_every_rank_and_warns_about_drop_last():
    assert run_world(_short_values, 2, timeout=30) == [
        "gather_for_metrics(): bad input on rank(s) [1]: rank 1: ValueError: 3 results but the sampler yielded 4 "
        "indices; pass one result per sample in sampler order (DataLoader(drop_last=False), the same sampler "
        "epoch)"] * 2
    assert run_world(_drop_last_warning, 2, timeout=30) == [
        ["gather_for_metrics: the sampler never yielded 1 of 7 samples (drop_last=True?); evaluate with "
         "DistributedSampler(drop_last=False), the padding is removed here"], []]
