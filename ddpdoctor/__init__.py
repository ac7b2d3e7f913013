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
_EXPORTS = {
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
