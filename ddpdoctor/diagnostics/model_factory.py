"""The model the training checks run on: the user's (``--model pkg.module:factory``) or a built-in one.

Loading a user's factory turns every failure (bad spec, import error, missing attribute, a factory
that raises or returns something other than an ``nn.Module``) into a :class:`UsageError` that names
the bad value and the fix, never a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from ddpdoctor.check import Check, RankContext, Requirements
from ddpdoctor.errors import UsageError
from ddpdoctor.diagnostics.batchnorm import revert_sync_batchnorm
from ddpdoctor.result import Outcome, Status, count, format_ranks

__all__ = ["ModelCheck", "TinyConvNet", "LoadedModel", "load_factory", "build_model", "parse_input_shape",
           "guess_input_shape", "load_model", "forward_loss", "rank_batch", "unused_parameters",
           "ranks_that_failed", "failed_elsewhere", "forward_failed", "BUILTIN_INPUT_SHAPE"]

BUILTIN_INPUT_SHAPE = (8, 3, 16, 16)


class TinyConvNet(nn.Module):
    """The built-in model: two conv + BatchNorm + ReLU blocks, pooling, and a linear head."""

    def __init__(self, channels: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3)))


@dataclass
class LoadedModel:
    """A model ready for a check.

    Attributes:
        module: the model, on CPU.
        input_shape: the batch shape to feed it, or None when unknown.
        label: ``built-in TinyConvNet`` or the user's spec.
        builtin: True for the built-in model.
        reverted: the SyncBatchNorm layers replaced by plain BatchNorm for a CPU run.
    """

    module: nn.Module
    input_shape: Optional[tuple[int, ...]]
    label: str
    builtin: bool
    reverted: tuple[str, ...] = ()


def load_factory(spec: str) -> Callable[[], Any]:
    """Import ``pkg.module:factory`` and return the callable.

    Raises:
        UsageError: the spec is malformed, the module does not import, or the attribute is missing
            or not callable.
    """
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise UsageError("bad-model-spec", f"--model {spec!r} is not of the form pkg.module:factory",
                         "pass --model my_package.models:build_model (a zero-argument callable "
                         "returning an nn.Module)")
    module_name, attr = spec.split(":")
    _look_in_working_directory(module_name)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to fix
        top = module_name.split(".")[0]
        missing = isinstance(exc, ModuleNotFoundError) and exc.name == top
        raise UsageError("model-import-failed",
                         f"--model {spec!r}: importing {module_name!r} failed: "
                         f"{type(exc).__name__}: {exc}",
                         (f"no {top!r} in the working directory ({os.getcwd()}) nor on the import path: run "
                          f"ddpdoctor from the directory that holds {top}/ (it looks there, as python -m does), "
                          "install the package (pip install -e .), or add its parent directory to PYTHONPATH")
                         if missing else "fix the error above (it is raised by the module itself)") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise UsageError("model-factory-missing",
                             f"--model {spec!r}: module {module_name!r} has no attribute {attr!r}",
                             f"name a function defined in {module_name}, e.g. "
                             f"--model {module_name}:build_model")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError("model-factory-not-callable",
                         f"--model {spec!r}: {attr!r} is a {type(target).__name__}, not a callable",
                         "name a zero-argument function or class that returns an nn.Module")
    return target


def _look_in_working_directory(module_name: str) -> None:
    """Let ``--model mypkg.models:build`` find ``mypkg`` in the working directory, as ``python -m`` would.

    The ``ddpdoctor`` script's import path starts at its own folder, not the working directory, so a
    project's package was not found unless installed. The working directory is added at the end of the
    path (never shadowing an installed package), and only when the package is found nowhere else.
    """
    import importlib.util

    top = module_name.split(".")[0]
    here = os.getcwd()
    try:
        known = importlib.util.find_spec(top) is not None  # a top-level name: finds, imports nothing
    except (ImportError, ValueError):
        known = False
    if not known and here not in sys.path and "" not in sys.path:
        sys.path.append(here)
        importlib.invalidate_caches()


def build_model(spec: str) -> nn.Module:
    """Call the factory named by ``spec`` and check that it returned an ``nn.Module``.

    Raises:
        UsageError: loading failed (see :func:`load_factory`), the factory raised, or it returned
            something other than an ``nn.Module``.
    """
    factory = load_factory(spec)
    try:
        model = factory()
    except Exception as exc:  # noqa: BLE001 - any failure inside the factory is the user's to fix
        raise UsageError("model-factory-failed",
                         f"--model {spec!r}: calling the factory raised {type(exc).__name__}: {exc}",
                         "make the factory buildable with no arguments (give its parameters "
                         "defaults, or wrap it in a function that passes them)") from exc
    if not isinstance(model, nn.Module):
        raise UsageError("model-not-module",
                         f"--model {spec!r} returned a {type(model).__name__}, not a torch.nn.Module",
                         "return the model itself (an nn.Module instance) from the factory")
    return model


def parse_input_shape(value: Union[str, Sequence[int], None]) -> Optional[tuple[int, ...]]:
    """``"8,3,32,32"`` (or a sequence of ints) -> ``(8, 3, 32, 32)``; None stays None.

    Raises:
        UsageError: not a comma-separated list of positive integers.
    """
    if value is None:
        return None
    if isinstance(value, str):
        parts: list[Any] = value.replace("x", ",").split(",")
    else:
        parts = list(value) if isinstance(value, (list, tuple)) else [value]
    try:
        shape = tuple(int(str(p).strip()) for p in parts)
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise UsageError("bad-input-shape",
                         f"--input-shape {value!r} is not a comma-separated list of positive integers",
                         "pass the batch shape your model takes, e.g. --input-shape 8,3,32,32 "
                         "(batch first; use a batch of at least 2 when the model has BatchNorm)")
    return shape


def guess_input_shape(model: nn.Module, batch: int = 4) -> Optional[tuple[int, ...]]:
    """A plausible input shape from the model's first layer, or None when it cannot be told."""
    for layer in model.modules():
        if isinstance(layer, nn.Conv2d):
            return (batch, layer.in_channels, 16, 16)
        if isinstance(layer, nn.Conv1d):
            return (batch, layer.in_channels, 32)
        if isinstance(layer, nn.Conv3d):
            return (batch, layer.in_channels, 8, 8, 8)
        if isinstance(layer, nn.Linear):
            return (batch, layer.in_features)
        if isinstance(layer, (nn.Embedding, nn.RNNBase, nn.MultiheadAttention, nn.Transformer)):
            return None
    return None


