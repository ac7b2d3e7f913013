"""Helpers for the training-pitfall tests: load a check module by path, run a check on a rank.

``checks/__init__.py`` imports every check of the package, and ``ddpdoctor.checks`` may resolve to
another checkout in an editable install, so these tests load the one check module they exercise
from this checkout's ``checks/`` directory by file path. The check modules import only from
``ddpdoctor.*``, so this is the same code the runner imports as ``ddpdoctor.checks.<name>``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Mapping, Optional

import torch._dynamo  # noqa: F401 - DDP imports it on first use; once here, not in every forked rank

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_check_module(name: str) -> ModuleType:
    """Import ``checks/<name>.py`` of this checkout under a private module name."""
    key = f"_ddpdoctor_diag_checks_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, os.path.join(ROOT, "checks", f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def rank_context(rank: int, world_size: int, options: Optional[Mapping[str, Any]] = None,
                 store: Any = None) -> Any:
    """A RankContext as the runner builds it, for a rank of a run_world world."""
    import torch.distributed as dist

    from ddpdoctor.check import RankContext

    if store is None and dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
    return RankContext(rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size,
                       node_rank=0, backend="gloo", timeout=30.0, store=store, options=options)


def world_info(world_size: int, options: Optional[Mapping[str, Any]] = None) -> Any:
    from ddpdoctor.check import WorldInfo

    return WorldInfo(world_size=world_size, backend="gloo", options=dict(options or {}))
