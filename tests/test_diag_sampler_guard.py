"""guard_sampler on real gloo worlds: the set_epoch pitfall and ranks that disagree."""

from __future__ import annotations

import pickle
import warnings

import pytest
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler

from ddpdoctor.diagnostics.sampler_guard import SamplerEpochWarning, SamplerMismatchWarning, guard_sampler
from worlds import run_world


def _passes(sampler, epochs: int, set_epoch: bool) -> list:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        orders = []
        for epoch in range(epochs):
            if set_epoch:
                sampler.set_epoch(epoch)
            orders.append(list(sampler))
    return [(w.category.__name__, str(w.message)) for w in caught], orders


def _guard_world(rank: int, world: int) -> dict:
    out: dict = {}
    n = 10 * world + 1
    plain = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=3)
    guarded = guard_sampler(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=3))
    out["identity"] = guard_sampler(guarded) is guarded and isinstance(guarded, DistributedSampler)
    out["forgot"] = _passes(guarded, 3, set_epoch=False)[0]
    out["same_order"] = list(guarded) == list(plain)

    fine = guard_sampler(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True))
    out["with_set_epoch"] = _passes(fine, 3, set_epoch=True)[0]
    ordered = guard_sampler(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False))
    out["no_shuffle"] = _passes(ordered, 2, set_epoch=False)[0]
    everyone = guard_sampler(DistributedSampler(range(n), num_replicas=world, rank=rank), warn_rank=None)
    out["every_rank"] = [c for c, _ in _passes(everyone, 2, set_epoch=False)[0]]

    # Through a DataLoader, as training code uses it.
    loader_sampler = guard_sampler(DistributedSampler(range(n), num_replicas=world, rank=rank))
    loader = DataLoader(range(n), batch_size=4, sampler=loader_sampler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            for _batch in loader:
                pass
    out["loader"] = [w.category.__name__ for w in caught]

    # Ranks that disagree: seed on the last rank, dataset length on rank 0, epoch on rank 1.
    seeds = guard_sampler(DistributedSampler(range(n), num_replicas=world, rank=rank,
                                             seed=7 if rank == world - 1 else 0))
    out["seed"] = _passes(seeds, 1, set_epoch=True)[0]
    lengths = guard_sampler(DistributedSampler(range(n + (rank == 0)), num_replicas=world, rank=rank))
    out["length"] = _passes(lengths, 1, set_epoch=True)[0]
    epochs = guard_sampler(DistributedSampler(range(n), num_replicas=world, rank=rank))
    epochs.set_epoch(5 if rank == 1 else 4)
    out["epoch"] = _passes(epochs, 1, set_epoch=False)[0]
    twins = guard_sampler(DistributedSampler(range(n), num_replicas=world, rank=min(rank, 1)))
    out["twins"] = _passes(twins, 1, set_epoch=True)[0]
    return out


@pytest.mark.timeout(60)
def test_guard_sampler_warns_once_on_rank_zero_and_notices_disagreeing_ranks():
    results = run_world(_guard_world, 3, timeout=50)
    for rank, out in enumerate(results):
        assert out["identity"] and out["same_order"]
        if rank == 0:
            assert [c for c, _ in out["forgot"]] == ["SamplerEpochWarning"]  # once, not twice
            assert "set_epoch(epoch)" in out["forgot"][0][1] and "epoch 0" in out["forgot"][0][1]
            assert out["loader"] == ["SamplerEpochWarning"]
            (cat, seed_msg), = out["seed"]
            assert cat == "SamplerMismatchWarning" and "seed rank 0: 0, rank 1: 0, rank 2: 7" in seed_msg
            (cat, length_msg), = out["length"]
            assert "dataset length rank 0: 32, rank 1: 31, rank 2: 31" in length_msg
            (cat, epoch_msg), = out["epoch"]
            assert "epoch rank 0: 4, rank 1: 5, rank 2: 4" in epoch_msg
            (cat, twin_msg), = out["twins"]
            assert "sampler rank process 0: 0, process 1: 1, process 2: 1" in twin_msg
        else:
            for key in ("forgot", "loader", "seed", "length", "epoch", "twins"):
                assert out[key] == [], (rank, key)
        assert out["with_set_epoch"] == [] and out["no_shuffle"] == []
        assert out["every_rank"] == ["SamplerEpochWarning"]


@pytest.mark.timeout(30)
def test_without_a_group_it_still_catches_the_missing_set_epoch():
    def fn(rank, world):
        sampler = guard_sampler(DistributedSampler(range(9), num_replicas=2, rank=rank))
        return [c for c, _ in _passes(sampler, 2, set_epoch=False)[0]]

    assert run_world(fn, 2, backend=None, timeout=25) == [["SamplerEpochWarning"], []]


def test_guard_sampler_rejects_other_samplers_and_pickles_as_plain():
    with pytest.raises(TypeError, match="RandomSampler.*DistributedSampler"):
        guard_sampler(RandomSampler(range(3)))
    guarded = guard_sampler(DistributedSampler(range(9), num_replicas=2, rank=1, seed=4))
    clone = pickle.loads(pickle.dumps(guarded))
    assert type(clone) is DistributedSampler and clone.seed == 4 and list(clone) == list(guarded)
    assert issubclass(SamplerEpochWarning, UserWarning) and issubclass(SamplerMismatchWarning, UserWarning)


def _epochs(sampler, epochs: int, reads: int, set_epoch=lambda epoch: epoch) -> list:
    """``epochs`` epochs of ``reads`` passes each (a training pass, then accuracy passes)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(epochs):
            if set_epoch is not None:
                sampler.set_epoch(set_epoch(epoch))
            for _ in range(reads):
                list(sampler)
    return [(w.category.__name__, str(w.message)) for w in caught]


def _reads_world(rank: int, world: int) -> dict:
    out: dict = {}

    def guarded(**kwargs):
        return guard_sampler(DistributedSampler(range(20), num_replicas=world, rank=rank), warn_rank=None,
                             **kwargs)

    out["twice"] = _epochs(guarded(), 3, 2)
    out["twice_loader"] = []
    loader_sampler = guarded()
    loader = DataLoader(range(20), batch_size=4, sampler=loader_sampler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(3):
            loader_sampler.set_epoch(epoch)
            for _batch in loader:  # training pass
                pass
            sum(len(b) for b in loader)  # accuracy pass over the same loader
    out["twice_loader"] = [w.category.__name__ for w in caught]
    out["stuck_once"] = _epochs(guarded(), 3, 2, set_epoch=lambda epoch: 0)
    out["thrice"] = _epochs(guarded(passes_per_epoch=3), 3, 3)
    out["thrice_stuck"] = _epochs(guarded(passes_per_epoch=3), 2, 3, set_epoch=lambda epoch: 7)
    out["thrice_learned"] = _epochs(guarded(), 3, 3)  # the first epoch warns: no epoch to learn from
    return out


@pytest.mark.timeout(60)
def test_several_reads_per_epoch_are_no_false_alarm():
    for out in run_world(_reads_world, 2, timeout=50):
        assert out["twice"] == [] and out["twice_loader"] == []
        (cat, text), = out["stuck_once"]
        assert cat == "SamplerEpochWarning"
        assert "pass 3 with epoch 0, the same epoch as the 2 previous passes (set_epoch was last called with 0)" in text
        assert out["thrice"] == []
        (cat, text), = out["thrice_stuck"]
        assert "pass 4 with epoch 7" in text
        assert [c for c, _ in out["thrice_learned"]] == ["SamplerEpochWarning"]


def _rank_zero_only_world(rank: int, world: int) -> dict:
    import time

    import torch.distributed as dist

    sampler = guard_sampler(DistributedSampler(range(30), num_replicas=world, rank=rank), rank_wait=0.5)
    start = time.monotonic()
    caught_all = []
    if rank == 0:  # e.g. an evaluation loop that only rank 0 runs
        for epoch in range(4):
            sampler.set_epoch(epoch)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                list(sampler)
            caught_all += [w.category.__name__ for w in caught]
    elapsed = time.monotonic() - start
    dist.barrier()  # what the ranks do next; a collective in the guard would pair with this one
    # then every rank iterates, rank 2 late and with another seed: still compared, no collective
    late = guard_sampler(DistributedSampler(range(30), num_replicas=world, rank=rank,
                                            seed=5 if rank == 2 else 0), rank_wait=5.0)
    if rank == 2:
        time.sleep(0.3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        late.set_epoch(0)
        list(late)
    return {"elapsed": elapsed, "warnings": caught_all, "late": [str(w.message) for w in caught]}


@pytest.mark.timeout(60)
def test_a_loop_on_rank_zero_only_never_waits_for_the_others():
    results = run_world(_rank_zero_only_world, 3, timeout=50)
    zero = results[0]
    assert zero["warnings"] == []
    assert zero["elapsed"] < 0.5 + 3.0  # one wait of rank_wait for the silent ranks, not one per pass
    (text,) = zero["late"]
    assert "seed rank 0: 0, rank 1: 0, rank 2: 5" in text
    assert results[1]["late"] == [] and results[2]["late"] == []


def _where_world(rank: int, world: int) -> list:
    import inspect

    sampler = guard_sampler(DistributedSampler(range(9), num_replicas=world, rank=rank))
    loader = DataLoader(range(9), batch_size=2, sampler=sampler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            line = inspect.currentframe().f_lineno + 1
            for _batch in loader:
                pass
    return [(w.filename, w.lineno, line) for w in caught]


@pytest.mark.timeout(30)
def test_the_warning_names_the_users_line():
    (filename, lineno, line), = run_world(_where_world, 2, timeout=25)[0]
    assert filename == __file__ and lineno == line


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match=r"passes_per_epoch.*0"):
        guard_sampler(DistributedSampler(range(4), num_replicas=2, rank=0), passes_per_epoch=0)
    with pytest.raises(ValueError, match=r"rank_wait.*-1"):
        guard_sampler(DistributedSampler(range(4), num_replicas=2, rank=0), rank_wait=-1)