def load_model(options: Mapping[str, Any]) -> LoadedModel:
    """The model a check runs on: ``options["model"]`` when given, else the built-in one.

    Raises:
        UsageError: the user's model or input shape is unusable.
    """
    spec = options.get("model")
    shape = parse_input_shape(options.get("input_shape"))
    if not spec:
        return LoadedModel(TinyConvNet(), shape or BUILTIN_INPUT_SHAPE, "built-in TinyConvNet", True)
    model = build_model(spec)
    return LoadedModel(model, shape or guess_input_shape(model), spec, False)


def forward_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Run ``model(batch)`` and reduce whatever it returns to one scalar that touches every output."""
    out = model(batch)
    total: Optional[torch.Tensor] = None
    for t in _float_tensors(out):
        term = t.float().square().mean()
        total = term if total is None else total + term
    if total is None:
        raise UsageError("model-output-not-tensor",
                         f"the model returned {type(out).__name__} with no floating-point tensor",
                         "return a tensor (or a tuple, list or dict of tensors) from forward()")
    return total


def _float_tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() and out.requires_grad else []
    if isinstance(out, Mapping):
        return [t for v in out.values() for t in _float_tensors(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _float_tensors(v)]
    return []


def rank_batch(shape: Sequence[int], rank: int, step: int = 0) -> torch.Tensor:
    """A synthetic batch that differs by rank and step (rank r is centred on r, scaled by 1 + r)."""
    gen = torch.Generator().manual_seed(7919 * (rank + 1) + step)
    return torch.randn(tuple(shape), generator=gen) * (1.0 + rank) + rank


def unused_parameters(model: nn.Module, batch: torch.Tensor) -> list[str]:
    """Names of trainable parameters that get no gradient from one forward/backward.

    Under DDP such parameters cause "Expected to have finished reduction in the prior iteration"
    unless ``find_unused_parameters=True``. The gradients are reset to None afterwards.
    """
    model.zero_grad(set_to_none=True)
    forward_loss(model, batch).backward()
    unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    return unused


def ranks_that_failed(ok: bool, group: Any = None) -> list[int]:
    """Every rank says whether its step worked; returns the ranks that said no (a collective).

    Checks call it after each step that may fail on some ranks only (importing the user's model,
    a forward pass), so that the other ranks stop too instead of waiting in the next collective.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [] if ok else [0]
    # a tensor, not all_gather_object: that needs numpy, which a CPU torch install lacks
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
        else torch.device("cpu")
    vote = torch.tensor([1 if ok else 0], dtype=torch.int64, device=device)
    votes = [torch.empty_like(vote) for _ in range(dist.get_world_size(group))]
    dist.all_gather(votes, vote, group=group)
    return [rank for rank, v in enumerate(votes) if not int(v)]


def failed_elsewhere(ctx: Any, ranks: list[int], what: str) -> Any:
    """The FAIL outcome of a rank whose own step worked while ``ranks`` failed theirs."""
    return ctx.failed(f"rank {format_ranks(ranks)} could not {what}; see that rank's result",
                      hint="fix the error that rank reports (the model must import and run on "
                           "every node)", finding="model-failed-on-other-rank")


SYNC_BN_CAUSE = "SyncBatchNorm needs GPU modules"
SYNC_BN_HINT = ("run ddpdoctor check on GPUs to check SyncBatchNorm itself; to train on CPU (gloo), "
                "use plain BatchNorm instead (ddpdoctor.sync_bn_stats(model) keeps its running "
                "statistics equal across ranks): DDP on CPU raises 'SyncBatchNorm layers only work "
                "with GPU modules'")


