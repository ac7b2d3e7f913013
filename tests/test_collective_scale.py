"""The collectives check's work adapts to the world (issue 18): closed-form expected results equal
the rank-by-rank ones, and the plan shrinks on crowded CPU worlds, not on small ones."""

from __future__ import annotations

import pytest
import torch

from ddpdoctor.checks.collectives import CROWDED, SIZES, TIMED_COUNT, CollectivesCheck, scaled_count, work_shrink
from ddpdoctor.diagnostics.collective_plan import Group, _ints, _modulus, ints_by_rank, reduced_ints


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 31, 32, 128])
@pytest.mark.parametrize("dtype,reduces", [("float32", True), ("bfloat16", True), ("float16", True),
                                           ("int64", True), ("bfloat16", False)])
def test_closed_form_reductions_equal_the_rank_by_rank_loop(n, dtype, reduces):
    m = max(_modulus(n, dtype, reduces), 1)
    for count, offset in [(8, 0), (1531, 0), (1531, 3 * 1531), (65, 17)]:
        ranks = [_ints(r, count, m, offset) for r in range(n)]
        total = ranks[0].clone()
        high, low = ranks[0].clone(), ranks[0].clone()
        for t in ranks[1:]:
            total += t
            high, low = torch.maximum(high, t), torch.minimum(low, t)
        assert torch.equal(reduced_ints("sum", n, count, m, offset), total)
        assert torch.equal(reduced_ints("max", n, count, m, offset), high)
        assert torch.equal(reduced_ints("min", n, count, m, offset), low)
        assert torch.equal(ints_by_rank(n, count, m, offset), torch.stack(ranks))


def test_small_worlds_keep_the_full_plan_and_crowded_ones_shrink():
    # ranks_per_core: 2 ranks on 2 cores = 1.0; 32 ranks on 2 cores = 16.0
    assert work_shrink(2, 1.0, "cpu") == 1.0
    assert work_shrink(4, 2.0, "cpu") == 1.0  # the 3- and 4-rank test worlds on 2 cores run unchanged
    assert work_shrink(8, 0.5, "cpu") == 1.0  # 8 ranks on 16 cores
    assert work_shrink(8, 4.0, "cpu") == CROWDED
    assert work_shrink(32, 16.0, "cpu") == 64.0
    assert work_shrink(8, 1.0, "cuda:0") == 1.0  # one GPU per rank: only huge worlds shrink
    assert scaled_count(TIMED_COUNT, 64.0, SIZES[1]) % 2 == 1
    assert scaled_count(SIZES[2], 4096.0, SIZES[1]) == SIZES[1]
    check = CollectivesCheck()
    world = Group(tuple(range(32)), 0)
    full = check.cases(world)
    check.shrink = work_shrink(32, 16.0, "cpu")
    crowded = check.cases(world)
    assert len(crowded) < len(full) / 1.5
    assert {op for op, _, _ in crowded} == {op for op, _, _ in full}  # every operation still checked
    assert max(c for _, _, c in crowded) < SIZES[2]
