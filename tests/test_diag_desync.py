"""assert_in_sync and the tensor fingerprint, on real gloo worlds of 2 and 3 ranks."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch._dynamo  # noqa: F401 - DDP imports it on first use; once here, not in every forked rank

from ddpdoctor.diagnostics.desync import DesyncError, assert_in_sync, fingerprint
from ddpdoctor.diagnostics.fingerprint import BLOCK_WORDS, CHUNK_BYTES, COLS, PACK_WORDS, fingerprint_many, fingerprint_tensor
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


def _bits_world(rank: int, world: int) -> dict:
    out: dict = {}

    def holder(**tensors) -> torch.nn.Module:
        m = torch.nn.Module()
        for name, value in tensors.items():
            m.register_buffer(name, value)
        return m

    zero = torch.zeros(10)
    if rank == 1:
        zero[4] = -0.0
    exc = _desync(holder(z=zero))
    out["negzero"] = (exc.mismatches[0].max_abs_diff, str(exc)) if exc else None
    out["negzero_atol"] = _desync(holder(z=zero), atol=1e-3) is None
    nan = torch.ones(10)
    if rank == 1:
        nan[2] = float("nan")
    exc = _desync(holder(n=nan), atol=1.0)
    out["nan"] = (exc.mismatches[0].max_abs_diff, str(exc)) if exc else None
    both = torch.ones(10)
    both[3] = float("nan")  # the same NaN on every rank: in sync
    out["both_nan"] = _desync(holder(n=both)) is None
    # three all_reduce chunks; rank 0 holds it transposed (not contiguous): same logical values,
    # the same number of collectives on every rank, the largest difference in the last chunk
    big = torch.arange(3 * 140_000, dtype=torch.float32).view(-1, 2)
    if rank == 1:
        big[-1, 1] += 0.25
    if rank == 0:
        big = big.t().contiguous().t()
    exc = _desync(holder(b=big))
    out["big"] = exc.mismatches[0].max_abs_diff if exc else None
    same = torch.arange(12.0).view(3, 4)
    out["strided_equal"] = _desync(holder(s=same if rank else same.t().contiguous().t())) is None
    return out


@pytest.mark.timeout(60)
def test_bits_nan_negative_zero_and_chunked_differences_across_ranks():
    for out in run_world(_bits_world, 2, timeout=50):
        diff, text = out["negzero"]
        assert diff == 0.0 and "values equal, bits differ (-0.0 against 0.0" in text
        assert out["negzero_atol"]
        diff, text = out["nan"]
        assert diff != diff and "buffer:n: NaN on some ranks, a number on others" in text
        # the traceback's text (str) carries the fix, not only e.hint
        assert text.endswith("\nfix: wrap the model in DistributedDataParallel before training (it broadcasts rank "
                             "0's state), seed every rank identically before building the model, and never update "
                             "parameters outside the optimizer on some ranks only"), text
        assert out["both_nan"] and out["strided_equal"]
        assert out["big"] == 0.25


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


def _flip(t: torch.Tensor, index: int, bit: int) -> torch.Tensor:
    """A copy of ``t`` with one bit of element ``index`` flipped (any 2- or 4-byte dtype)."""
    out = t.clone()
    words = out.view(torch.int16 if t.element_size() == 2 else torch.int32)
    top = 8 * t.element_size() - 1
    words[index] ^= (1 << bit) if bit < top else -(1 << top)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_flipped_bit_anywhere_in_a_large_tensor_is_caught(dtype):
    gen = torch.Generator().manual_seed(0)
    n = 2 * BLOCK_WORDS * 4 // torch.tensor([], dtype=dtype).element_size() + 4 * COLS + 7
    t = torch.randn(n, generator=gen).to(dtype)  # two full 4 MiB blocks, rows, a partial row
    base = fingerprint(t)
    assert fingerprint(t.clone()) == base
    words = t.view(torch.int16 if t.element_size() == 2 else torch.int32)
    top = 8 * t.element_size() - 1
    positions = [0, BLOCK_WORDS + 5, n - 1] + torch.randint(0, n, (2,), generator=gen).tolist()
    for index in positions:  # flipped in place and back: no copy of the large tensor
        for bit in range(top + 1):
            mask = (1 << bit) if bit < top else -(1 << top)
            words[index] ^= mask
            assert fingerprint(t) != base, (dtype, index, bit)
            words[index] ^= mask
    assert fingerprint(t) == base
    # the non-CPU code path (multiply and sum per block) gives the same values
    assert int(fingerprint_tensor(t, fused=False)) == base
    assert int(fingerprint_tensor(_flip(t, n - 1, 3), fused=False)) == fingerprint(_flip(t, n - 1, 3))


def test_bits_not_values_negative_zero_and_nan():
    zeros = torch.zeros(5000)
    negative = zeros.clone()
    negative[1234] = -0.0
    assert fingerprint(negative) != fingerprint(zeros)
    nan = torch.randn(5000, generator=torch.Generator().manual_seed(2))
    nan[17] = float("nan")
    assert fingerprint(nan) == fingerprint(nan.clone())  # identical NaN bits: equal
    payload = nan.clone()
    payload.view(torch.int32)[17] ^= 1  # still a NaN, another payload
    assert torch.isnan(payload[17]) and fingerprint(payload) != fingerprint(nan)
    for dtype in (torch.bfloat16, torch.float16):
        z = torch.zeros(9, dtype=dtype)
        neg = z.clone()
        neg[8] = -0.0  # the odd element out: in the zero-padded last word
        assert fingerprint(neg) != fingerprint(z), dtype


def test_every_code_path_gives_the_same_fingerprint():
    gen = torch.Generator().manual_seed(3)
    for n in (0, 1, 3, COLS - 1, COLS, COLS + 1, BLOCK_WORDS - 1, BLOCK_WORDS, BLOCK_WORDS + 5):
        t = torch.randn(n, generator=gen)
        strided = torch.stack([t, t], dim=1)[:, 0]  # not contiguous: copied through the block buffer
        values = {fingerprint(t), int(fingerprint_tensor(t, fused=False)), fingerprint(strided)}
        assert len(values) == 1, n
    half = torch.randn(8, generator=gen).bfloat16()
    misaligned = torch.cat([torch.zeros(1).bfloat16(), half[:7]])[1:]  # storage offset of 2 bytes
    assert fingerprint(misaligned) == fingerprint(half[:7].clone())
    channels_last = torch.randn(2, 3, 4, 5, generator=gen).to(memory_format=torch.channels_last)
    assert fingerprint(channels_last) == fingerprint(channels_last.contiguous())  # logical order


def test_packed_fingerprints_equal_one_tensor_at_a_time():
    """The GPU path (packs of small tensors, exercised here with fused=False) gives every tensor the
    value it has alone: across pack boundaries, odd sizes, dtypes and the tensors it leaves unpacked."""
    gen = torch.Generator().manual_seed(5)
    half = torch.randn(9, generator=gen).half()
    tensors = [torch.randn(n, generator=gen) for n in (1, 3, COLS - 1, COLS, COLS + 1, 5000)]
    tensors += [torch.randn(PACK_WORDS // 2 + 7, generator=gen) for _ in range(3)]  # forces three packs
    tensors += [torch.randn(PACK_WORDS + 1, generator=gen),  # too big for a pack: alone
                torch.randn(6, generator=gen).bfloat16(), half[:5],  # whole words / 10 bytes: alone
                half[1:5],  # a storage offset of 2 bytes: alone
                torch.randn(4, 6, generator=gen).t(),  # not contiguous: alone
                torch.zeros(0), torch.ones(12, dtype=torch.bool), torch.arange(7, dtype=torch.int64),
                torch.randn(3, 3, dtype=torch.complex64, generator=gen)]
    alone = [int(fingerprint_tensor(t)) for t in tensors]
    assert fingerprint_many(tensors, fused=False).tolist() == alone
    assert fingerprint_many(tensors).tolist() == alone
    assert fingerprint_many(tensors, fused=False).tolist() == alone  # the tables kept from the first call
    assert len(set(alone)) == len(alone)  # distinct tensors, distinct values: a pack mixes nothing up
    changed = list(tensors)
    changed[2] = _flip(tensors[2], COLS - 2, 0)
    got = fingerprint_many(changed, fused=False).tolist()
    assert [i for i, (a, b) in enumerate(zip(got, alone)) if a != b] == [2]


@pytest.mark.slow
def test_no_temporary_larger_than_the_chunk():
    from torch.profiler import ProfilerActivity, profile

    t = torch.randn(6 * BLOCK_WORDS + 3)  # 24 MiB
    fingerprint(t)  # the weight and key tables are built once per device, outside the measure

    def largest(fn) -> int:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        return max(e.cpu_memory_usage for e in prof.events())

    assert largest(lambda: fingerprint(t)) <= CHUNK_BYTES // 8
    assert largest(lambda: fingerprint_tensor(t, fused=False)) <= CHUNK_BYTES
    assert largest(lambda: fingerprint(t[:-3].view(4, -1)[:, :-1])) <= CHUNK_BYTES  # streamed
    small = [torch.randn(1000 + i) for i in range(3000)]  # 12 MiB of small tensors: several packs
    fingerprint_many(small, fused=False)  # the pack tables are kept, like the weights
    assert largest(lambda: fingerprint_many(small, fused=False)) <= CHUNK_BYTES
    assert largest(lambda: torch.cat([t, t])) >= 2 * t.numel() * 4  # the measure sees big ones


def test_fingerprint_sees_permutations():
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(3 * COLS + 17, generator=gen)
    base = fingerprint(t)
    for seed in range(20):
        perm = torch.randperm(t.numel(), generator=torch.Generator().manual_seed(seed))
        assert fingerprint(t[perm]) != base
    for a, b in ((3, 200), (0, COLS), (5, 2 * COLS + 9), (COLS + 1, 3 * COLS + 16)):
        swapped = t.clone()
        swapped[[a, b]] = swapped[[b, a]]  # same row, same column of another row, across rows
        assert fingerprint(swapped) != base, (a, b)
    big = torch.randn(2 * BLOCK_WORDS, generator=gen)
    moved = big.clone()
    moved[[7, BLOCK_WORDS + 7]] = moved[[BLOCK_WORDS + 7, 7]]  # same place in another block
    assert fingerprint(moved) != fingerprint(big)


def test_fingerprint_covers_odd_dtypes_and_sizes():
    half = torch.randn(7).half()  # 14 bytes: the last 2 padded into a word
    flipped = half.clone()
    flipped.view(torch.int16)[6] ^= 1
    assert fingerprint(half) != fingerprint(flipped)
    flags = torch.tensor([True, False, True])
    assert fingerprint(flags) != fingerprint(torch.tensor([True, True, True]))
    assert fingerprint(torch.arange(5)) != fingerprint(torch.arange(5).flip(0))
    c = torch.randn(4, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(1))
    c2 = c.clone()
    c2[3, 2] = complex(c2[3, 2].real, -c2[3, 2].imag)
    assert fingerprint(c) != fingerprint(c2)
