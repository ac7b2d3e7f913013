"""The built-in checks, one module each, in the order they run (slow ones last).

Installed as ``ddpdoctor.checks``. Add a check by writing a module with a
:class:`ddpdoctor.check.Check` subclass and listing it in ``ALL`` below.
"""

from __future__ import annotations

from .bn_sync import BnSyncCheck
from .collectives import CollectivesBenchCheck, CollectivesCheck
from .env import EnvCheck
from .locate import LocateCheck
from .param_sync import ParamSyncCheck
from .port import PortCheck
from .process_group import ProcessGroupCheck
from .sampler import SamplerCheck

__all__ = ["ALL", "BnSyncCheck", "CollectivesBenchCheck", "CollectivesCheck", "EnvCheck", "LocateCheck",
           "ParamSyncCheck", "PortCheck", "ProcessGroupCheck", "SamplerCheck"]

ALL = (EnvCheck, PortCheck, ProcessGroupCheck, CollectivesCheck, SamplerCheck, ParamSyncCheck, BnSyncCheck,
       CollectivesBenchCheck, LocateCheck)
