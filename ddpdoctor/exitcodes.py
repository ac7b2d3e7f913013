"""Exit codes of the ``ddpdoctor`` command, in one place (documented in ``--help`` and docs/checks.md)."""

from __future__ import annotations

import enum

__all__ = ["ExitCode"]


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
