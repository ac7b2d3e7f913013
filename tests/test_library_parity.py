"""What the peers' users rely on, as the peers' own tests check it, in gloo worlds of 2, 3 and 4 ranks.

Each test batches its scenarios into one world per size; every scenario names the peer test it
comes from. Expected values are computed in the parent from first principles, never from the
library itself.
"""

from __future__ import annotations

import math
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


# --- ddpdoctor.compat: each peer's names with the peer's semantics (issue 27) ---------------------------
# One gloo world per size runs every case; each case names the peer test or source it follows. Expected
# values are written out here from the peers' documented behaviour, never computed by the library.

def _outcome(fn):
    """What a call did: ("ok", value) or ("raised", class name, is TypeError, is CollectiveMismatchError, text)."""
    try:
        return ("ok", fn())
    except Exception as exc:  # noqa: BLE001 - the class is what the case checks
        return ("raised", type(exc).__name__, isinstance(exc, TypeError), isinstance(exc, CollectiveMismatchError),
                str(exc))


def _warned(fn):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn()
    return value, [(w.category.__name__, str(w.message)) for w in caught]


def _compat_lightning(rank, world, out):
    from ddpdoctor.compat import lightning as L

    # tests_fabric/test_fabric.py test_all_gather / strategies: a tensor is stacked [world, *shape]
    out["L.stack"] = L.all_gather(torch.full((2, 3), float(rank)))
    # apply_func.convert_to_tensors: bool -> uint8, int -> int32, float -> float32; a str stays as it is
    out["L.coll"] = L.all_gather({"t": torch.tensor([rank]), "s": "name", "b": True, "i": rank, "f": rank + 0.5})
    # fabric hangs on shapes that differ; every rank raises here
    out["L.uneven"] = _outcome(lambda: L.all_gather(torch.zeros(rank + 1)))
    # _sync_ddp: in place, default "mean"; an integer mean is copy_(sum / world) (truncated)
    t = torch.tensor([float(rank), 1.0])
    out["L.mean_same"] = L.all_reduce(t) is t
    out["L.mean"] = t
    out["L.int_mean"] = L.all_reduce(torch.tensor([rank, 7], dtype=torch.int64))
    out["L.coll_sum"] = L.all_reduce({"i": rank + 1, "s": "x", "b": rank == 0}, reduce_op="sum")
    out["L.max"] = L.all_reduce(torch.tensor([rank]), reduce_op=dist.ReduceOp.MAX)
    out["L.product"] = L.all_reduce(torch.tensor([rank + 1, 2]), reduce_op="PRODUCT")
    out["L.bad_op"] = _outcome(lambda: L.all_reduce(torch.zeros(1), reduce_op="median"))
    out["L.bcast"] = L.broadcast({"from": rank}, src=world - 1)
    L.barrier("after-broadcast")
    # tests_fabric/utilities/test_seed.py
    os.environ.pop("PL_GLOBAL_SEED", None)
    out["L.seed_none"] = _warned(lambda: L.seed_everything())
    out["L.seed_none_env"] = (os.environ["PL_GLOBAL_SEED"], os.environ["PL_SEED_WORKERS"])
    out["L.seed_workers"] = (L.seed_everything(7, True), os.environ["PL_SEED_WORKERS"])
    out["L.seed_env"] = _warned(lambda: L.seed_everything(verbose=False))
    L.seed_everything(42)
    first = torch.rand(3)
    L.reset_seed()
    out["L.reset"] = torch.equal(first, torch.rand(3))
    os.environ["PL_GLOBAL_SEED"] = "abc"
    out["L.seed_bad_env"] = _outcome(lambda: L.seed_everything())
    out["L.seed_range"] = _outcome(lambda: L.seed_everything(2**32))
    os.environ.pop("PL_GLOBAL_SEED")
    # tests_fabric/utilities/test_rank_zero.py: rank_zero_only(fn, default)
    ran = []
    fn = L.rank_zero_only(lambda: ran.append(rank) or "ran", default="not here")
    out["L.rzo"] = (fn(), ran)
    L.rank_zero_only.rank = 1  # what a Fabric strategy sets on a non-zero rank
    out["L.rzo_attr"] = fn()
    del L.rank_zero_only.rank


