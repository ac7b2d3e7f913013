"""Errors that reach the user as one line: what is wrong, the bad value, and the fix."""

from __future__ import annotations

from ddpdoctor.exitcodes import ExitCode

__all__ = ["DdpdoctorError", "UsageError", "LauncherError"]


class DdpdoctorError(Exception):
    """An error with a stable kebab-case reference, a message and a hint.

    Args:
        reference: stable id, e.g. ``bad-rank``.
        message: what is wrong, naming the bad value.
        hint: the imperative fix.
    """

    exit_code = ExitCode.INTERNAL

    def __init__(self, reference: str, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.reference = reference
        self.message = message
        self.hint = hint

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Errors cross process boundaries (worlds, workers); rebuild them with all three fields.
        return (type(self), (self.reference, self.message, self.hint))

    def one_line(self) -> str:
        text = f"error[{self.reference}]: {self.message}"
        if self.hint:
            text += f"; {self.hint}"
        return text


class UsageError(DdpdoctorError):
    """The command line is wrong (exit 2)."""

    exit_code = ExitCode.USAGE


class LauncherError(UsageError):
    """The launcher's environment (RANK, WORLD_SIZE, SLURM_*, OMPI_*) is inconsistent (exit 2)."""
