"""ddpdoctor: diagnostics and debugging for PyTorch distributed training.

The check runner lives behind the ``ddpdoctor`` command (:mod:`ddpdoctor.cli`); this package's
top level exports the library that training code imports. Names load on first use, so that
``import ddpdoctor`` (and the CLI's start) stays cheap until a helper is actually needed.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_LIBRARY = (
    "get_rank", "get_world_size", "get_local_rank", "get_local_world_size", "get_node_rank", "is_distributed",
    "is_main_process", "is_rank_zero", "rank_info", "rank_device", "RankInfo", "RankConflictWarning", "NotInitializedError",
    "barrier", "wait_for_everyone", "synchronize", "zero_first", "main_process_first", "rank_zero_first",
    "rank_zero_only", "print0", "rank_zero_print", "seed_everything", "broadcast_object", "ZeroFirstError",
    "BarrierTimeoutError", "gather", "all_gather", "gather_object", "gather_for_metrics", "collect_results",
    "reduce_dict", "all_reduce_mean", "CollectiveMismatchError", "load_checkpoint", "CheckpointError",
    "worker_init_fn", "gather_all_tensors", "pad_across_processes", "reduce", "all_reduce_params",
    "CollectiveTimeoutError", "DEFAULT_TIMEOUT", "exit_now",
)
_EXPORTS = {name: "ddpdoctor.training" for name in _LIBRARY}
_EXPORTS |= {
    name: "ddpdoctor.diagnostics"
    for name in (
        "DesyncError", "SamplerEpochWarning", "SamplerMismatchWarning", "SamplerWarning", "TensorMismatch",
        "assert_in_sync", "bn_divergence", "guard_sampler", "sync_bn_stats",
    )
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ddpdoctor' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