class _Counter:
    """torch's test_join.py AllReducer: one all_reduce per step; a joined rank contributes zeros."""

    def __new__(cls):
        from torch.distributed.algorithms.join import Join, Joinable, JoinHook

        class Counter(Joinable):
            def __init__(self):
                super().__init__()
                self.seen = []

            def step(self):
                Join.notify_join_context(self)
                t = torch.ones(1)
                dist.all_reduce(t)
                self.seen.append(int(t.item()))

            def join_hook(self, **kwargs):
                class Shadow(JoinHook):
                    def main_hook(self):
                        dist.all_reduce(torch.zeros(1))
                return Shadow()

            @property
            def join_device(self):
                return torch.device("cpu")

            @property
            def join_process_group(self):
                return dist.group.WORLD

        return Counter()


def _compat_accelerate(rank, world, out):
    from ddpdoctor.compat import accelerate as A

    # test_script.py test_gather_object: lists are concatenated
    out["A.objects"] = A.gather_object([rank, rank])
    # test_ops.py test_op_checker (debug mode): broadcast with shapes that differ
    out["A.bcast_bad"] = _outcome(lambda: A.broadcast(torch.zeros(rank + 1)))
    t = torch.full((2,), float(rank))
    out["A.bcast_same"] = A.broadcast({"t": t}, from_process=world - 1)["t"] is t
    out["A.bcast"] = t
    # test_ops.py: a str leaf in gather / reduce raises TypeError (here on every rank)
    out["A.gather_str"] = _outcome(lambda: A.gather({"a": torch.ones(1), "b": "x" if rank == 1 else torch.ones(1)}))
    out["A.reduce_str"] = _outcome(lambda: A.reduce({"a": torch.ones(1), "b": "x"}))
    # test_ops.py test_reduce_sum / test_reduce_mean: a new tensor, the input untouched
    x = torch.tensor([float(rank), 1.0])
    out["A.mean"] = (A.reduce(x), x.tolist())
    out["A.sum"] = A.reduce({"x": x}, reduction="sum")["x"]
    out["A.none"] = A.reduce(x, reduction="none")
    out["A.int_mean"] = _outcome(lambda: A.reduce(torch.tensor([rank])))
    # test_ops.py test_pad_across_processes / nested tensors warn and stay
    import warnings

    with warnings.catch_warnings():  # the strided layout's "prototype" notice; jagged costs seconds of imports
        warnings.simplefilter("ignore", UserWarning)
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    padded, warned = _warned(lambda: A.pad_across_processes({"n": nested, "t": torch.full((rank + 1,), 5)}))
    out["A.pad"] = (padded["n"] is nested, padded["t"], warned)
    # test_state.py / test_split_between_processes*: lists, tensors, nested dicts, apply_padding
    with A.split_between_processes(list(range(5))) as part:
        out["A.split_list"] = part
    with A.split_between_processes(list(range(5)), apply_padding=True) as part:
        out["A.split_list_pad"] = part
    with A.split_between_processes(torch.arange(5), apply_padding=True) as part:
        out["A.split_tensor_pad"] = part
    with A.split_between_processes({"a": list(range(5)), "b": torch.arange(5) * 10}) as part:
        out["A.split_dict"] = (part["a"], part["b"])
    # test_state.py on_main_process / on_local_main_process / on_last_process / on_process
    ran = []
    A.on_main_process(lambda: ran.append("main"))()
    A.on_local_main_process(lambda: ran.append("local"))()
    A.on_last_process(lambda: ran.append("last"))()
    A.on_process(process_index=1)(lambda: ran.append("one"))()
    out["A.on"] = ran
    # test_utils.py synchronize_rng_states(["torch", "generator"])
    torch.manual_seed(100 + rank)
    g = torch.Generator().manual_seed(200 + rank)
    A.synchronize_rng_states(["torch", "generator"], generator=g)
    out["A.rng"] = (torch.rand(2), torch.rand(2, generator=g))
    # test_script.py test_trigger: one rank sets it, every rank sees it, once
    if rank == world - 1:
        A.set_trigger()
    out["A.trigger"] = (A.check_trigger(), A.check_trigger())
    # test_distributed_data_loop.py test_join_..: ranks with fewer batches shadow the others' collectives
    # (a Joinable as in torch's own test_join.py; DDP is one, and its import alone costs seconds per rank)
    counter = _Counter()
    with A.join_uneven_inputs([counter]):
        for _ in range(rank + 1):
            counter.step()
    out["A.join"] = counter.seen


