"""Finding checks by name: the built-in list, ``--only``/``--skip`` selection, and good errors."""

from __future__ import annotations

import difflib
import importlib
import os
from typing import Iterable, Mapping, Optional, Sequence

from ddpdoctor.check import Check
from ddpdoctor.errors import UsageError

__all__ = ["all_checks", "select_checks"]


PLUGINS_VAR = "DDPDOCTOR_PLUGINS"


def plugin_checks(environ: Optional[Mapping[str, str]] = None) -> list[type[Check]]:
    """Checks from the modules named in ``DDPDOCTOR_PLUGINS`` (comma-separated), each of which
    defines ``CHECKS = [CheckSubclass, ...]``: site-specific checks run like the built-in ones.

    Raises:
        UsageError: a module that does not import or has no ``CHECKS`` list, naming it.
    """
    env = os.environ if environ is None else environ
    out: list[type[Check]] = []
    for name in filter(None, (n.strip() for n in env.get(PLUGINS_VAR, "").split(","))):
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise UsageError("bad-plugin", f"{PLUGINS_VAR}: cannot import {name!r} ({type(exc).__name__}: {exc})",
                             f"fix the module or remove it from {PLUGINS_VAR}") from None
        checks = getattr(module, "CHECKS", None)
        if not isinstance(checks, (list, tuple)) or not all(isinstance(c, type) and issubclass(c, Check)
                                                            for c in checks):
            raise UsageError("bad-plugin", f"{PLUGINS_VAR}: module {name!r} has no CHECKS list of Check classes",
                             "define CHECKS = [YourCheck] in it")
        out.extend(checks)
    return out


def all_checks() -> list[type[Check]]:
    """Every check class (built-in, then plugins), in run order (slow ones last)."""
    from ddpdoctor.checks import ALL

    every = list(ALL)
    names = {c.name for c in every}
    for c in plugin_checks():
        if c.name in names:
            raise UsageError("duplicate-check", f"plugin check {c.name!r} has the name of another check",
                             "rename the plugin's check")
        names.add(c.name)
        every.append(c)
    fast = [c for c in every if not c.slow]
    slow = [c for c in every if c.slow]
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
    chosen = [c for name, c in known.items()
              if (name in wanted if wanted else not c.on_request) and name not in unwanted]
    if not chosen:
        raise UsageError("no-checks", "--only/--skip left no check to run", "run 'ddpdoctor list' for the names")
    return [c() for c in chosen]
