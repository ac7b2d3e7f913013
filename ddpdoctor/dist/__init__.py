"""The library that training code imports: ``from ddpdoctor import get_rank, zero_first, gather``.

Ranks and devices (:mod:`.ranks`), launcher detection (:mod:`.launcher`), ordering between ranks such
as ``zero_first`` and barriers (:mod:`.ordering`), gathers and reductions (:mod:`.gathering`) and
checkpoint loading (:mod:`.loading`). This package's ``__all__`` is the public library;
``ddpdoctor/__init__.py`` re-exports it.

May import: ``ddpdoctor.system`` and the shared bottom (``errors``, ``exitcodes``) only.
"""

from __future__ import annotations

from ddpdoctor.dist.gathering import (CollectiveMismatchError, all_gather, all_reduce_mean, collect_results, gather,
                                      gather_for_metrics, gather_object, reduce_dict)
from ddpdoctor.dist.loading import CheckpointError, load_checkpoint
from ddpdoctor.dist.ordering import (BarrierTimeoutError, ZeroFirstError, barrier, broadcast_object,
                                     main_process_first, print0, rank_zero_first, rank_zero_only, rank_zero_print,
                                     seed_everything, synchronize, wait_for_everyone, zero_first)
from ddpdoctor.dist.ranks import (NotInitializedError, RankConflictWarning, RankInfo, get_local_rank,
                                  get_local_world_size, get_node_rank, get_rank, get_world_size, is_distributed,
                                  is_main_process, rank_device, rank_info)

__all__ = [
    # ranks
    "get_rank", "get_world_size", "get_local_rank", "get_local_world_size", "get_node_rank",
    "is_distributed", "is_main_process", "rank_info", "rank_device", "RankInfo", "RankConflictWarning",
    "NotInitializedError",
    # coordination
    "barrier", "wait_for_everyone", "synchronize", "zero_first", "main_process_first", "rank_zero_first",
    "rank_zero_only", "print0", "rank_zero_print", "seed_everything", "broadcast_object",
    "ZeroFirstError", "BarrierTimeoutError",
    # gathering
    "gather", "all_gather", "gather_object", "gather_for_metrics", "collect_results", "reduce_dict",
    "all_reduce_mean", "CollectiveMismatchError",
    # loading
    "load_checkpoint", "CheckpointError",
]
