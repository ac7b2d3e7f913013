"""``python -m ddpdoctor`` (and ``torchrun -m ddpdoctor check``), and the ``ddpdoctor`` console script.

Signals are caught from the first line, before click, torch or anything slow is imported: a Ctrl-C or
SIGTERM that arrives while the command starts is kept and acted on as soon as the command can stop
cleanly (``check`` then prints what ran: nothing); a second one exits at once (130).

Standard output and error are made safe next (:mod:`ddpdoctor.system.streams`): closed at start, they
behave as ``/dev/null`` (the command still does its work, writes ``--json`` and returns its verdict's
code); text they cannot encode is written escaped instead of ending the command.
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
    import sys

    from ddpdoctor.system.streams import safe_stderr, safe_stdout

    sys.stdout, sys.stderr = safe_stdout(), safe_stderr()
    from ddpdoctor.cli import main as cli_main

    try:
        cli_main(pending=_PENDING)
    except SystemExit as done:
        code = done.code
    else:
        code = 0
    finally:
        # The outcome is decided: a signal from here on can neither change the exit code nor kill the
        # interpreter's shutdown midway (which would end the process by the raw signal, not 130).
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                signal.signal(sig, signal.SIG_IGN)
            except (ValueError, OSError):
                pass
    finish(code)


def finish(code: object) -> None:
    """Exit with ``code`` (as ``sys.exit`` would), without the interpreter's teardown: the exit
    handlers run and the output is flushed, then the process ends. Freeing every object of torch's
    modules took 0.3-0.7 s on a 2-core machine after the report was printed (``check``), and
    ``run``'s own teardown 25 ms after the job ended. A command that left a non-daemon thread
    running ends the usual way, which waits for it."""
    import sys
    import threading

    if any(t is not threading.main_thread() and t.is_alive() and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    import atexit

    status = code if isinstance(code, int) else (0 if code is None else 1)
    try:
        if not isinstance(code, int) and code is not None:
            print(code, file=sys.stderr)
        atexit._run_exitfuncs()  # what the teardown would run first (logging's flush included)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:  # None: started with that descriptor closed (>&-)
                    stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more to say
                pass
        os._exit(status)


if __name__ == "__main__":
    main()
