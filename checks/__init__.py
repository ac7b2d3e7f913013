"""The built-in checks, one module each, in the order they run (slow ones last).

Installed as ``ddpdoctor.checks``. Add a check by writing a module with a
:class:`ddpdoctor.check.Check` subclass and listing it in ``ALL`` below.
"""

from __future__ import annotations

from .collectives import CollectivesBenchCheck, CollectivesCheck
from .env import EnvCheck
from .port import PortCheck
from .process_group import ProcessGroupCheck

__all__ = ["ALL", "CollectivesBenchCheck", "CollectivesCheck", "EnvCheck", "PortCheck", "ProcessGroupCheck"]

ALL = (EnvCheck, PortCheck, ProcessGroupCheck, CollectivesCheck, CollectivesBenchCheck)
