"""Seeing through the wrappers training code puts around a model."""

from __future__ import annotations

import torch

__all__ = ["unwrap_module"]

_WRAPPERS = ("DistributedDataParallel", "DataParallel")


def unwrap_module(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DistributedDataParallel/DataParallel wrapper, or ``module`` itself.

    Names, not classes, are compared so that no wrapper module has to be imported to ask.
    """
    inner = getattr(module, "module", None)
    if isinstance(inner, torch.nn.Module) and type(module).__name__ in _WRAPPERS:
        return inner
    return module
