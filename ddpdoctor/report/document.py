"""The run's report as a document: every check's merged result, the world, the exit code; JSON schema 1."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ddpdoctor import __version__
from ddpdoctor.check import WorldInfo
from ddpdoctor.exitcodes import ExitCode
from ddpdoctor.result import CheckResult, Status

__all__ = ["RunReport", "SCHEMA"]

SCHEMA = 1



@dataclass(frozen=True)
class RunReport:
    """One run over every rank: the world and one result per check."""

    world: WorldInfo
    results: tuple[CheckResult, ...]
    duration: float = 0.0
    interrupted: Optional[str] = None
    started: float = field(default_factory=time.time)
    #: every world the checks ran in, when there were several (``world`` is the first)
    worlds: tuple[WorldInfo, ...] = ()

    @property
    def status(self) -> Status:
        return max((r.status for r in self.results), default=Status.PASS)

    def exit_code(self, strict: bool = False) -> ExitCode:
        if self.interrupted:
            return ExitCode.INTERRUPTED
        worst = self.status
        if worst.is_failure or (strict and worst == Status.WARN):
            return ExitCode.CHECK_FAILED
        return ExitCode.OK

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status.label] = out.get(r.status.label, 0) + 1
        return out

    def to_dict(self, strict: bool = False) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tool": {"name": "ddpdoctor", "version": __version__},
            "status": self.status.label,
            "exit_code": int(self.exit_code(strict)),
            "interrupted": self.interrupted,
            "started": round(self.started, 3),
            "duration": round(self.duration, 4),
            "world": self.world.to_dict(),
            "worlds": [w.to_dict() for w in self.worlds or (self.world,)],
            "counts": self.counts(),
            "checks": [r.to_dict() for r in self.results],
        }

    def write_json(self, path: str, strict: bool = False) -> None:
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(strict), f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
