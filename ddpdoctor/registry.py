"""Finding checks by name: the built-in list, ``--only``/``--skip`` selection, and good errors."""

from __future__ import annotations

import difflib
from typing import Iterable, Optional, Sequence

from .check import Check
from .errors import UsageError

__all__ = ["all_checks", "select_checks"]


def all_checks() -> list[type[Check]]:
    """Every built-in check class, in run order (slow ones last)."""
    from .checks import ALL

    fast = [c for c in ALL if not c.slow]
    slow = [c for c in ALL if c.slow]
    return fast + slow


def _names(raw: Optional[Iterable[str]]) -> list[str]:
    out: list[str] = []
    for item in raw or ():
        out.extend(n.strip() for n in item.split(",") if n.strip())
    return out


def select_checks(only: Optional[Sequence[str]] = None, skip: Optional[Sequence[str]] = None) -> list[Check]:
    """Instances of the selected checks, in run order.

    Raises:
        UsageError: a name that is not a check, naming it, the closest name and ``ddpdoctor list``.
    """
    known = {c.name: c for c in all_checks()}
    wanted, unwanted = _names(only), _names(skip)
    for name in wanted + unwanted:
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise UsageError("unknown-check", f"no check named '{name}'",
                             f"{hint}run 'ddpdoctor list' for the names")
    chosen = [c for name, c in known.items() if (not wanted or name in wanted) and name not in unwanted]
    if not chosen:
        raise UsageError("no-checks", "--only/--skip left no check to run", "run 'ddpdoctor list' for the names")
    return [c() for c in chosen]