def forward_failed(ctx: Any, exc: Exception, shape: Any, details: list[str],
                   data: dict[str, Any]) -> Any:
    """The FAIL outcome of a rank whose forward/backward on the model raised ``exc``."""
    if isinstance(exc, UsageError):
        return ctx.failed(exc.message, hint=exc.hint, finding=exc.reference, details=details, data=data)
    if "SyncBatchNorm" in str(exc) and ("GPU" in str(exc) or "cuda" in str(exc).lower()):
        return ctx.failed(f"{SYNC_BN_CAUSE}: {type(exc).__name__}: {exc}", hint=SYNC_BN_HINT,
                          finding="sync-batchnorm-needs-gpu", details=details, data=data)
    return ctx.failed(f"forward/backward on input {shape} raised {type(exc).__name__}: {exc}",
                      hint="pass the batch shape your model takes with --input-shape, "
                           "e.g. --input-shape 8,3,32,32",
                      finding="model-forward-failed", details=details, data=data)


def _note_reverted(ctx: Any, outcome: Outcome, reverted: Sequence[str]) -> Outcome:
    """Say that the SyncBatchNorm layers ran as plain BatchNorm: a PASS becomes a WARN."""
    layers = ", ".join(reverted[:4]) + (f" and {len(reverted) - 4} more" if len(reverted) > 4 else "")
    note = (f"{SYNC_BN_CAUSE}: on CPU, {count(len(reverted), 'SyncBatchNorm layer')} ({layers}) "
            "ran as plain BatchNorm")
    details = outcome.details + (f"{note}; {SYNC_BN_HINT}",)
    data = {**outcome.data, "sync_batchnorm_reverted": list(reverted)}
    if outcome.status == Status.PASS:
        return ctx.warned(f"{note}; otherwise {outcome.summary}", hint=SYNC_BN_HINT,
                          finding="sync-batchnorm-needs-gpu", details=details, data=data)
    if outcome.status == Status.SKIP:
        return replace(outcome, summary=f"{outcome.summary} ({note})", data=data)
    return replace(outcome, details=details, data=data)


class ModelCheck(Check):
    """Base of the checks that train a model under DDP on every rank (``param-sync``, ``bn-sync``).

    It loads the user's ``--model`` (or the built-in one) on every rank under a seed the subclass
    picks, and when loading fails on some ranks, every rank stops with the reason instead of waiting
    in the next collective. Subclasses implement :meth:`run_model`.
    """

    requires = Requirements(min_world_size=2, process_group=True)
    slow = True
    # No prepare(): importing torch._dynamo before the ranks fork cost as much as importing torch,
    # on the critical path; the checks build the real DDP without it (checks/ddp_eager.py).

    def seed(self, rank: int) -> int:
        """The seed the model is built under on ``rank``."""
        return 0

    def run(self, ctx: RankContext) -> Outcome:
        ctx.process_group()
        # The ranks vote after each step that may fail on some ranks only: the user's model (a
        # collective each). The built-in model builds and runs alike everywhere: no vote, which
        # every rank knows from the same options.
        vote = bool(ctx.options.get("model"))
        with torch.random.fork_rng(devices=[]):  # leave the worker's RNG as it was
            if ctx.device == "cpu":  # the CPU generator only: torch.manual_seed also queues a lazy
                torch.default_generator.manual_seed(self.seed(ctx.rank))  # seed per accelerator type
            else:
                torch.manual_seed(self.seed(ctx.rank))
            try:
                loaded = load_model(ctx.options)
            except UsageError as exc:
                if vote:
                    ranks_that_failed(False)
                return ctx.failed(exc.message, hint=exc.hint, finding=exc.reference)
            elsewhere = ranks_that_failed(True) if vote else []
            if elsewhere:
                return failed_elsewhere(ctx, elsewhere, "build the model")
            if ctx.device == "cpu":
                loaded.module, reverted = revert_sync_batchnorm(loaded.module)
                loaded.reverted = tuple(reverted)
            outcome = self.run_model(ctx, loaded)
            return _note_reverted(ctx, outcome, loaded.reverted) if loaded.reverted else outcome

    def run_model(self, ctx: RankContext, loaded: LoadedModel) -> Outcome:
        """Run the check on the loaded model (in train mode it is the caller's to set)."""
        raise NotImplementedError

    def find_unused(self, ctx: RankContext, model: nn.Module, loaded: LoadedModel, details: list[str],
                    data: dict[str, Any]) -> tuple[Optional[list[str]], Optional[Outcome]]:
        """(parameters that get no gradient in one forward/backward, None), or (None, the outcome
        that ends the check) when the forward failed on this rank or on another."""
        assert loaded.input_shape is not None
        vote = not loaded.builtin  # as in run(): the built-in model's forward runs alike everywhere
        try:
            unused = unused_parameters(model, rank_batch(loaded.input_shape, ctx.rank))
        except Exception as exc:  # noqa: BLE001 - the user's forward is theirs to fix
            if vote:
                ranks_that_failed(False)
            return None, forward_failed(ctx, exc, loaded.input_shape, details, data)
        elsewhere = ranks_that_failed(True) if vote else []
        if elsewhere:
            return None, failed_elsewhere(ctx, elsewhere, "run forward/backward")
        return unused, None

