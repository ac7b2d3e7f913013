"""The library that training code imports: ``from ddpdoctor import get_rank, zero_first, gather``.

Ranks and devices (:mod:`.ranks`), launcher detection (:mod:`.launcher`), ordering between ranks such
as ``zero_first`` and barriers (:mod:`.ordering`), gathers and reductions (:mod:`.gathering`) and
checkpoint loading (:mod:`.loading`) and the end of the process (:mod:`.teardown`). This package's ``__all__`` is the public library;
``ddpdoctor/__init__.py`` re-exports it.

May import: ``ddpdoctor.system`` and the shared bottom (``errors``, ``exitcodes``) only.
"""

from __future__ import annotations

from ddpdoctor.training.agreement import DEFAULT_TIMEOUT, CollectiveMismatchError, CollectiveTimeoutError
from ddpdoctor.training.gathering import (all_gather, all_reduce_mean, all_reduce_params, broadcast_object,
                                      collect_results, gather, gather_all_tensors, gather_for_metrics, gather_object,
                                      pad_across_processes, reduce, reduce_dict)
from ddpdoctor.training.loading import CheckpointError, load_checkpoint
from ddpdoctor.training.ordering import (BarrierTimeoutError, ZeroFirstError, barrier, main_process_first, print0,
                                     rank_zero_first, rank_zero_only, rank_zero_print, seed_everything, synchronize,
                                     wait_for_everyone, worker_init_fn, zero_first)
from ddpdoctor.training.teardown import exit_now
from ddpdoctor.training.ranks import (NotInitializedError, RankConflictWarning, RankInfo, get_local_rank,
                                  get_local_world_size, get_node_rank, get_rank, get_world_size, is_distributed,
                                  is_main_process, is_rank_zero, rank_device, rank_info)

__all__ = [
    # ranks
    "get_rank", "get_world_size", "get_local_rank", "get_local_world_size", "get_node_rank",
    "is_distributed", "is_main_process", "is_rank_zero", "rank_info", "rank_device", "RankInfo", "RankConflictWarning",
    "NotInitializedError",
    # coordination
    "barrier", "wait_for_everyone", "synchronize", "zero_first", "main_process_first", "rank_zero_first",
    "rank_zero_only", "print0", "rank_zero_print", "seed_everything", "worker_init_fn",
    "ZeroFirstError", "BarrierTimeoutError",
    # gathering and reductions (each takes group= and timeout=)
    "gather", "all_gather", "gather_object", "gather_all_tensors", "broadcast_object", "gather_for_metrics",
    "collect_results", "pad_across_processes", "reduce", "reduce_dict", "all_reduce_mean", "all_reduce_params",
    "CollectiveMismatchError", "CollectiveTimeoutError", "DEFAULT_TIMEOUT",
    # loading
    "load_checkpoint", "CheckpointError",
    # the end of the process
    "exit_now",
]
