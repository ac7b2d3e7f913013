"""The peers' exception classes for a mismatch that ddpdoctor's agreement step found on every rank.

A peer raises a built-in (``TypeError`` for a string in accelerate's ``gather``) on the rank whose
input is bad, and hangs the others. ddpdoctor raises :class:`CollectiveMismatchError` on every rank;
here that error also becomes an instance of the built-in the peer raises, so ``except TypeError``
written for the peer still catches it, on every rank.
"""

from __future__ import annotations

import re
from typing import Any, Callable, TypeVar

from ddpdoctor.training import CollectiveMismatchError

__all__ = ["CollectiveTypeError", "CollectiveValueError", "as_builtin"]

T = TypeVar("T")


class CollectiveTypeError(CollectiveMismatchError, TypeError):
    """Some rank passed a value of the wrong type; raised alike on every rank."""


class CollectiveValueError(CollectiveMismatchError, ValueError):
    """Some rank passed a bad value; raised alike on every rank."""


_BUILTINS = {"TypeError": CollectiveTypeError, "ValueError": CollectiveValueError}


def as_builtin(call: Callable[[], T]) -> T:
    """Run ``call``; a mismatch whose every bad rank failed with one built-in re-raises as that built-in too.

    The agreement step's message lists each bad rank as ``rank N: TypeError: ...`` and is the same
    on every rank, so every rank picks the same class.
    """
    try:
        return call()
    except CollectiveMismatchError as exc:
        if type(exc) is not CollectiveMismatchError:
            raise
        kinds = set(re.findall(r"rank \d+: (\w+): ", exc.message))
        cls: Any = _BUILTINS.get(kinds.pop()) if len(kinds) == 1 and exc.reference == "collective-input" else None
        if cls is None:
            raise
        raise cls(exc.reference, exc.message, exc.hint) from None
