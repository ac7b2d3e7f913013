"""BatchNorm running statistics under DDP: measure how far ranks drift apart, and make them agree.

DDP keeps parameters identical, but a BatchNorm layer updates ``running_mean`` and ``running_var``
from the rank's own batch in every training forward, so the ranks' statistics drift apart. With DDP's
buffer broadcast on (``broadcast_buffers=True``, the default; ``forward_sync_buffers`` in the torch
versions that name it so) rank 0's buffers are broadcast at the start of the next forward through the
DDP model, training or evaluation: the ranks differ by one update after a step, and an evaluation
through the wrapper sees equal statistics. The drift survives wherever no such forward comes first:
evaluation through ``model.module`` (which skips the broadcast: each rank evaluates with the statistics
its own last batches left), a checkpoint of ``model.module.state_dict()`` taken on each rank, the
broadcast turned off (``broadcast_buffers=False``), or no DDP at all (``ddpdoctor run``'s ``bn-drift``
watch names these in an unchanged job). ``torch.nn.SyncBatchNorm`` fixes this on GPUs; :func:`sync_bn_stats`
works everywhere, CPU and gloo included, and is cheap enough to call before every evaluation and checkpoint.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

import torch

from ddpdoctor.diagnostics.wrapped import unwrap_module

__all__ = ["bn_divergence", "sync_bn_stats", "batchnorm_layers", "revert_sync_batchnorm", "AnyBatchNorm"]

log = logging.getLogger(__name__)


def batchnorm_layers(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.modules.batchnorm._NormBase]]:
    """Every BatchNorm layer (SyncBatchNorm included) that tracks running statistics, by name."""
    for name, layer in unwrap_module(module).named_modules():
        if (isinstance(layer, torch.nn.modules.batchnorm._NormBase)
                and not isinstance(layer, torch.nn.modules.instancenorm._InstanceNorm)
                and layer.running_mean is not None and layer.running_var is not None):
            yield name or "<root>", layer


class AnyBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Plain BatchNorm for inputs of any rank >= 2: what a SyncBatchNorm layer computes on one process."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")


def revert_sync_batchnorm(module: torch.nn.Module) -> tuple[torch.nn.Module, list[str]]:
    """Replace every ``SyncBatchNorm`` layer by a plain BatchNorm that shares its parameters and buffers.

    SyncBatchNorm only runs on GPUs (under DDP on CPU it raises "SyncBatchNorm layers only work with
    GPU modules"); this is the inverse of ``SyncBatchNorm.convert_sync_batchnorm`` for a CPU run.

    Returns:
        The module (the same object unless it is itself a SyncBatchNorm) and the names of the
        replaced layers.
    """
    names: list[str] = []

    def convert(layer: torch.nn.Module, prefix: str) -> torch.nn.Module:
        if isinstance(layer, torch.nn.SyncBatchNorm):
            plain = AnyBatchNorm(layer.num_features, layer.eps, layer.momentum, layer.affine,
                                 layer.track_running_stats)
            if layer.affine:
                plain.weight, plain.bias = layer.weight, layer.bias
            plain.running_mean, plain.running_var = layer.running_mean, layer.running_var
            plain.num_batches_tracked = layer.num_batches_tracked
            plain.train(layer.training)
            names.append(prefix or "<root>")
            return plain
        for name, child in list(layer.named_children()):
            layer._modules[name] = convert(child, f"{prefix}.{name}" if prefix else name)
        return layer

    return convert(module, ""), names


def _world(group: Any) -> int:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def _comm_device(group: Any, fallback: torch.device) -> torch.device:
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return fallback if fallback.type == "cpu" else torch.device("cpu")


def bn_divergence(module: torch.nn.Module, *, group: Any = None) -> dict[str, float]:
    """For every BatchNorm layer, the largest divergence of its running statistics across ranks.

    A collective: call it on every rank. All layers travel in one ``all_reduce(MAX)`` of
    ``[stats, -stats]`` in float64; the divergence of a layer is the largest ``max - min`` over the
    elements of its ``running_mean`` and ``running_var``.

    Args:
        module: the model; a DistributedDataParallel wrapper is looked through.
        group: the process group; the default group when None.

    Returns:
        ``{layer name: divergence}`` in module order, identical on every rank; all zeros without a
        process group or with one rank.
    """
    import torch.distributed as dist

    layers = list(batchnorm_layers(module))
    if not layers:
        return {}
    if _world(group) < 2:
        return {name: 0.0 for name, _ in layers}
    device = _comm_device(group, layers[0][1].running_mean.device)
    stats = torch.cat([torch.cat([bn.running_mean.detach().reshape(-1), bn.running_var.detach().reshape(-1)])
                       .to(device=device, dtype=torch.float64) for _, bn in layers])
    both = torch.cat([stats, -stats])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    spread = (both[: stats.numel()] + both[stats.numel():]).cpu()
    result: dict[str, float] = {}
    offset = 0
    for name, bn in layers:
        size = bn.running_mean.numel() + bn.running_var.numel()
        part = spread[offset:offset + size]
        result[name] = float(part.max()) if size else 0.0
        offset += size
    return result


def sync_bn_stats(module: torch.nn.Module, *, group: Any = None) -> list[str]:
    """Make every rank's BatchNorm running statistics equal, in place.

    The new mean is the mean of the ranks' means; the new variance is pooled as if every rank saw
    the same number of samples: the mean of the variances plus the variance of the means
    (``mean(var_r) + mean(mean_r**2) - mean(mean_r)**2``). ``num_batches_tracked`` is left alone.
    One ``all_reduce(SUM)`` in float64 for all layers; every rank ends with bitwise-equal
    statistics. Works on CPU with gloo, where ``torch.nn.SyncBatchNorm`` cannot run. A collective:
    call it on every rank, typically before evaluation and before saving a checkpoint.

    Args:
        module: the model; a DistributedDataParallel wrapper is looked through.
        group: the process group; the default group when None.

    Returns:
        The names of the layers synchronized (empty without a process group or with one rank).
    """
    import torch.distributed as dist

    layers = list(batchnorm_layers(module))
    world = _world(group)
    if not layers or world < 2:
        return []
    device = _comm_device(group, layers[0][1].running_mean.device)
    parts = []
    for _, bn in layers:
        mean = bn.running_mean.detach().reshape(-1).to(device=device, dtype=torch.float64)
        var = bn.running_var.detach().reshape(-1).to(device=device, dtype=torch.float64)
        parts.append(torch.cat([mean, var, mean * mean]))
    flat = torch.cat(parts)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    flat /= world
    offset = 0
    with torch.no_grad():
        for _, bn in layers:
            n = bn.running_mean.numel()
            mean, var, sq = (flat[offset + i * n:offset + (i + 1) * n] for i in range(3))
            pooled = (var + (sq - mean * mean).clamp_min(0.0)).reshape(bn.running_var.shape)
            bn.running_mean.copy_(mean.reshape(bn.running_mean.shape))
            bn.running_var.copy_(pooled)
            offset += 3 * n
    names = [name for name, _ in layers]
    log.debug("sync_bn_stats: synchronized %s BatchNorm layers over %s ranks", len(names), world)
    return names
