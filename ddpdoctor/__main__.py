"""``python -m ddpdoctor`` (and ``torchrun -m ddpdoctor check``), and the ``ddpdoctor`` console script.

Signals are caught from the first line, before click, torch or anything slow is imported: a Ctrl-C or
SIGTERM that arrives while the command starts is kept and acted on as soon as the command can stop
cleanly (``check`` then prints what ran: nothing); a second one exits at once (130).
"""

from __future__ import annotations

import os
import signal

_PENDING: list = []


def _early(signum: int, frame: object) -> None:
    if _PENDING:
        os.write(2, b"\ninterrupted again: exiting now\n")
        os._exit(130)
    _PENDING.append(signum)


def main() -> None:
    """Entry point: keep signals from the start, then run the command line."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _early)
    from ddpdoctor.cli import main as cli_main

    try:
        cli_main(pending=_PENDING)
    finally:
        # The outcome is decided: a signal from here on can neither change the exit code nor kill the
        # interpreter's shutdown midway (which would end the process by the raw signal, not 130).
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                signal.signal(sig, signal.SIG_IGN)
            except (ValueError, OSError):
                pass


if __name__ == "__main__":
    main()
