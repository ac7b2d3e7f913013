"""checks/ddp_eager.py (DDP without importing torch._dynamo) against the stock DDP + torch.optim.SGD.

Each rank of a real gloo world runs the same models twice, first through ``wrap_ddp``/``sgd_step``
(asserting that ``torch._dynamo`` stays unimported), then, after importing dynamo, through
``DistributedDataParallel`` and ``torch.optim.SGD``: parameters and buffers after construction
(rank 0's state broadcast over a rank-dependent init), gradients (averaged) and parameters and
buffers after each step must be bit-identical; a model with an unused parameter must fail the same
way without ``find_unused_parameters`` and train the same way with it.

The world runs in a fresh interpreter, so that no other test has imported dynamo before it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


class Unused(__import__("torch").nn.Module):
    """A linear model with a parameter that never gets a gradient, and a BatchNorm (buffers)."""

    def __init__(self) -> None:
        import torch

        super().__init__()
        self.lin = torch.nn.Linear(6, 5)
        self.bn = torch.nn.BatchNorm1d(5)
        self.spare = torch.nn.Linear(5, 5)  # not used in forward

    def forward(self, x: Any) -> Any:
        return self.bn(self.lin(x))


def _models() -> list:
    import torch

    from ddpdoctor.diagnostics.model_factory import TinyConvNet

    return [
        ("tinyconvnet", TinyConvNet, (4, 3, 8, 8), False),
        ("mlp", lambda: torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)),
         (5, 6), False),
        ("unused", Unused, (4, 6), True),
    ]


def _train(rank: int, make: Any, shape: tuple, find_unused: bool, light: bool) -> dict:
    """Construct, then two steps; the tensors at each point (cloned)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from ddpdoctor.checks.ddp_eager import sgd_step, wrap_ddp, zero_grad
    from ddpdoctor.diagnostics.model_factory import forward_loss, rank_batch

    torch.manual_seed(1000 + rank)  # rank-dependent init: construction must broadcast rank 0's
    model = make().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ddp = (wrap_ddp(model, find_unused_parameters=find_unused) if light
           else DistributedDataParallel(model, find_unused_parameters=find_unused))
    seen: dict = {"init_differs_from_constructed": any(not torch.equal(before[k], v)
                                                        for k, v in model.state_dict().items()),
                  "constructed": {k: v.clone() for k, v in model.state_dict().items()}}
    state: dict = {}
    opt = None if light else torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(2):
        if light:
            zero_grad(ddp.parameters())
        else:
            opt.zero_grad(set_to_none=True)
        forward_loss(ddp, rank_batch(shape, rank, step + 1)).backward()
        seen[f"grads{step}"] = {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}
        if light:
            sgd_step(ddp.parameters(), state, lr=0.05, momentum=0.9)
        else:
            opt.step()
        seen[f"state{step}"] = {k: v.clone() for k, v in model.state_dict().items()}
    return seen


def _unused_without_flag(rank: int, light: bool) -> str:
    """The error DDP raises on the second step when a parameter got no gradient and the flag is off."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from ddpdoctor.checks.ddp_eager import wrap_ddp
    from ddpdoctor.diagnostics.model_factory import forward_loss, rank_batch

    torch.manual_seed(5)
    model = Unused()
    ddp = wrap_ddp(model) if light else DistributedDataParallel(model)
    try:
        for step in range(2):
            forward_loss(ddp, rank_batch((4, 6), rank, step)).backward()
    except RuntimeError as exc:
        return "Expected to have finished reduction" if "Expected to have finished reduction" in str(exc) else str(exc)
    return "no error"


def _same(a: Any, b: Any, where: str, out: list) -> None:
    import torch

    if isinstance(a, dict):
        if sorted(a) != sorted(b):
            out.append(f"{where}: keys differ")
            return
        for k in a:
            _same(a[k], b[k], f"{where}.{k}", out)
    elif a is None or b is None:
        if not (a is None and b is None):
            out.append(f"{where}: None on one path only")
    elif isinstance(a, torch.Tensor):
        if not torch.equal(a, b):
            out.append(f"{where}: differs by {(a.double() - b.double()).abs().max().item():.3g}")
    elif a != b:
        out.append(f"{where}: {a!r} != {b!r}")


def rank_fn(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    from ddpdoctor.checks.ddp_eager import dynamo_imported

    report: dict = {"dynamo_before": dynamo_imported()}
    light = {name: _train(rank, make, shape, unused, light=True) for name, make, shape, unused in _models()}
    light_error = _unused_without_flag(rank, light=True)
    report["dynamo_after_light"] = dynamo_imported()
    import torch._dynamo  # noqa: F401 - from here on, the stock path

    stock = {name: _train(rank, make, shape, unused, light=False) for name, make, shape, unused in _models()}
    stock_error = _unused_without_flag(rank, light=False)
    mismatches: list = []
    _same(light, stock, "model", mismatches)
    report["mismatches"] = mismatches
    report["errors"] = [light_error, stock_error]
    report["broadcast"] = {name: light[name]["init_differs_from_constructed"] for name in light}
    # the state after construction is rank 0's on every rank, and gradients are averaged (equal)
    import torch

    flat = torch.cat([v.flatten().double() for v in light["tinyconvnet"]["constructed"].values()])
    grads = torch.cat([g.flatten().double() for g in light["tinyconvnet"]["grads0"].values()])
    both = torch.stack([flat.sum(), grads.sum()])
    gathered = [torch.zeros_like(both) for _ in range(world_size)]
    dist.all_gather(gathered, both)
    report["ranks_agree"] = all(torch.equal(gathered[0], g) for g in gathered)
    report["unused_grad_none"] = light["unused"]["grads1"]["spare.weight"] is None
    return report


def test_light_ddp_matches_stock_ddp() -> None:
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=240,
                          cwd=HERE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(reports) == 2
    for rank, r in enumerate(reports):
        assert r["dynamo_before"] is False, "the world must start without torch._dynamo"
        assert r["dynamo_after_light"] is False, "wrap_ddp/sgd_step imported torch._dynamo"
        assert r["mismatches"] == [], f"rank {rank}: {r['mismatches'][:5]}"
        assert r["errors"] == ["Expected to have finished reduction"] * 2, r["errors"]
        assert r["ranks_agree"] is True
        assert r["unused_grad_none"] is True
    # rank 1 was initialized differently and received rank 0's state at construction
    assert reports[1]["broadcast"] == {"tinyconvnet": True, "mlp": True, "unused": True}


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    from worlds import run_world

    print(json.dumps(run_world(rank_fn, 2, timeout=200)))
