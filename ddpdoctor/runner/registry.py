"""Finding checks by name: the built-in list, ``--only``/``--skip`` selection, and good errors."""

from __future__ import annotations

import difflib
import importlib
import os
import traceback
from typing import Iterable, Mapping, Optional, Sequence

from ddpdoctor.check import Check, RankContext
from ddpdoctor.errors import UsageError
from ddpdoctor.result import Outcome, Status
from ddpdoctor.runner.options import Interrupted
from ddpdoctor.system.redact import safe_text

__all__ = ["all_checks", "select_checks", "plugin_checks", "unloaded_plugins"]


PLUGINS_VAR = "DDPDOCTOR_PLUGINS"


def plugin_checks(environ: Optional[Mapping[str, str]] = None) -> list[type[Check]]:
    """Checks from the modules named in ``DDPDOCTOR_PLUGINS`` (comma-separated), each of which
    defines ``CHECKS = [CheckSubclass, ...]``: site-specific checks run like the built-in ones.

    A module that does not load (it raises, calls ``sys.exit`` even with 0, or has no ``CHECKS`` list)
    stands as a check named ``plugin:MODULE`` whose result is CRASH, saying why: a pre-flight gate
    never passes with a site check missing. Ctrl-C during the import still interrupts.
    """
    env = os.environ if environ is None else environ
    out: list[type[Check]] = []
    for name in filter(None, (n.strip() for n in env.get(PLUGINS_VAR, "").split(","))):
        if name in _UNLOADED:
            out.append(_UNLOADED[name])
            continue
        try:
            module = importlib.import_module(name)
        except (KeyboardInterrupt, Interrupted):
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: a plugin cannot end the run
            out.append(_unloaded(name, _load_error(exc), _plugin_traceback(exc)))
            continue
        checks = getattr(module, "CHECKS", None)
        if not isinstance(checks, (list, tuple)) or not all(isinstance(c, type) and issubclass(c, Check)
                                                            for c in checks):
            out.append(_unloaded(name, "has no CHECKS list of Check classes (define CHECKS = [YourCheck])", ()))
            continue
        out.extend(checks)
    return out


_UNLOADED: dict = {}  # module name -> its stand-in: imported once, whatever the number of look-ups


def _load_error(exc: BaseException) -> str:
    from ddpdoctor.runner.worker import raised_at

    where = raised_at(exc)
    what = (f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit)
            else f"raised {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
    return what.rstrip(": ") + (f" ({where})" if where else "") + " while it was imported"


def _plugin_traceback(exc: BaseException) -> tuple:
    """The traceback from the plugin's own frames (the import machinery's are left out)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<frozen") and "importlib" not in f.filename and f.filename != __file__]
    text = "".join(traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc))
    return ("Traceback (most recent call last):", *text.rstrip().splitlines()[-25:])


def _unloaded(module: str, why: str, details: Sequence[str]) -> type[Check]:
    """The stand-in check of a plugin module that did not load: CRASH on every rank, with the reason."""
    shown = safe_text(module)
    summary = safe_text(f"site plugin {module!r} ({PLUGINS_VAR}) {why}")

    class PluginNotLoaded(Check):
        name = f"plugin:{shown}"
        description = summary

        def run(self, ctx: RankContext) -> Outcome:
            return Outcome(ctx.rank, Status.CRASH, summary, finding="plugin-not-loaded",
                           hint=f"fix the module or remove it from {PLUGINS_VAR}; its checks did not run",
                           details=tuple(safe_text(d) for d in details), data={"module": shown})

    PluginNotLoaded.__qualname__ = f"PluginNotLoaded[{shown}]"
    _UNLOADED[module] = PluginNotLoaded
    return PluginNotLoaded


def unloaded_plugins(checks: Iterable[type[Check]]) -> list[str]:
    """The names of the stand-ins among ``checks`` (plugins that did not load)."""
    return [c.name for c in checks if c in _UNLOADED.values()]


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


def select_checks(only: Optional[Sequence[str]] = None, skip: Optional[Sequence[str]] = None,
                  broken_plugins: bool = True) -> list[Check]:
    """Instances of the selected checks, in run order. A plugin that did not load (``plugin:MODULE``) is
    selected whatever ``--only`` says, unless ``--skip`` names it: its CRASH is the run's result
    (``broken_plugins=False``: only what ``only`` names, for ``bench`` and ``locate``, which run no site check).

    Raises:
        UsageError: a name that is not a check, naming it (escaped), the closest name and ``ddpdoctor list``;
            an ``--only`` that names no check at all (``--only ""``, from an unset variable).
    """
    every = all_checks()
    known = {c.name: c for c in every}
    wanted, unwanted = _names(only), _names(skip)
    if only and not wanted:
        raise UsageError("no-checks", f"--only '{safe_text(','.join(only))}' names no check",
                         "name the checks to run (ddpdoctor list), or leave --only out to run them all")
    broken = unloaded_plugins(every) if broken_plugins else []
    for name in wanted + unwanted:
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            if broken:
                hint += f"({', '.join(broken)} did not load: its checks are unknown) "
            raise UsageError("unknown-check", f"no check named '{safe_text(name)}'",
                             f"{hint}run 'ddpdoctor list' for the names")
    chosen = [c for name, c in known.items()
              if (name in wanted or name in broken if wanted else not c.on_request) and name not in unwanted]
    if not chosen:
        raise UsageError("no-checks", "--only/--skip left no check to run", "run 'ddpdoctor list' for the names")
    return [c() for c in chosen]
