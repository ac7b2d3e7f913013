"""Check ``bn-sync``: BatchNorm running statistics drift apart across ranks under DDP.

DDP keeps parameters identical but each rank updates its BatchNorm running statistics from its own
data. The check lists the BatchNorm layers that are not SyncBatchNorm, trains a few steps on
rank-dependent data, reports how far the running statistics diverge (:func:`ddpdoctor.bn_divergence`),
and verifies that :func:`ddpdoctor.sync_bn_stats` makes them equal. On the built-in model this is a
demonstration (PASS); on the user's model (``--model``) diverging layers are a WARN.
"""

from __future__ import annotations

from typing import Any

import torch

from ddpdoctor.check import RankContext
from ddpdoctor.checks.ddp_eager import sgd_step, wrap_ddp, zero_grad
from ddpdoctor.diagnostics.batchnorm import batchnorm_layers, bn_divergence, sync_bn_stats
from ddpdoctor.diagnostics.model_factory import LoadedModel, ModelCheck, forward_failed, forward_loss, rank_batch
from ddpdoctor.result import Outcome, count

__all__ = ["BnSyncCheck"]

STEPS = 3
FIX = ("convert with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP "
       "(GPU), or call ddpdoctor.sync_bn_stats(model) on every rank before evaluation and "
       "checkpointing")


class BnSyncCheck(ModelCheck):
    """BatchNorm layers that are not SyncBatchNorm, their divergence, and the fix."""

    name = "bn-sync"
    description = "BatchNorm running statistics diverge across ranks; sync_bn_stats equalizes them"

    def run_model(self, ctx: RankContext, loaded: LoadedModel) -> Outcome:
        model = loaded.module.train()
        layers = [(name, bn) for name, bn in batchnorm_layers(model)
                  if not isinstance(bn, torch.nn.SyncBatchNorm) and name not in loaded.reverted]
        if not layers:
            return ctx.skipped(f"{loaded.label} has no BatchNorm layers outside SyncBatchNorm")
        if loaded.input_shape is None:
            return ctx.skipped(f"{loaded.label}: input shape unknown; pass --input-shape, "
                               "e.g. --input-shape 8,3,32,32")
        names = [name for name, _ in layers]
        details = [f"model: {loaded.label}; BatchNorm layers that are not SyncBatchNorm: "
                   + ", ".join(names)]
        data: dict[str, Any] = {"model": loaded.label, "layers": names}

        # parameters without gradients would make DDP fail on the second step
        unused_names, stop = self.find_unused(ctx, model, loaded, details, data)
        if stop is not None:
            return stop
        unused = bool(unused_names)
        try:
            if ctx.device != "cpu":
                model.to(ctx.device)
                ddp = wrap_ddp(model, device_ids=[ctx.local_rank], find_unused_parameters=unused)
            else:
                ddp = wrap_ddp(model, find_unused_parameters=unused)
            for step in range(STEPS):  # torch.optim.SGD(lr=0.01) without importing dynamo: ddp_eager.py
                zero_grad(ddp.parameters())
                batch = rank_batch(loaded.input_shape, ctx.rank, step + 1).to(ctx.device)
                forward_loss(ddp, batch).backward()
                sgd_step(ddp.parameters(), {}, lr=0.01)
        except Exception as exc:  # noqa: BLE001 - the user's forward is theirs to fix
            return forward_failed(ctx, exc, loaded.input_shape, details, data)

        before = {k: v for k, v in bn_divergence(model).items() if k in names}
        worst_name = max(before, key=lambda k: before[k])
        worst = before[worst_name]
        data["divergence"] = before
        details.append(f"after {STEPS} steps on rank-dependent data, running stats diverge by: "
                       + ", ".join(f"{k} {v:.4g}" for k, v in before.items()))
        sync_bn_stats(model)
        after = bn_divergence(model)
        left = max(after.values()) if after else 0.0
        data["divergence_after_sync"] = left
        details.append(f"after ddpdoctor.sync_bn_stats(model): largest divergence {left:.4g}")
        if left > 0.0:
            return ctx.failed(f"sync_bn_stats left running stats {left:.4g} apart",
                              hint="report this ddpdoctor bug with the torch version",
                              finding="bn-sync-failed", details=details, data=data)
        details.append(f"fix: {FIX}")
        summary = (f"{count(len(names), 'BatchNorm layer')} not SyncBatchNorm; "
                   f"running stats diverge up to {worst:.3g} ({worst_name}) after {STEPS} steps")
        if worst > 0.0 and not loaded.builtin:
            return ctx.warned(summary, hint=FIX[0].upper() + FIX[1:], finding="bn-stats-diverge",
                              details=details, data=data)
        if worst == 0.0:
            summary += " (identical data on every rank?)"
        if loaded.builtin:
            summary = f"built-in model on this world: {summary}"
        return ctx.passed(f"{summary}; sync_bn_stats equalized them", hint=FIX, details=details, data=data)
