"""Deprecated alias of :mod:`ddpdoctor.training` (the library's package was named ``dist`` until 0.1).

``dist`` is the one name packaging tools and ignore templates treat as build output, so the package is
now ``ddpdoctor.training``. ``import ddpdoctor.dist`` and ``from ddpdoctor.dist.gathering import
gather`` keep working for one release, with a ``DeprecationWarning``: each ``ddpdoctor.dist.X`` is the
same module object as ``ddpdoctor.training.X`` (same classes, same state), not a copy.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

from ddpdoctor.training import *  # noqa: F401,F403  (the alias re-exports the library)
from ddpdoctor.training import __all__  # noqa: F401

warnings.warn(
    "ddpdoctor.dist is renamed ddpdoctor.training; import ddpdoctor.training (or simply "
    "'import ddpdoctor as dd'): the alias goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)

_OLD, _NEW = __name__ + ".", "ddpdoctor.training."
__path__: list[str] = []  # a package, so that ``ddpdoctor.dist.<module>`` reaches the finder below


class _AliasLoader(importlib.abc.Loader):
    """Hands out the already-imported ``ddpdoctor.training`` module under the old name."""

    def __init__(self, target: ModuleType) -> None:
        self.target = target
        self.target_spec = target.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.target

    def exec_module(self, module: ModuleType) -> None:
        # the import system stamped the alias's spec on the shared module object: give it its own back
        module.__spec__ = self.target_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``ddpdoctor.dist.<sub>`` to ``ddpdoctor.training.<sub>``."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 (the finder protocol)
        if not fullname.startswith(_OLD):
            return None
        real = importlib.import_module(_NEW + fullname[len(_OLD):])
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real), is_package=hasattr(real, "__path__"))


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())
