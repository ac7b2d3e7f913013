"""The progress interface: the runner calls it as checks start and end; the terminal report implements it."""

from __future__ import annotations

from ddpdoctor.check import WorldInfo
from ddpdoctor.result import CheckResult

__all__ = ["Progress"]

class Progress:
    """Receives check start/end events (the terminal report shows progress through this)."""

    def greeted(self, world: WorldInfo) -> None:  # pragma: no cover - interface
        pass

    def started(self, name: str) -> None:  # pragma: no cover - interface
        pass

    def finished(self, result: CheckResult) -> None:  # pragma: no cover - interface
        pass

    def measured(self, name: str, item: object) -> None:  # pragma: no cover - interface
        """Something check ``name`` measured while it runs (:meth:`ddpdoctor.check.Check.measured`)."""
