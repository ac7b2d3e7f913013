"""bn_divergence and sync_bn_stats on real gloo worlds of 2 and 3 ranks."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo  # noqa: F401 - DDP imports it on first use; once here, not in every forked rank

from ddpdoctor.diagnostics.batchnorm import bn_divergence, sync_bn_stats
from ddpdoctor.diagnostics.desync import DesyncError, assert_in_sync
from worlds import run_world


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.bn_a = torch.nn.BatchNorm1d(6)
        self.block = torch.nn.Sequential(torch.nn.BatchNorm1d(6, momentum=None), torch.nn.ReLU())
        self.norm = torch.nn.LayerNorm(6)  # not BatchNorm: never listed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.block(self.bn_a(self.fc(x))))


def _bn_world(rank: int, world: int) -> dict:
    out: dict = {}
    torch.manual_seed(0)
    net = Net()
    out["clean"] = bn_divergence(net)

    # Known per-rank statistics: layer bn_a drifts by rank, block.0 stays identical.
    with torch.no_grad():
        net.bn_a.running_mean.fill_(float(rank))
        net.bn_a.running_var.fill_(1.0 + rank)
        net.bn_a.num_batches_tracked.fill_(10 + rank)
    out["drift"] = bn_divergence(net)
    out["names"] = sync_bn_stats(net)
    out["synced_mean"] = net.bn_a.running_mean.tolist()
    out["synced_var"] = net.bn_a.running_var.tolist()
    out["tracked"] = int(net.bn_a.num_batches_tracked)
    out["after"] = bn_divergence(net)

    # Pooled statistics equal the statistics of all ranks' data together (equal batch sizes).
    torch.manual_seed(0)
    pooled = torch.nn.BatchNorm1d(3, momentum=None).train()  # momentum=None: cumulative average
    data = torch.randn(64, 3, generator=torch.Generator().manual_seed(rank)) * (1 + rank) + 3 * rank
    pooled(data)
    everyone = [torch.empty_like(data) for _ in range(world)]
    torch.distributed.all_gather(everyone, data)
    full = torch.cat(everyone)
    sync_bn_stats(pooled)
    out["pooled"] = (pooled.running_mean.tolist(), full.mean(0).tolist(),
                     pooled.running_var.tolist(),
                     # running_var holds the unbiased batch variance; pooled over ranks it is
                     # mean of per-rank unbiased variances + population variance of the means
                     (torch.stack([e.var(0) for e in everyone]).mean(0)
                      + torch.stack([e.mean(0) for e in everyone]).var(0, unbiased=False)).tolist())

    # Under DDP: training on rank-dependent data desyncs the stats but not the parameters.
    torch.manual_seed(0)
    model = Net()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(2):
        opt.zero_grad()
        batch = torch.randn(16, 6, generator=torch.Generator().manual_seed(rank * 10 + step)) + rank
        ddp(batch).sum().backward()
        opt.step()
    out["ddp_drift"] = bn_divergence(ddp)
    try:
        assert_in_sync(ddp, buffers=False)
        out["params_in_sync"] = True
    except DesyncError:
        out["params_in_sync"] = False
    try:
        assert_in_sync(ddp)
        out["buffers_caught"] = []
    except DesyncError as exc:
        out["buffers_caught"] = sorted(m.name for m in exc.mismatches)
    sync_bn_stats(ddp)
    out["ddp_after"] = bn_divergence(ddp)
    with torch.no_grad():
        for layer in (model.bn_a, model.block[0]):
            layer.num_batches_tracked.fill_(0)
    try:
        assert_in_sync(ddp)  # bitwise equal after the sync
        out["bitwise_after_sync"] = True
    except DesyncError as exc:
        out["bitwise_after_sync"] = str(exc)
    return out


@pytest.mark.timeout(60)
def test_bn_divergence_names_the_drifting_layer_and_sync_pools_correctly_on_three_ranks():
    results = run_world(_bn_world, 3, timeout=50)
    for rank, out in enumerate(results):
        assert out["clean"] == {"bn_a": 0.0, "block.0": 0.0}
        assert out["drift"] == {"bn_a": 2.0, "block.0": 0.0}  # means 0..2, variances 1..3
        assert out["names"] == ["bn_a", "block.0"]
        assert out["synced_mean"] == pytest.approx([1.0] * 6)
        # mean of variances (2) plus variance of the means 0, 1, 2 (2/3)
        assert out["synced_var"] == pytest.approx([2.0 + 2.0 / 3.0] * 6)
        assert out["tracked"] == 10 + rank  # num_batches_tracked is left alone
        assert out["after"] == {"bn_a": 0.0, "block.0": 0.0}
        got_mean, want_mean, got_var, want_var = out["pooled"]
        assert got_mean == pytest.approx(want_mean, rel=1e-5, abs=1e-5)
        assert got_var == pytest.approx(want_var, rel=1e-5)
        # block.0 sees normalized inputs, so it drifts much less, but it drifts
        assert out["ddp_drift"]["bn_a"] > 0.01 and out["ddp_drift"]["block.0"] > 0.0, out["ddp_drift"]
        assert out["params_in_sync"]
        assert "buffer:bn_a.running_mean" in out["buffers_caught"]
        assert out["ddp_after"] == {"bn_a": 0.0, "block.0": 0.0}
        assert out["bitwise_after_sync"] is True
    assert results[0]["ddp_drift"] == results[1]["ddp_drift"] == results[2]["ddp_drift"]


@pytest.mark.timeout(30)
def test_two_ranks_and_no_group():
    def fn(rank, world):
        bn = torch.nn.BatchNorm2d(2)
        with torch.no_grad():
            bn.running_var[1] += 0.25 * rank
        before = bn_divergence(bn)
        sync_bn_stats(bn)
        return before, bn_divergence(bn), bn.running_var.tolist()

    for before, after, var in run_world(fn, 2, timeout=25):
        assert before == {"<root>": 0.25} and after == {"<root>": 0.0}
        assert var == pytest.approx([1.0, 1.125])

    def alone(rank, world):
        bn = torch.nn.BatchNorm1d(2)
        return bn_divergence(bn), sync_bn_stats(bn), bn_divergence(torch.nn.Linear(2, 2))

    assert run_world(alone, 2, backend=None, timeout=25) == [({"<root>": 0.0}, [], {})] * 2
