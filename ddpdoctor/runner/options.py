"""What a run of the checks is asked to do and what it produced, shared by the local and joined worlds."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ddpdoctor.report.document import RunReport

__all__ = ["RunOptions", "RunOutcome", "Interrupted", "terminate_as_interrupt"]

class Interrupted(BaseException):
    """SIGTERM (or SIGINT) reached the supervising process."""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signame = signame



@dataclass
class RunOptions:
    """What ``ddpdoctor check`` was asked to do (defaults match the CLI's)."""

    nproc: Optional[int] = None
    backend: Optional[str] = None
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    only: Sequence[str] = ()
    skip: Sequence[str] = ()
    timeout: float = 30.0
    mode: str = "auto"  # auto | local | join
    strict: bool = False
    options: dict = field(default_factory=dict)



@dataclass
class RunOutcome:
    """What a run produced here: the report (on the reporting process) and the exit code."""

    report: Optional[RunReport]
    exit_code: int
    message: str = ""



class terminate_as_interrupt:
    """Within the block, SIGTERM raises :class:`Interrupted` (Ctrl-C raises KeyboardInterrupt)."""

    def __enter__(self) -> None:
        self.previous = signal.getsignal(signal.SIGTERM)

        def handler(signum: int, frame: Any) -> None:
            raise Interrupted("SIGTERM")

        try:
            signal.signal(signal.SIGTERM, handler)
        except ValueError:  # not the main thread
            self.previous = None

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
