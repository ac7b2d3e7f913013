"""Check ``param-sync``: parameters and gradients are identical on every rank, before and after DDP.

On the built-in model (or the user's ``--model``) built with a rank-dependent seed, the check shows
that :func:`ddpdoctor.assert_in_sync` catches and names the desync, that DDP's broadcast at
construction removes it, that parameters stay in sync over optimizer steps, and that gradients
match. It also lists parameters that receive no gradient in one forward/backward: the cause of
DDP's "Expected to have finished reduction in the prior iteration" error.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from ddpdoctor.check import RankContext
from ddpdoctor.checks.ddp_eager import sgd_step, wrap_ddp, zero_grad
from ddpdoctor.diagnostics.desync import DesyncError, assert_in_sync
from ddpdoctor.diagnostics.model_factory import LoadedModel, ModelCheck, forward_loss, rank_batch
from ddpdoctor.result import Outcome, count

__all__ = ["ParamSyncCheck"]

STEPS = 2


def _wrap(model: torch.nn.Module, ctx: RankContext, find_unused: bool) -> DistributedDataParallel:
    if ctx.device != "cpu":
        model.to(ctx.device)
        return wrap_ddp(model, device_ids=[ctx.local_rank], find_unused_parameters=find_unused)
    return wrap_ddp(model, find_unused_parameters=find_unused)


def _short(exc: DesyncError, shown: int = 3) -> str:
    names = [m.name for m in exc.mismatches[:shown]]
    more = len(exc.mismatches) - len(names)
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


class ParamSyncCheck(ModelCheck):
    """Parameters, gradients and buffers agree across ranks; DDP puts a desynced model in sync."""

    name = "param-sync"
    description = "parameters and gradients identical on every rank; unused parameters named"

    def seed(self, rank: int) -> int:
        return 1000 + rank  # rank-dependent init: the bug DDP's broadcast fixes

    def run_model(self, ctx: RankContext, loaded: LoadedModel) -> Outcome:
        model = loaded.module.train()
        details: list[str] = [f"model: {loaded.label}, "
                              f"{count(sum(p.numel() for p in model.parameters()), 'parameter')}"]
        data: dict[str, Any] = {"model": loaded.label}

        caught: Optional[DesyncError] = None
        try:
            assert_in_sync(model, buffers=False)
        except DesyncError as exc:
            caught = exc
        data["init_desync"] = [m.name for m in caught.mismatches] if caught else []
        if caught:
            details.append(f"rank-dependent init without DDP: caught "
                           f"{count(len(caught.mismatches), 'differing tensor')} ({_short(caught)})")
        else:
            details.append("rank-dependent init without DDP: parameters identical anyway "
                           "(the model's init does not use the global RNG)")
        if caught and any(m.reason == "layout" for m in caught.mismatches):
            return ctx.failed(f"the model differs across ranks in structure: {_short(caught)}",
                              hint="build the same architecture on every rank (same parameter "
                                   "names, shapes and dtypes) before wrapping it in DDP",
                              finding="model-structure-differs", details=details + [str(caught)],
                              data=data)
        if caught is None and loaded.builtin:
            return ctx.failed("assert_in_sync missed a rank-dependent initialization",
                              hint="report this ddpdoctor bug with the torch version",
                              finding="desync-not-detected", details=details, data=data)

        unused: list[str] = []
        if loaded.input_shape is None:
            details.append("unused parameters: not checked (input shape unknown)")
        else:
            unused, stop = self.find_unused(ctx, model, loaded, details, data)
            if stop is not None:
                return stop
        data["unused"] = unused

        ddp = _wrap(model, ctx, find_unused=bool(unused))
        try:
            assert_in_sync(ddp, buffers=True)
        except DesyncError as exc:
            return ctx.failed(f"still out of sync after DDP construction: {_short(exc)}",
                              hint="build the same model on every rank (same architecture, "
                                   "same parameter shapes and dtypes)",
                              finding="param-desync-after-ddp", details=details + [exc.message], data=data)
        details.append("after DistributedDataParallel(model): parameters and buffers in sync "
                       "(rank 0's state was broadcast)")

        if loaded.input_shape is not None:
            outcome = self._train(ctx, ddp, loaded, details, data)
            if outcome is not None:
                return outcome

        if unused:
            shown = ", ".join(unused[:8]) + (f" and {len(unused) - 8} more" if len(unused) > 8 else "")
            return ctx.failed(
                f"{count(len(unused), 'parameter')} get{'s' if len(unused) == 1 else ''} no gradient: {shown}",
                hint="DDP fails on them with 'Expected to have finished reduction in the prior iteration': "
                     "stop creating the unused module(s) or freeze them (requires_grad_(False)) before "
                     "wrapping; or pass find_unused_parameters=True to DistributedDataParallel, which costs "
                     "a walk of the autograd graph after every forward",
                finding="unused-parameters", details=details, data=data)
        if caught:
            n = len(caught.mismatches)
            summary = (f"rank-dependent init caught ({count(n, 'tensor')} differ{'s' if n == 1 else ''}, e.g. "
                       f"{caught.mismatches[0].name}); DDP construction synced them")
        else:
            summary = "parameters identical on every rank"
        if loaded.input_shape is not None:
            summary += f"; in sync after {STEPS} optimizer steps, gradients match"
        # what was judged: a DDP this check built, on this world; never the user's training loop
        if loaded.builtin:
            summary = f"built-in model on this world: {summary}"
        else:
            summary += ("; in a DDP the check built: your training loop is not judged (never wrapped in DDP, "
                        "modules attached after wrapping, seeds): run the job under ddpdoctor run")
        return ctx.passed(summary, details=details, data=data)

    def _train(self, ctx: RankContext, ddp: DistributedDataParallel, loaded: LoadedModel,
               details: list[str], data: dict[str, Any]) -> Optional[Outcome]:
        """A few DDP steps on rank-dependent data; a FAIL outcome when grads or params drift.

        One comparison per step (parameters and gradients after backward: the parameters as the
        previous step's update left them) and one after the last update, not two per step: each is
        a collective, and on a crowded world a collective costs far more than the step.
        """
        shape = loaded.input_shape or ()
        momentum: dict = {}  # torch.optim.SGD(lr=0.05, momentum=0.9), without importing dynamo
        for step in range(STEPS):
            zero_grad(ddp.parameters())
            batch = rank_batch(shape, ctx.rank, step + 1).to(ctx.device)
            forward_loss(ddp, batch).backward()
            try:
                assert_in_sync(ddp, grads=True, buffers=False)
            except DesyncError as exc:
                if all(m.name.startswith("grad:") for m in exc.mismatches):
                    return ctx.failed(f"gradients differ across ranks at step {step + 1}: {_short(exc)}",
                                      hint="let DDP reduce the gradients: call backward on the DDP "
                                           "module's output and do not modify .grad on some ranks only",
                                      finding="grad-desync", details=details + [exc.message], data=data)
                when = f"after step {step}'s update or in step {step + 1}" if step else f"in step {step + 1}"
                return ctx.failed(f"parameters differ across ranks {when}: {_short(exc)}",
                                  hint="change parameters only through the optimizer, identically on "
                                       "every rank (no rank-dependent in-place updates in forward)",
                                  finding="param-desync-after-step", details=details + [exc.message],
                                  data=data)
            sgd_step(ddp.parameters(), momentum, lr=0.05, momentum=0.9)
        try:
            assert_in_sync(ddp, buffers=False)
        except DesyncError as exc:
            return ctx.failed(f"parameters differ across ranks after step {STEPS}: {_short(exc)}",
                              hint="update parameters only through the optimizer, identically "
                                   "on every rank",
                              finding="param-desync-after-step", details=details + [exc.message],
                              data=data)
        details.append(f"{STEPS} SGD steps on rank-dependent data: gradients matched, parameters "
                       "stayed in sync (buffers such as BatchNorm statistics: see bn-sync)")
        data["steps"] = STEPS
        return None
