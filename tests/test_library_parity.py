"""What the peers' users rely on, as the peers' own tests check it, in gloo worlds of 2, 3 and 4 ranks.

Each test batches its scenarios into one world per size; every scenario names the peer test it
comes from. Expected values are computed in the parent from first principles, never from the
library itself.
"""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

from ddpdoctor.training import (CollectiveMismatchError, all_reduce_params, barrier, broadcast_object,
                               collect_results, gather, gather_all_tensors, gather_for_metrics, gather_object,
                               pad_across_processes, reduce, reduce_dict, seed_everything, worker_init_fn)
from worlds import run_world

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
           torch.int64, torch.uint8, torch.bool, torch.complex64)
_BIG = 2**53 + 1  # not representable in float64: a sum through floats loses it


def _value(rank, n, dtype):
    base = torch.arange(n) + 10 * rank
    if dtype == torch.bool:
        return base % 2 == 0
    if dtype.is_complex:
        return torch.complex(base.float(), -base.float()).to(dtype)
    return base.to(dtype)


def _rows(r):
    return r % 3  # uneven shards, empty on ranks 0 and 3


def _parity(rank, world):
    out = {}
    n = _rows(rank)
    # accelerate test_ops.py test_gather / torchmetrics _test_ddp_gather_uneven_tensors: every dtype, uneven and empty
    out["dtypes"] = {str(d): gather(_value(rank, n, d)) for d in _DTYPES}
    # accelerate test_utils.py nested structures (dict / list / tuple / namedtuple) in gather
    nested = {"logits": torch.full((n, 2), float(rank)), "extra": [torch.arange(n), (torch.ones(n, dtype=torch.bool),)]}
    out["nested"] = gather(nested)
    out["nested_dst"] = gather(nested, dst=world - 1)
    out["ten_dims"] = gather(torch.full([1] * 10, rank))
    # torchmetrics test_distributed.py _test_ddp_gather_uneven_tensors_multidim: list, any dims differ
    out["all_tensors"] = [t.tolist() for t in gather_all_tensors(torch.ones(rank + 1, world - rank) * rank)]
    try:  # ... while gather keeps refusing them: a mismatch there is usually a bug
        gather(torch.ones(rank + 1, world - rank))
        out["gather_multidim"] = "no error"
    except CollectiveMismatchError as exc:
        out["gather_multidim"] = type(exc).__name__
    # mmengine test_dist.py test_gather_object / torch's gather_object(dst=)
    out["objects_dst"] = gather_object({"rank": rank}, dst=0)
    # mmengine test_all_reduce: sum / mean / max / min on int and float data; exact int64 sums
    big = torch.tensor([_BIG + rank, -rank], dtype=torch.int64)
    out["reduce"] = {op: reduce(big, op) for op in ("sum", "mean", "max", "min")}
    out["reduce_float"] = {op: reduce(torch.tensor([rank + 0.5], dtype=torch.bfloat16), op) for op in ("sum", "max")}
    out["reduce_bool"] = reduce(torch.tensor([rank == 0, True]), "sum")
    # detectron2 comm.reduce_dict / mmengine test_all_reduce_dict, nested, with Python numbers
    out["reduce_dict"] = reduce_dict({"loss": torch.tensor(float(rank)), "count": {"n": rank + 1, "big": _BIG}},
                                     average=False)
    out["reduce_dict_mean"] = reduce_dict({"loss": torch.tensor(float(rank)), "n": rank + 1})
    # accelerate test_ops.py test_pad_across_processes (dim, pad_index, pad_first)
    t = torch.full((2, rank + 1), rank + 1)
    out["pad"] = pad_across_processes(t, dim=1, pad_index=-1)
    out["pad_first"] = pad_across_processes({"t": t}, dim=1, pad_first=True)["t"]
    # mmengine test_collect_results: ranks with different counts (sampler order interleaved back)
    out["collect"] = collect_results(list(range(rank, 11, world)), 11)
    # Lightning's all_gather(sync_grads=True) for contrastive losses: gradients reach each rank's rows
    x = torch.full((rank + 1, 2), float(rank + 1), requires_grad=True)
    y = gather(x, sync_grads=True)
    weights = torch.arange(y.shape[0] * 2, dtype=torch.float32).view(-1, 2)
    (y * weights).sum().backward()
    out["grad"] = x.grad.tolist()
    # mmengine test_broadcast_object_list
    out["bcast"] = broadcast_object({"from": rank, "big": "x" * 100_000 * (rank == world - 1)}, src=world - 1)
    out["after"] = gather(torch.tensor([rank])).tolist()
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_gather_reduce_pad_and_objects_as_the_peers_test_them(world):
    results = run_world(_parity, world, timeout=90)
    sizes = [_rows(r) for r in range(world)]
    for rank, out in enumerate(results):
        for d in _DTYPES:
            got = out["dtypes"][str(d)]
            assert got.dtype == d and torch.equal(got, torch.cat([_value(r, sizes[r], d) for r in range(world)])), d
        nested = out["nested"]
        assert torch.equal(nested["logits"], torch.cat([torch.full((sizes[r], 2), float(r)) for r in range(world)]))
        assert torch.equal(nested["extra"][0], torch.cat([torch.arange(s) for s in sizes]))
        assert isinstance(nested["extra"][1], tuple) and nested["extra"][1][0].all()
        assert nested["extra"][1][0].shape == (sum(sizes),)
        assert (out["nested_dst"] is None) == (rank != world - 1)
        assert out["ten_dims"].shape == (world,) + (1,) * 9 and out["ten_dims"].flatten().tolist() == list(range(world))
        assert out["all_tensors"] == [(torch.ones(r + 1, world - r) * r).tolist() for r in range(world)]
        assert out["gather_multidim"] == "CollectiveMismatchError"
        assert out["objects_dst"] == ([{"rank": r} for r in range(world)] if rank == 0 else None)
        red = out["reduce"]
        assert red["sum"].tolist() == [world * _BIG + sum(range(world)), -sum(range(world))]
        assert red["sum"].dtype == torch.int64
        # the integer mean keeps int64 (mmengine's all_reduce), rounding toward zero
        assert red["mean"].dtype == torch.int64
        assert red["mean"].tolist() == [int((world * _BIG + sum(range(world))) // world), -(sum(range(world)) // world)]
        assert red["max"].tolist() == [_BIG + world - 1, 0] and red["min"].tolist() == [_BIG, -(world - 1)]
        assert out["reduce_float"]["sum"].dtype == torch.bfloat16
        assert out["reduce_float"]["sum"].item() == sum(r + 0.5 for r in range(world))
        assert out["reduce_float"]["max"].item() == world - 0.5
        assert out["reduce_bool"].tolist() == [1, world] and out["reduce_bool"].dtype == torch.int64
        rd = out["reduce_dict"]
        assert rd["count"] == {"n": sum(range(1, world + 1)), "big": world * _BIG}
        assert isinstance(rd["count"]["big"], int) and torch.equal(rd["loss"], torch.tensor(float(sum(range(world)))))
        assert out["reduce_dict_mean"]["n"] == (world + 1) / 2
        pad = out["pad"]
        assert pad.shape == (2, world) and pad[0].tolist() == [rank + 1] * (rank + 1) + [-1] * (world - rank - 1)
        assert out["pad_first"][0].tolist() == [0] * (world - rank - 1) + [rank + 1] * (rank + 1)
        assert out["collect"] == list(range(11))
        assert out["grad"] == [[world * w for w in row] for row in _own_weights(rank, world)]
        assert out["bcast"] == {"from": world - 1, "big": "x" * 100_000}
        assert out["after"] == list(range(world))


def _own_weights(rank, world):
    start = sum(r + 1 for r in range(rank))
    return [[float(2 * i), float(2 * i + 1)] for i in range(start, start + rank + 1)]


# --- subgroups ---------------------------------------------------------------------------------------

def _subgroups(rank, world):
    # mmengine test_dist.py and torchmetrics gather_all_tensors(group=): helpers on a dist.new_group subgroup
    members = [0, world - 1]
    group = dist.new_group(members)
    out = {}
    if rank in members:
        out["gather"] = gather(torch.full((rank + 1,), rank), group=group).tolist()
        out["reduce"] = reduce(torch.tensor([rank]), "sum", group=group).tolist()
        out["bcast"] = broadcast_object(f"from {world - 1}" if rank == world - 1 else None, src=world - 1, group=group)
        out["objects"] = gather_object(rank, dst=world - 1, group=group)
        out["all_tensors"] = [t.tolist() for t in gather_all_tensors(torch.ones(rank), group=group)]
        try:
            gather(torch.ones(1), dst=1 if world > 2 else 5, group=group)  # not a member of the group
        except CollectiveMismatchError as exc:
            out["bad_dst"] = str(exc)
        barrier(group=group)
    else:
        try:
            gather(torch.ones(1), group=group)
        except ValueError as exc:
            out["outsider"] = str(exc)
    out["world"] = gather(torch.tensor([rank])).tolist()  # the world's own calls are still in step
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [3, 4])
def test_every_helper_works_on_a_new_group_subgroup(world):
    results = run_world(_subgroups, world, timeout=60)
    last = world - 1
    for rank, out in enumerate(results):
        assert out["world"] == list(range(world))
        if rank not in (0, last):
            assert out["outsider"] == (f"gather(): rank {rank} is not a member of the group (ranks [0, {last}]); "
                                       "call it only on the group's ranks")
            continue
        assert out["gather"] == [0] + [last] * world
        assert out["reduce"] == [last]
        assert out["bcast"] == f"from {last}"
        assert out["objects"] == ([0, last] if rank == last else None)
        assert out["all_tensors"] == [[], [1.0] * last]
        assert out["bad_dst"].startswith(f"gather(): bad input on rank(s) [0, {last}]: rank 0: ValueError: gather(): "
                                         f"dst=1 is not a rank of this group (ranks [0, {last}])")


# --- gather_for_metrics --------------------------------------------------------------------------------

class _EvenBatches(IterableDataset):
    """accelerate's even_batches for an IterableDataset: global batch k goes to rank k % world, and
    the last round is filled up by wrapping around to the start."""

    def __init__(self, n, batch, rank, world):
        self.n, self.batch, self.rank, self.world = n, batch, rank, world

    def __iter__(self):
        batches = [list(range(i, min(i + self.batch, self.n))) for i in range(0, self.n, self.batch)]
        rounds = -(-len(batches) // self.world)
        flat = [i for b in batches for i in b]
        wrapped = iter(flat * 2)
        while len(batches) < rounds * self.world or len(batches[-1]) < self.batch:
            if len(batches[-1]) < self.batch:
                batches[-1] = batches[-1] + [next(wrapped)]
            else:
                batches.append([])
        for b in batches[self.rank::self.world]:
            yield torch.tensor(b)


def _metrics(rank, world):
    out = {}
    # accelerate test_metrics.py test_torch_metrics(num_samples=82 / 99) and the drop_last test (512)
    for n in (82, 99, 512):
        features = torch.arange(n, dtype=torch.float32).view(n, 1) * torch.tensor([[1.0, -1.0]])
        dataset = TensorDataset(features, torch.arange(n) % 3)
        for drop_last in (False, True):
            sampler = DistributedSampler(dataset, shuffle=True, drop_last=drop_last, seed=3)
            preds, refs = [], []
            for x, y in DataLoader(dataset, batch_size=16, sampler=sampler):
                p, r = gather_for_metrics((x, y), sampler, per_batch=True)  # a tuple, as in test_mrpc
                preds.append(p)
                refs.append(r)
            out[(n, drop_last, "batch")] = (torch.cat(preds), torch.cat(refs))
            values = torch.cat([x for x, _ in DataLoader(dataset, batch_size=16, sampler=sampler)])
            out[(n, drop_last, "whole")] = gather_for_metrics({"x": values}, sampler)["x"]
        # accelerate test_gather_for_metrics_with_iterable_dataset: no sampler, the caller knows the total
        rows = [gather_for_metrics(b, total=n) for b in DataLoader(_EvenBatches(n, 16, rank, world), batch_size=None)]
        out[(n, "iterable")] = torch.cat(rows)
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_gather_for_metrics_per_batch_and_for_iterable_datasets(world):
    results = run_world(_metrics, world, timeout=90)
    for out in results:
        for n in (82, 99, 512):
            for drop_last in (False, True):
                preds, refs = out[(n, drop_last, "batch")]
                seen = preds[:, 0].long()
                expected = world * (n // world) if drop_last else n
                assert len(seen) == expected and len(set(seen.tolist())) == expected, (n, drop_last, len(seen))
                assert torch.equal(preds[:, 1], -preds[:, 0]) and torch.equal(refs, seen % 3)
                whole = out[(n, drop_last, "whole")]
                if not drop_last:
                    assert torch.equal(whole[:, 0], torch.arange(n, dtype=torch.float32))
                else:
                    assert whole.shape[0] == expected
            assert out[(n, "iterable")].tolist() == list(range(n))


# --- seeds ---------------------------------------------------------------------------------------------

def _seeds(rank, world):
    try:
        import numpy as np

        seven = np.int64(7)
    except ImportError:  # a CPU torch venv has no numpy: an integral type registered the way numpy's is
        import numbers

        class Int64(int):
            pass

        numbers.Integral.register(Int64)
        seven = Int64(7)
    out = {"picked": seed_everything(), "draw": torch.rand(2).tolist()}
    out["numpy"] = seed_everything(seven)
    out["float"] = seed_everything(45.0)
    try:
        seed_everything(45.5)
    except ValueError as exc:
        out["half"] = str(exc)
    os.environ["PL_GLOBAL_SEED"] = "2020"
    out["env"] = seed_everything()
    seed_everything(3)
    torch.manual_seed(99)  # what the DataLoader gives every worker, the same on every rank
    worker_init_fn(0)
    out["worker0"] = random.random()
    torch.manual_seed(99)
    worker_init_fn(1)
    out["worker1"] = random.random()
    return out


@pytest.mark.timeout(60)
def test_seed_everything_like_lightning():
    # Lightning tests_fabric/utilities/test_seed.py: no seed picks one, PL_GLOBAL_SEED wins,
    # integral values are accepted and others are not; pl_worker_init_function differs per rank/worker.
    results = run_world(_seeds, 3, timeout=45, env={"PL_GLOBAL_SEED": ""})
    assert len({out["picked"] for out in results}) == 1
    assert len({tuple(out["draw"]) for out in results}) == 1
    for out in results:
        assert out["numpy"] == 7 and out["float"] == 45 and out["env"] == 2020
        assert out["half"] == "seed_everything: seed=45.5 is not a whole number; give one in [0, 2**32 - 1]"
        assert out["worker0"] != out["worker1"]
    assert len({out["worker0"] for out in results}) == 3


# --- gradient averaging ----------------------------------------------------------------------------------

def _averaged_grads(rank, world):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    x = torch.linspace(-1, 1, 4 * 4 * world).view(4 * world, 4)
    model(x[rank::world]).pow(2).mean().backward()  # this rank's shard of the batch
    all_reduce_params(model)  # mmengine's all_reduce_params / a hand-written DDP
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.timeout(60)
def test_all_reduce_params_averages_gradients_to_the_full_batch_gradient():
    world = 3
    results = run_world(_averaged_grads, world, timeout=45)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    x = torch.linspace(-1, 1, 4 * 4 * world).view(4 * world, 4)
    model(x).pow(2).mean().backward()
    for grads in results:
        for got, want in zip(grads, [p.grad for p in model.parameters()]):
            assert torch.allclose(got, want, atol=1e-6)
