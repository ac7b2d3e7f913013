"""assert_in_sync and the tensor fingerprint, on real gloo worlds of 2 and 3 ranks."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch._dynamo  # noqa: F401 - DDP imports it on first use; once here, not in every forked rank

from ddpdoctor.diagnostics.desync import _ROW, DesyncError, assert_in_sync, fingerprint
from worlds import run_world


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4))


def _desync(module: torch.nn.Module, **kwargs) -> DesyncError | None:
    try:
        assert_in_sync(module, **kwargs)
    except DesyncError as exc:
        return exc
    return None


def _ranks_world(rank: int, world: int) -> dict:
    out: dict = {}
    model = _model()
    out["clean"] = _desync(model, grads=True) is None

    # One flipped bit at a random position of a large tensor, on rank 2 only.
    gen = torch.Generator().manual_seed(1234)
    big = torch.nn.Module()
    big.weight = torch.nn.Parameter(torch.randn(1_000_003, generator=gen))
    pos = int(torch.randint(0, big.weight.numel(), (1,), generator=gen))
    bit = int(torch.randint(0, 32, (1,), generator=gen))
    original = float(big.weight.detach()[pos])
    if rank == 2:
        with torch.no_grad():
            words = big.weight.data.view(torch.int32)
            words[pos] = words[pos] ^ (1 << bit) if bit < 31 else words[pos] ^ -(1 << 31)
    flipped = float(big.weight.detach()[pos]) if rank == 2 else None
    exc = _desync(big)
    out["flip"] = (exc is not None, [m.name for m in exc.mismatches] if exc else [],
                   [m.versions for m in exc.mismatches] if exc else [],
                   exc.mismatches[0].max_abs_diff if exc else None, original, flipped, bit, str(exc))

    # A permutation of the elements: same sum, same multiset.
    perm = _model()
    if rank == 1:
        with torch.no_grad():
            w = perm[2].weight
            w.copy_(w.reshape(-1)[torch.randperm(w.numel(), generator=torch.Generator().manual_seed(5))]
                    .reshape(w.shape))
    exc = _desync(perm)
    out["perm"] = ([m.name for m in exc.mismatches] if exc else [],
                   [m.versions for m in exc.mismatches] if exc else [])
    out["perm_sums_equal"] = float(perm[2].weight.detach().sum())

    # Buffers: compared by default, ignored with buffers=False.
    buf = _model()
    if rank == 0:
        buf[1].running_mean += 0.5
    exc = _desync(buf)
    out["buffer"] = ([m.name for m in exc.mismatches] if exc else [],
                     exc.mismatches[0].max_abs_diff if exc else None)
    out["buffer_off"] = _desync(buf, buffers=False) is None

    # Gradients: compared only when asked; None on one rank is a layout mismatch.
    g = _model()
    g(torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))).sum().backward()
    out["grads_ignored"] = _desync(g, buffers=False) is None
    exc = _desync(g, grads=True, buffers=False)
    out["grads"] = sorted(m.name for m in exc.mismatches) if exc else []
    g2 = _model()
    if rank == 1:
        g2[0].weight.grad = torch.zeros_like(g2[0].weight)
    exc = _desync(g2, grads=True)
    out["grad_none"] = [(m.name, m.reason) for m in exc.mismatches] if exc else []

    # atol: a 1e-6 difference passes with atol=1e-5, fails with atol=0.
    a = _model()
    if rank == 2:
        with torch.no_grad():
            a[0].bias[3] += 1e-6
    out["atol_pass"] = _desync(a, atol=1e-5) is None
    out["atol_fail"] = _desync(a) is not None

    # DDP-wrapped: inner names, DDP's broadcast removes a rank-dependent init.
    torch.manual_seed(rank)
    raw = torch.nn.Linear(4, 4)
    exc = _desync(torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4)))
    out["ddp_clean"] = exc is None
    exc = _desync(raw)
    out["raw_names"] = sorted(m.name for m in exc.mismatches) if exc else []

    # Different module structure: an error on every rank, not a hang or an abort.
    s = torch.nn.Linear(2, 2, bias=(rank != 1))
    exc = _desync(s)
    out["structure"] = (exc is not None, exc.mismatches[0].versions if exc else None)

    # Same count, different shape: a layout mismatch, no element-wise difference attempted.
    shaped = torch.nn.Linear(2, 3 if rank == 0 else 2)
    exc = _desync(shaped)
    out["shape"] = [(m.name, m.reason) for m in exc.mismatches] if exc else []
    out["pickle"] = pickle.loads(pickle.dumps(exc)).reference if exc else None
    return out


@pytest.mark.timeout(60)
def test_assert_in_sync_catches_and_names_every_kind_of_desync_on_three_ranks():
    results = run_world(_ranks_world, 3, timeout=50)
    for rank, out in enumerate(results):
        assert out["clean"], rank
        caught, names, versions, diff, original, _, bit, text = out["flip"]
        assert caught and names == ["param:weight"], (rank, text)
        assert versions == [((0, 1), (2,))], rank
        flipped = results[2]["flip"][5]
        assert diff == pytest.approx(abs(flipped - original), rel=1e-12, abs=0) or (
            diff != diff and flipped != flipped), (rank, bit, diff, original, flipped)
        assert "param:weight" in text and "rank 2" in text and "ranks 0,1" in text
        assert out["perm"] == (["param:2.weight"], [((0, 2), (1,))]), rank
        assert out["buffer"][0] == ["buffer:1.running_mean"] and out["buffer"][1] == pytest.approx(0.5)
        assert out["buffer_off"]
        assert out["grads_ignored"]
        # the biases after BatchNorm get data-independent gradients from .sum(): equal everywhere
        assert out["grads"] == ["grad:0.bias", "grad:0.weight", "grad:1.weight", "grad:2.weight"], rank
        assert out["grad_none"] == [("grad:0.weight", "layout")], rank
        assert out["atol_pass"] and out["atol_fail"]
        assert out["ddp_clean"], rank
        assert out["raw_names"] == ["param:bias", "param:weight"], rank
        assert out["structure"] == (True, ((0, 2), (1,))), rank
        assert out["shape"] == [("param:weight", "layout"), ("param:bias", "layout")], rank
        assert out["pickle"] == "param-desync"
    # the permutation kept the sum: a sum-based check would have missed it
    assert results[1]["perm_sums_equal"] == pytest.approx(results[0]["perm_sums_equal"], rel=1e-5)


def _two_ranks(rank: int, world: int) -> tuple:
    model = _model()
    clean = _desync(model, grads=True)
    if rank == 1:
        with torch.no_grad():
            model[0].weight[0, 0] = torch.nextafter(model[0].weight[0, 0], torch.tensor(1.0))
    exc = _desync(model)
    empty = _desync(torch.nn.ReLU())
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 3, sparse=True)
    emb(torch.tensor([1, 2, 2])).sum().backward()
    sparse_clean = _desync(emb, grads=True)
    emb.zero_grad()
    emb(torch.tensor([1, 2 + rank])).sum().backward()
    sparse = _desync(emb, grads=True)
    return (clean is None, [m.name for m in exc.mismatches] if exc else None, empty is None,
            sparse_clean is None, [m.name for m in sparse.mismatches] if sparse else None)


@pytest.mark.timeout(30)
def test_two_ranks_one_ulp_apart_empty_modules_and_sparse_grads():
    for clean, names, empty, sparse_clean, sparse in run_world(_two_ranks, 2, timeout=25):
        assert clean and empty and sparse_clean
        assert names == ["param:0.weight"]
        assert sparse == ["grad:weight"]


@pytest.mark.timeout(30)
def test_without_a_process_group_it_is_a_no_op():
    def fn(rank, world):
        torch.manual_seed(rank)
        return assert_in_sync(torch.nn.Linear(3, 3), grads=True)

    assert run_world(fn, 2, backend=None, timeout=25) == [None, None]
    assert assert_in_sync(torch.nn.Linear(3, 3)) is None


def test_negative_atol_names_the_value_and_the_fix():
    with pytest.raises(ValueError, match=r"-1.*atol=0.0"):
        assert_in_sync(torch.nn.Linear(2, 2), atol=-1)


def test_fingerprint_sees_every_single_bit_and_permutations():
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(257, generator=gen)
    base = fingerprint(t)
    assert fingerprint(t.clone()) == base
    words = t.view(torch.int32)
    for index in (0, 1, 128, 256):
        for bit in range(32):
            flipped = words.clone()
            flipped[index] ^= (1 << bit) if bit < 31 else -(1 << 31)
            assert fingerprint(flipped.view(torch.float32)) != base, (index, bit)
    for seed in range(20):
        perm = torch.randperm(t.numel(), generator=torch.Generator().manual_seed(seed))
        assert fingerprint(t[perm]) != base
    swapped = t.clone()
    swapped[[3, 200]] = swapped[[200, 3]]
    assert fingerprint(swapped) != base


def test_fingerprint_covers_odd_dtypes_sizes_and_block_boundaries():
    half = torch.randn(7).half()  # 14 bytes: padded to whole words
    flipped = half.clone()
    flipped.view(torch.int16)[6] ^= 1
    assert fingerprint(half) != fingerprint(flipped)
    flags = torch.tensor([True, False, True])
    assert fingerprint(flags) != fingerprint(torch.tensor([True, True, True]))
    assert fingerprint(torch.arange(5)) != fingerprint(torch.arange(5).flip(0))
    big = torch.zeros(3 * _ROW + 10)
    big[0], big[_ROW + 1] = 1.0, 2.0  # swapped across rows
    moved = big.clone()
    moved[0], moved[_ROW + 1] = 2.0, 1.0
    assert fingerprint(big) != fingerprint(moved)
    moved_rows = big.clone()
    moved_rows[[0, _ROW]] = moved_rows[[_ROW, 0]]  # same column, another row
    assert fingerprint(big) != fingerprint(moved_rows)
    for index in (0, _ROW - 1, _ROW, 3 * _ROW, 3 * _ROW + 9):  # row edges and the padded tail
        one = torch.zeros(3 * _ROW + 10)
        one[index] = 1e-30
        assert fingerprint(one) != fingerprint(torch.zeros(3 * _ROW + 10)), index
    signs = torch.randn(4 * _ROW, generator=torch.Generator().manual_seed(1))
    flipped_far = signs.clone()
    flipped_far[[5, 3 * _ROW + 5]] = flipped_far[[3 * _ROW + 5, 5]]
    assert fingerprint(signs) != fingerprint(flipped_far)
