"""ddpdoctor: diagnostics and debugging for PyTorch distributed training.

The check runner lives behind the ``ddpdoctor`` command (:mod:`ddpdoctor.cli`); this package's
top level exports the library that training code imports.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