def _compat_mmengine(rank, world, out):
    from ddpdoctor.compat import mmengine as M

    out["M.local_before"] = _outcome(M.get_local_size)
    # tests/test_dist/test_dist.py test_all_reduce: in place, returns None
    data = torch.tensor([rank + 1, 2], dtype=torch.int64)
    out["M.sum"] = (M.all_reduce(data), data)
    data = torch.tensor([float(rank), 3.0])
    M.all_reduce(data, "mean")
    out["M.mean"] = data
    for op in ("max", "min", "product", "bor"):
        data = torch.tensor([rank + 1, 4])
        M.all_reduce(data, op)
        out[f"M.{op}"] = data
    data = torch.tensor([rank + 1])
    out["M.int_mean"] = (_outcome(lambda: M.all_reduce(data, "mean")), data)  # true quotient copied back
    # test_broadcast / test_broadcast_object_list: in place
    data = torch.full((2,), rank)
    out["M.bcast"] = (M.broadcast(data, src=world - 1), data)
    out["M.bcast_bad"] = _outcome(lambda: M.broadcast(torch.zeros(rank + 1)))
    objs = [rank, f"from {rank}"]
    out["M.objs"] = (M.broadcast_object_list(objs), objs)
    # test_all_reduce_dict: the dict's values replaced
    d = {"b": torch.tensor([rank]), "a": torch.tensor([[1.0, 2.0]])}
    out["M.dict"] = (M.all_reduce_dict(d), d)
    # test_gather: the list on dst, [] elsewhere
    out["M.gather"] = M.gather(torch.tensor([rank, -rank]), dst=0)
    out["M.all_gather"] = M.all_gather(torch.tensor([rank]))
    # test_collect_results: rank 0 only; results that are None kept; tmpdir never written
    never = os.path.join(os.environ["PARITY_TMP"], "never")
    mine = [None if i == 4 else i for i in range(rank, 8, world)]
    out["M.collect"] = M.collect_results(mine, 8, device="cpu", tmpdir=never)
    out["M.collect_gpu"] = M.collect_results(mine, 8, device="gpu")
    out["M.never"] = os.path.exists(never)
    out["M.collect_bad"] = _outcome(lambda: M.collect_results(mine, 8, device="tpu"))
    out["M.collect_gpu_tmp"] = _outcome(lambda: M.collect_results(mine, 8, device="gpu", tmpdir=never))
    # test_dist.py init_local_group: two "nodes" of size 2 (world 3: the second has one rank)
    M.init_local_group(rank // 2, 2)
    out["M.local"] = (M.get_local_size(), M.get_local_rank())


def _compat_detectron2(rank, world, out):
    from ddpdoctor.compat import detectron2 as D
    from ddpdoctor.compat import torchmetrics as T

    # detectron2/utils/comm.py docstrings
    out["D.all_gather"] = D.all_gather({"r": rank})
    out["D.gather"] = D.gather(rank * 10, dst=world - 1)
    out["D.reduce_dict"] = D.reduce_dict({"b": torch.tensor(float(rank)), "a": torch.tensor(1.0)})
    out["D.seed"] = D.shared_random_seed()
    D.synchronize()
    out["D.main"] = D.is_main_process()
    # torchmetrics tests/unittests/bases/test_ddp.py _test_ddp_gather_all_tensors_uneven, any dims
    out["T.uneven"] = [tuple(t.shape) for t in T.gather_all_tensors(torch.ones(rank + 1, world - rank))]
    # where the peers hang or pair the wrong calls: every rank raises, and the next call is still aligned
    out["D.dst_differs"] = _outcome(lambda: D.gather(rank, dst=rank % 2))
    out["T.dtype_differs"] = _outcome(lambda: T.gather_all_tensors(torch.ones(2, dtype=torch.float64 if rank else
                                                                           torch.float32)))
    out["after"] = D.all_gather(rank)


def _compat(rank, world):
    out = {}
    for part in (_compat_lightning, _compat_accelerate, _compat_mmengine, _compat_detectron2):
        part(rank, world, out)
    return out


def _mismatch(outcome, builtin=None):
    """Raised on this rank with ddpdoctor's mismatch error (and the peer's built-in class when given)."""
    return outcome[0] == "raised" and outcome[3] and (builtin is None or outcome[2] == (builtin is TypeError))


_SPLIT = {  # accelerate's split_between_processes of range(5): the first len % world ranks get one more
    2: [[0, 1, 2], [3, 4]],
    3: [[0, 1], [2, 3], [4]],
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_compat_modules_behave_as_the_peers_tests_assert(world, tmp_path):
    results = run_world(_compat, world, timeout=90, env={"PARITY_TMP": str(tmp_path)})
    torch.manual_seed(100)
    rng_torch = torch.rand(2)
    rng_gen = torch.rand(2, generator=torch.Generator().manual_seed(200))
    for rank, out in enumerate(results):
        # lightning
        assert out["L.stack"].shape == (world, 2, 3) and out["L.stack"][:, 0, 0].tolist() == list(range(world))
        coll = out["L.coll"]
        assert coll["s"] == "name" and coll["t"].tolist() == [[r] for r in range(world)]
        assert coll["b"].dtype == torch.uint8 and coll["b"].tolist() == [1] * world
        assert coll["i"].dtype == torch.int32 and coll["i"].tolist() == list(range(world))
        assert coll["f"].dtype == torch.float32 and coll["f"].tolist() == [r + 0.5 for r in range(world)]
        assert _mismatch(out["L.uneven"])
        assert out["L.mean_same"] and out["L.mean"].tolist() == [sum(range(world)) / world, 1.0]
        assert out["L.int_mean"].dtype == torch.int64 and out["L.int_mean"].tolist() == [int(sum(range(world)) / world), 7]
        cs = out["L.coll_sum"]
        assert cs["i"].item() == sum(range(1, world + 1)) and cs["s"] == "x" and cs["b"].item() == 1
        assert out["L.max"].tolist() == [world - 1]
        assert out["L.product"].tolist() == [math.factorial(world), 2 ** world]
        assert out["L.bad_op"][:2] == ("raised", "AttributeError")
        assert out["L.bcast"] == {"from": world - 1}
        value, warned = out["L.seed_none"]
        assert value == 0 and warned == ([("UserWarning", "No seed found, seed set to 0")] if rank == 0 else [])
        assert out["L.seed_none_env"] == ("0", "0")
        assert out["L.seed_workers"] == (7, "1")
        assert out["L.seed_env"] == (7, [])
        assert out["L.reset"] is True
        assert out["L.seed_bad_env"][1:] == ("ValueError", False, False, "Invalid seed specified via PL_GLOBAL_SEED: 'abc'")
        assert out["L.seed_range"][4] == "4294967296 is not in bounds, numpy accepts from 0 to 4294967295"
        assert out["L.rzo"] == (("ran", [0]) if rank == 0 else ("not here", []))
        assert out["L.rzo_attr"] == "not here"
        # accelerate
        assert out["A.objects"] == [r for r in range(world) for _ in range(2)]
        assert out["A.bcast_bad"][1] == "DistributedOperationException" and _mismatch(out["A.bcast_bad"])
        assert "Cannot apply desired operation due to shape mismatches" in out["A.bcast_bad"][4]
        assert out["A.bcast_same"] and out["A.bcast"].tolist() == [float(world - 1)] * 2
        assert _mismatch(out["A.gather_str"], TypeError) and _mismatch(out["A.reduce_str"], TypeError)
        assert "Unsupported types (<class 'str'>)" in out["A.reduce_str"][4]
        mean, untouched = out["A.mean"]
        assert mean.tolist() == [sum(range(world)) / world, 1.0] and untouched == [float(rank), 1.0]
        assert out["A.sum"].tolist() == [float(sum(range(world))), float(world)]
        assert out["A.none"].tolist() == [float(sum(range(world))), float(world)]
        assert out["A.int_mean"][:2] == ("raised", "RuntimeError")
        same, padded, warned = out["A.pad"]
        assert same and padded.tolist() == [5] * (rank + 1) + [0] * (world - rank - 1)
        assert warned == [("CannotPadNestedTensorWarning",
                           "Cannot pad nested tensors without more information. Leaving unprocessed.")]
        share = _SPLIT[world][rank]
        longest = len(_SPLIT[world][0])
        assert out["A.split_list"] == share
        assert out["A.split_list_pad"] == share + [4] * (longest - len(share))
        assert out["A.split_tensor_pad"].tolist() == share + [4] * (longest - len(share))
        assert out["A.split_dict"][0] == share and out["A.split_dict"][1].tolist() == [10 * i for i in share]
        assert out["A.on"] == ["main", "local"] * (rank == 0) + ["last"] * (rank == world - 1) + ["one"] * (rank == 1)
        assert torch.equal(out["A.rng"][0], rng_torch) and torch.equal(out["A.rng"][1], rng_gen)
        assert out["A.trigger"] == (True, False)
        # step k (0-based) is taken by the ranks with more than k batches: ranks k..world-1
        assert out["A.join"] == [world - k for k in range(rank + 1)]
        # mmengine
        assert out["M.local_before"][1] == "RuntimeError"
        assert out["M.sum"][0] is None and out["M.sum"][1].tolist() == [sum(range(1, world + 1)), 2 * world]
        assert out["M.mean"].tolist() == [sum(range(world)) / world, 3.0]
        assert out["M.max"].tolist() == [world, 4] and out["M.min"].tolist() == [1, 4]
        bor = 0
        for r in range(world):
            bor |= r + 1
        assert out["M.product"].tolist() == [math.factorial(world), 4 ** world] and out["M.bor"].tolist() == [bor, 4]
        int_mean, data = out["M.int_mean"]
        assert int_mean == ("ok", None) and data.tolist() == [int(sum(range(1, world + 1)) / world)]
        assert out["M.bcast"][0] is None and out["M.bcast"][1].tolist() == [world - 1] * 2
        assert _mismatch(out["M.bcast_bad"])
        assert out["M.objs"] == (None, [0, "from 0"])
        assert out["M.dict"][0] is None and out["M.dict"][1]["b"].tolist() == [sum(range(world))]
        assert out["M.dict"][1]["b"].dtype == torch.float32  # flattened with the float value: promoted, as mmengine
        assert out["M.dict"][1]["a"].tolist() == [[float(world), 2.0 * world]]
        assert [t.tolist() for t in out["M.gather"]] == ([[r, -r] for r in range(world)] if rank == 0 else [])
        assert [t.tolist() for t in out["M.all_gather"]] == [[r] for r in range(world)]
        every = [None if i == 4 else i for i in range(8)]
        assert out["M.collect"] == (every if rank == 0 else None) and out["M.collect_gpu"] == out["M.collect"]
        assert out["M.never"] is False
        assert out["M.collect_bad"][1:] == ("NotImplementedError", False, False,
                                            "device must be 'cpu' , 'gpu' or 'npu', but got tpu")
        assert out["M.collect_gpu_tmp"][1] == "AssertionError"
        node_size = min(2, world - 2 * (rank // 2))
        assert out["M.local"] == (node_size, rank % 2)
        # detectron2 and torchmetrics
        assert out["D.all_gather"] == [{"r": r} for r in range(world)]
        assert out["D.gather"] == ([10 * r for r in range(world)] if rank == world - 1 else [])
        rd = out["D.reduce_dict"]
        assert list(rd) == ["a", "b"] and rd["a"].item() == 1.0 and rd["b"].item() == sum(range(world)) / world
        assert out["D.main"] is (rank == 0)
        assert out["T.uneven"] == [(r + 1, world - r) for r in range(world)]
        assert _mismatch(out["D.dst_differs"]) and _mismatch(out["T.dtype_differs"])
        assert out["after"] == list(range(world))
    assert len({out["D.seed"] for out in results}) == 1


@pytest.mark.timeout(30)
def test_compat_modules_in_a_world_of_one_and_launched_without_a_process_group(clean_launcher_env):
    from ddpdoctor.compat import accelerate as A
    from ddpdoctor.compat import detectron2 as D
    from ddpdoctor.compat import lightning as L
    from ddpdoctor.compat import mmengine as M
    from ddpdoctor.training import NotInitializedError

    # a world of one: the peers' single-process answers
    assert L.all_gather(torch.ones(2, 3)).shape == (2, 3)  # Fabric's single-device strategy does not stack
    three = L.all_gather(3)
    assert three.dtype == torch.int32 and three.item() == 3
    assert L.rank_zero_only.rank == 0 and L.rank_zero_only(lambda: "ran")() == "ran"
    assert A.gather_object("not a list") == "not a list"
    with pytest.raises(TypeError, match=r"Unsupported types \(<class 'str'>\) passed to `_reduce_across_processes`"):
        A.reduce({"a": torch.ones(1), "b": "x"})
    x = torch.ones(2)
    assert A.reduce(x) is not x and torch.equal(A.reduce(x), x)
    assert M.collect_results([1, 2, 3], 2) == [1, 2] and M.gather(x) == [x] and M.all_reduce(x) is None
    d = {"a": torch.tensor(1.0)}
    assert D.reduce_dict(d) is d and D.all_gather(5) == [5] and D.gather(5, dst=0) == [5]
    # launched (RANK/WORLD_SIZE) but no process group: the peer would have made one; never this rank's data alone
    clean_launcher_env.setenv("RANK", "0")
    clean_launcher_env.setenv("WORLD_SIZE", "2")
    clean_launcher_env.setenv("LOCAL_RANK", "0")
    for call in (lambda: L.all_gather(x), lambda: L.all_reduce(x), lambda: A.gather(x), lambda: A.reduce(x),
                 lambda: M.all_reduce(x), lambda: M.collect_results([1], 1), lambda: D.all_gather(1),
                 lambda: D.reduce_dict(d)):
        with pytest.raises(NotInitializedError, match="no process group is initialized"):
            call()
