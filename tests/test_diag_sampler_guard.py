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
