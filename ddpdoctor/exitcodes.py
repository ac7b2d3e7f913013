"""Exit codes of the ``ddpdoctor`` command, in one place (documented in ``--help`` and docs/checks.md)."""

from __future__ import annotations

import enum

__all__ = ["ExitCode", "EXIT_CODE_HELP", "exit_code_help"]


class ExitCode(enum.IntEnum):
    """Process exit codes.

    OK: nothing worse than a warning (with ``--strict``: nothing worse than skip).
    CHECK_FAILED: a check failed, timed out or crashed; the job would fail.
    USAGE: the command line or the launcher environment is wrong; nothing was checked.
    INTERNAL: ddpdoctor itself broke; please report it.
    INTERRUPTED: Ctrl-C or SIGTERM; a partial report was printed.
    HUNG: ``ddpdoctor run`` found the job hung (no rank made progress for --hang-timeout seconds).
    OUTPUT_FAILED: standard output is full or failed (``>/dev/full``); the output stops there, quietly. Also
        ``--json`` not written (disk full) when the verdict was 0: the work ran, its report is missing.
    OUTPUT_CLOSED: standard output was closed by its reader (``| head -1``); as a shell reports SIGPIPE.
    """

    OK = 0
    CHECK_FAILED = 1
    USAGE = 2
    INTERNAL = 3
    OUTPUT_FAILED = 74
    HUNG = 124
    INTERRUPTED = 130
    OUTPUT_CLOSED = 141


EXIT_CODE_HELP = (
    "Exit codes: 0 nothing worse than a warning; 1 a check failed, timed out or crashed "
    "(--strict: or warned); 2 usage error; 3 internal error; 130 interrupted; "
    "141 standard output closed by its reader, 74 standard output full or failed (or --json not written); "
    "'run' exits with the job's own code, or 124 when the job hung."
)


_OUTPUT = ("141 standard output closed by its reader, 74 standard output full or failed (or --json not "
           "written)")


def exit_code_help(command: str) -> str:
    """The exit codes of one command, for its ``--help``: only what that command can return (``bench``
    has no ``--strict``; only ``run`` exits with the job's code)."""
    if command == "check":
        return ("Exit codes: 0 nothing worse than a warning; 1 a check failed, timed out or crashed "
                f"(--strict: or warned); 2 usage error; 3 internal error; 130 interrupted; {_OUTPUT}.")
    if command == "locate":
        return ("Exit codes: 0 no node is dead or below --min-busbw (slow suspects are warnings); 1 a node is "
                f"silent or below --min-busbw, or a check failed; 2 usage error; 3 internal error; "
                f"130 interrupted; {_OUTPUT}.")
    if command == "bench":
        return ("Exit codes: 0 every row measured and exact; 1 a collective returned a wrong result, timed out "
                f"or crashed; 2 usage error; 3 internal error; 130 interrupted; {_OUTPUT}.")
    if command == "run":
        return ("Exit codes: the job's own code; 124 the job hung (no rank progressed for --hang-timeout); "
                "130 interrupted (0 when the job then exited 0 by itself); 2 usage error; 3 internal error.")
    raise ValueError(f"no exit-code help for {command!r}; use one of check, locate, bench, run")
