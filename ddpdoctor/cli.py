"""The ``ddpdoctor`` command: thin commands over :mod:`ddpdoctor.runner` and the report.

Every error reaches the user as one line with the documented exit code; never a traceback.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import sys
import traceback
from typing import Any, Callable, Optional, Sequence

import click

from ddpdoctor import __version__
from ddpdoctor.errors import DdpdoctorError, UsageError
from ddpdoctor.exitcodes import EXIT_CODE_HELP, ExitCode, exit_code_help
from ddpdoctor.runner.options import (Interrupted, install_interrupt_handlers, note_pending, raise_pending,
                                      terminate_as_interrupt)

__all__ = ["main", "cli", "Number"]


class Number(click.ParamType):
    """The one type of every numeric option and argument: finite and in range, checked while parsing.

    ``nan``, ``inf``, ``1e999``, ``-1`` for a count or ``0`` for a deadline are usage errors (exit 2) that
    name the bad value and the accepted range; nothing has started yet.

    Args:
        kind: ``int`` or ``float``; or a function from the text to a number (sizes such as ``16M``).
        low, high: the accepted range (inclusive); ``low_open`` excludes ``low``.
        unit: shown after the range (``seconds``).
    """

    def __init__(self, kind: Callable[[str], Any] = float, low: Optional[float] = None,
                 high: Optional[float] = None, low_open: bool = False, unit: str = "") -> None:
        self.kind = kind
        self.low, self.high, self.low_open, self.unit = low, high, low_open, unit
        self.name = {int: "integer", float: "number"}.get(kind, "size")

    def accepted(self) -> str:
        def fmt(v: float) -> str:
            return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else f"{v:g}"

        kind = {"integer": "an integer", "number": "a number", "size": "a size in bytes"}[self.name]
        unit = f" ({self.unit})" if self.unit else ""
        if self.low is not None and self.high is not None and not self.low_open:
            return f"{kind} from {fmt(self.low)} to {fmt(self.high)}{unit}"
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {fmt(self.low)}")
        if self.high is not None:
            parts.append(f"<= {fmt(self.high)}")
        return f"{kind} {' and '.join(parts)}{unit}"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            try:
                if self.kind is int:
                    number = int(text, 10)
                elif self.kind is float:
                    number = float(text)
                else:
                    number = self.kind(text)
            except (ValueError, OverflowError, TypeError, DdpdoctorError):
                number = None
            if number is None or (isinstance(number, float) and not math.isfinite(number)):
                what = {"integer": "an integer", "number": "a finite number", "size": "a size in bytes"}[self.name]
                self.fail(f"{_shown(value)} is not {what}; accepted: {self.accepted()}", param, ctx)
        too_low = self.low is not None and (number <= self.low if self.low_open else number < self.low)
        if too_low or (self.high is not None and number > self.high):
            self.fail(f"{_shown(value)} is out of range; accepted: {self.accepted()}", param, ctx)
        return number

    def get_metavar(self, param: click.Parameter, *args: Any, **kwargs: Any) -> str:
        return {"integer": "INTEGER", "number": "FLOAT", "size": "SIZE"}[self.name]


def _shown(value: Any) -> str:
    from ddpdoctor.system.redact import safe_text

    text = safe_text(value)
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


def _size(text: str) -> int:
    from ddpdoctor.runner.bench import parse_bytes

    return parse_bytes(text)


SECONDS = dict(kind=float, low=0.0, high=86400.0, low_open=True, unit="seconds")


def _output_failed(exc: OSError) -> None:
    """stdout was closed (``| head -1``) or is full (``>/dev/full``): stop quietly, with a documented code."""
    try:  # later flushes (at exit) go nowhere instead of raising again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(ExitCode.OUTPUT_CLOSED if exc.errno == errno.EPIPE else ExitCode.OUTPUT_FAILED)


def _stdout_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG)


class _Group(click.Group):
    """Turns click's usage errors and our own errors into one line and the right exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OSError as exc:  # before click turns a broken pipe into exit 1
            if _stdout_error(exc):
                _output_failed(exc)
            raise

    def main(self, args: Optional[Sequence[str]] = None, prog_name: Optional[str] = None, **extra: Any) -> Any:
        try:
            rv = super().main(args=args, prog_name=prog_name or "ddpdoctor", standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else "", err=False)
            sys.exit(ExitCode.OK)
        except click.UsageError as exc:
            cmd = exc.ctx.command_path if exc.ctx and exc.ctx.command is not self else self._named(args)
            click.echo(f"error[usage]: {_sentence(exc.format_message())}; see '{cmd} --help'", err=True)
            sys.exit(ExitCode.USAGE)
        except click.Abort:  # click's word for a Ctrl-C it caught itself
            click.echo(f"interrupted by SIGINT; exit {int(ExitCode.INTERRUPTED)}", err=True)
            sys.exit(ExitCode.INTERRUPTED)
        except DdpdoctorError as exc:
            click.echo(exc.one_line(), err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(ExitCode.USAGE)
        except (KeyboardInterrupt, Interrupted) as exc:
            why = exc.signame if isinstance(exc, Interrupted) else "SIGINT"
            click.echo(f"interrupted by {why}; exit {int(ExitCode.INTERRUPTED)}", err=True)
            sys.exit(ExitCode.INTERRUPTED)
        except OSError as exc:
            if not _stdout_error(exc):
                _internal(exc)
            _output_failed(exc)
        except Exception as exc:  # noqa: BLE001 - an internal error is one line plus a pointer
            _internal(exc)
        try:
            sys.stdout.flush()
        except OSError as exc:
            _output_failed(exc)
        sys.exit(rv if isinstance(rv, int) else ExitCode.OK)


    def _named(self, args: Optional[Sequence[str]]) -> str:
        """``ddpdoctor check`` when the command line names one (click's parser errors, ``--only`` with no
        value, carry no command): its own help is the one to read; else ``ddpdoctor``."""
        words = list(sys.argv[1:] if args is None else args)
        name = next((w for w in words if not w.startswith("-")), None)
        return f"ddpdoctor {name}" if name in self.commands else "ddpdoctor"


def _sentence(message: str) -> str:
    """click's message without its closing full stop: ours goes on after it (``'nccl'; see ...``), and
    ``'nccl'.; see`` read as a typo. An ellipsis (a value cut short) stays."""
    message = message.rstrip().replace(". (Did you mean", " (did you mean")
    return message[:-1] if message.endswith(".") and not message.endswith("..") else message


def _internal(exc: BaseException) -> None:
    """ddpdoctor's own bug: one line, a pointer, exit 3."""
    last = traceback.extract_tb(exc.__traceback__)[-1]
    click.echo(f"error[internal]: {type(exc).__name__}: {exc} (at {last.filename}:{last.lineno}); "
               "please report this with the output of 'ddpdoctor env'", err=True)
    sys.exit(ExitCode.INTERNAL)


def _world_options(command: Any) -> Any:
    """The options that choose the world, shared by ``check`` and ``bench``."""
    options = [
        click.option("--nproc", type=Number(int, 1, 1024), default=None, help="Ranks in a local world [default: one per GPU, else 2]."),
        click.option("--backend", type=click.Choice(["gloo", "nccl"]), default=None,
                     help="Backend under test [default: nccl with GPUs, else gloo]."),
        click.option("--master-addr", default="127.0.0.1", show_default=True,
                     help="Rendezvous address (local mode)."),
        click.option("--master-port", type=Number(int, 0, 65535), default=0, show_default=True,
                     help="Rendezvous port (local mode); 0 lets the OS pick a free one."),
        click.option("--local", "mode", flag_value="local", help="Spawn a local world even under a launcher."),
        click.option("--join", "mode", flag_value="join", help="Join the launcher's world (the default under one)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.group(cls=_Group, epilog=EXIT_CODE_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ddpdoctor")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Find out whether a PyTorch distributed (DDP) job will work, and why not."""
    if ctx.invoked_subcommand != "check":
        raise_pending()  # a signal during start-up stops the command now ('check' reports what ran)


@cli.command(epilog=exit_code_help("check"))
@_world_options
@click.option("--only", multiple=True, metavar="NAMES", help="Run only these checks (comma-separated).")
@click.option("--skip", multiple=True, metavar="NAMES", help="Skip these checks (comma-separated).")
@click.option("--timeout", type=Number(**SECONDS), default=30.0, show_default=True, help="Deadline per check, in seconds.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the report as JSON (schema 1) to this path (replaced atomically; never through a link).")
@click.option("--strict", is_flag=True, help="Warnings fail the run (exit 1).")
@click.option("--model", metavar="PKG.MODULE:FACTORY", default=None,
              help="Run param-sync and bn-sync on your model: a zero-argument callable returning an nn.Module.")
@click.option("--input-shape", metavar="N,C,H,W", default=None,
              help="Batch shape to feed --model [default: guessed from its first layer].")
@click.option("--min-busbw", type=Number(float, 0.0, 1e6), default=None, metavar="GBPS",
              help="Fail the collectives check when a timed operation's busbw (GB/s) is below this.")
@click.option("-v", "--verbose", is_flag=True, help="Show details and every rank's outcome.")
def check(nproc: Optional[int], backend: Optional[str], master_addr: str, master_port: int, only: tuple,
          skip: tuple, timeout: float, json_path: Optional[str], strict: bool, model: Optional[str],
          input_shape: Optional[str], mode: Optional[str], min_busbw: Optional[float], verbose: bool) -> int:
    """Run the checks on a local world, or join the world torchrun/srun/mpirun started."""
    from ddpdoctor.report.document import check_json_target

    if json_path:
        check_json_target(json_path)
    checks: list = []
    progress = None
    try:
        raise_pending()
        from ddpdoctor.report.terminal import Style, TerminalProgress
        from ddpdoctor.runner.local import run_checks
        from ddpdoctor.runner.options import RunOptions
        from ddpdoctor.runner.registry import all_checks, select_checks

        _quiet_logs()
        opts = RunOptions(nproc=nproc, backend=backend, master_addr=master_addr, master_port=master_port,
                          only=only, skip=skip, timeout=timeout, mode=mode or "auto", strict=strict,
                          options={"model": model, "input_shape": input_shape, "min_busbw": min_busbw})
        out = sys.stdout
        style = Style.for_stream(out)
        checks = select_checks(only, skip)
        names = [c.name for c in all_checks() if not c.on_request] + [c.name for c in checks if c.on_request]
        progress = TerminalProgress(out, style, verbose, names)
        with terminate_as_interrupt():  # main() installed them already; here for callers of cli.main
            outcome = run_checks(opts, progress)
    except (KeyboardInterrupt, Interrupted) as exc:  # during start-up, before the world formed
        outcome = _interrupted_at_start(exc, checks, nproc, backend)
    return _finish_check(outcome, progress, verbose, strict, json_path)


def _interrupted_at_start(exc: BaseException, checks: Sequence[Any], nproc: Optional[int],
                          backend: Optional[str]) -> Any:
    from ddpdoctor.check import WorldInfo
    from ddpdoctor.report.document import RunReport
    from ddpdoctor.runner.lockstep import interrupted_results
    from ddpdoctor.runner.options import RunOutcome

    why = exc.signame if isinstance(exc, Interrupted) else "SIGINT"
    world = WorldInfo(world_size=nproc or 0, backend=backend or "backend not chosen yet", mode="local")
    results = interrupted_results(checks, [], None, f"{why}, during start-up")
    report = RunReport(world, tuple(results), interrupted=why)
    return RunOutcome(report, int(report.exit_code()))


def _finish_check(outcome: Any, progress: Any, verbose: bool, strict: bool, json_path: Optional[str]) -> int:
    """Print the rest of the report and the footer, write --json; the exit code."""
    from ddpdoctor.report.document import save_json
    from ddpdoctor.report.terminal import Style, command_seconds, footer, header, render_result

    if outcome.reported_elsewhere():
        return outcome.exit_code
    report = outcome.report
    out = sys.stdout
    style = Style.for_stream(out)
    printed = progress.printed if progress is not None else []
    if progress is None:
        out.write(header(report.world) + "\n")
    if report.interrupted and not report.results:
        out.write(f"interrupted by {report.interrupted} during start-up: no check ran\n")
    width = progress.width if progress is not None else max((len(r.name) for r in report.results), default=4)
    for result in report.results:
        if result.name not in printed:
            out.write("\n".join(render_result(result, style, width, verbose)) + "\n")
    code = outcome.exit_code
    if json_path:  # before the footer, which says the command's real exit code (74: the JSON not written)
        code = save_json(json_path, report.to_dict(strict), code)
    out.write(footer(report, strict, code, command_seconds()) + "\n")
    out.flush()
    return code


@cli.command(name="list")
def list_checks() -> int:
    """Name every check, one line each."""
    from ddpdoctor.runner.registry import all_checks

    checks = all_checks()
    width = max(len(c.name) for c in checks)
    for c in checks:
        tags = "".join(t for t, on in ((" (slow)", c.slow), (" (on request)", c.on_request)) if on)
        click.echo(f"{c.name.ljust(width)}  {c.description}{tags}")
    return ExitCode.OK


@cli.command(epilog=exit_code_help("bench"))
@_world_options
@click.option("--min-bytes", type=Number(_size, 1, 1 << 34), default="8", show_default=True, help="Smallest size (bytes; K/M/G suffixes).")
@click.option("--max-bytes", type=Number(_size, 1, 1 << 34), default="16M", show_default=True, help="Largest size (bytes; K/M/G suffixes).")
@click.option("--ops", multiple=True, metavar="NAMES",
              help="Operations or families, comma-separated (all_reduce, broadcast, ...) [default: all].")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16", "int64"]), default="float32",
              show_default=True)
@click.option("--iters", type=Number(int, 1, 1000000), default=20, show_default=True, help="Timed calls per row.")
@click.option("--warmup", type=Number(int, 0, 1000000), default=5, show_default=True, help="Untimed calls first.")
@click.option("--timeout", type=Number(**SECONDS), default=600.0, show_default=True, help="Deadline for the sweep, seconds.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the rows and the report as JSON to this path.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="Also write a page with bus and algorithm bandwidth against size, one line per operation.")
@click.option("-v", "--verbose", is_flag=True, help="Show per-rank times and every rank's outcome.")
def bench(nproc: Optional[int], backend: Optional[str], master_addr: str, master_port: int, min_bytes: str,
          max_bytes: str, ops: tuple, dtype: str, iters: int, warmup: int, timeout: float,
          json_path: Optional[str], html_path: Optional[str], mode: Optional[str], verbose: bool) -> int:
    """Sweep every collective over sizes and print an nccl-tests-like table (local or joined)."""
    from ddpdoctor.report.document import check_json_target

    if html_path:
        check_json_target(html_path, "--html")
    from ddpdoctor.runner.bench import run_bench

    _quiet_logs()
    return run_bench(nproc=nproc, backend=backend, master_addr=master_addr, master_port=master_port,
                     min_bytes=str(min_bytes), max_bytes=str(max_bytes), ops=ops, dtype=dtype, iters=iters, warmup=warmup,
                     timeout=timeout, json_path=json_path, mode=mode or "auto", verbose=verbose, html_path=html_path)


@cli.command(epilog=exit_code_help("locate"))
@_world_options
@click.option("--size", type=Number(_size, 1, 1 << 34), default="4M", show_default=True,
              help="Bytes per all_reduce in each test (K/M/G suffixes).")
@click.option("--iters", type=Number(int, 1, 1000000), default=5, show_default=True, help="Timed calls per test.")
@click.option("--round-timeout", type=Number(float, 0.5, 3600.0, unit="seconds"), default=None,
              help="Deadline of one round, seconds [default: a quarter of --timeout, 2-10 s].")
@click.option("--min-busbw", type=Number(float, 0.0, 1e6), default=None, metavar="GBPS",
              help="Absolute floor: a test below this busbw (GB/s) is slow whatever the others do.")
@click.option("--tolerance", type=Number(float, 0.05, 0.95), default=0.3, show_default=True,
              help="Relative: a test slower than the healthy median by more than this fraction is slow.")
@click.option("--timeout", type=Number(float, 1.0, 86400.0, unit="seconds"), default=300.0, show_default=True,
              help="Deadline for the whole plan, seconds.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the report (with every round's readings) as JSON to this path.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="Also write a picture of the world: the nodes, each round's tests and figures, the suspects.")
@click.option("-v", "--verbose", is_flag=True, help="Show every check's details and every rank's outcome.")
def locate(nproc: Optional[int], backend: Optional[str], master_addr: str, master_port: int, size: str,
           iters: int, round_timeout: Optional[float], min_busbw: Optional[float], tolerance: float, timeout: float,
           json_path: Optional[str], html_path: Optional[str], mode: Optional[str], verbose: bool) -> int:
    """Find the slow or dead node, link or group of nodes in a few rounds of parallel tests."""
    from ddpdoctor.report.document import check_json_target

    if json_path:
        check_json_target(json_path)
    if html_path:
        check_json_target(html_path, "--html")
    from ddpdoctor.runner.locate import run_locate

    _quiet_logs()
    return run_locate(nproc=nproc, backend=backend, master_addr=master_addr, master_port=master_port,
                      size=size, iters=iters, round_timeout=round_timeout,
                      min_busbw=min_busbw, tolerance=tolerance, timeout=timeout, json_path=json_path, mode=mode or "auto",
                      verbose=verbose, html_path=html_path)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
def env(as_json: bool) -> int:
    """Print the environment report alone (copy-paste ready for a bug report): which ddpdoctor, the
    versions and packages that matter, CPUs, GPUs, network interfaces (names and state, no addresses);
    exit 1 when it names a failure."""
    import json

    from ddpdoctor.training import launcher
    from ddpdoctor.checks.env import addresses_hidden, assess, collect_environment, collect_installation, \
        describe_environment, describe_installation
    from ddpdoctor.result import Status

    _quiet_logs()
    info = launcher.detect()
    facts = collect_environment(local_world_size=info.local_world_size)
    installed = collect_installation()
    from ddpdoctor.report.document import redacted
    from ddpdoctor.system.redact import safe_text

    findings = assess(facts)
    code = ExitCode.CHECK_FAILED if any(status >= Status.FAIL for status, *_ in findings.items) else ExitCode.OK
    if as_json:
        click.echo(json.dumps(redacted({**addresses_hidden(facts), **installed}), indent=2))
        return code
    for line in describe_installation(installed) + describe_environment(facts):
        click.echo(safe_text(line))
    for status, _, summary, hint in findings.items:
        click.echo(safe_text(f"{status.label}: {summary}" + (f" -> {hint}" if hint else "")))
    return code


@cli.command()
@click.argument("text", nargs=-1)
@click.option("--log", "log_path", type=click.Path(), default=None,
              help="Read a job log (several ranks interleaved is fine; any size, read as a stream).")
@click.option("--json", "as_json", is_flag=True, help="Print the causes as JSON.")
@click.option("--max-wait", type=Number(**SECONDS), default=30.0, show_default=True,
              help="For a pipe, FIFO or device: stop reading after this many seconds.")
@click.option("--here", is_flag=True,
              help="Also check the causes against this machine (interfaces, GPUs, /dev/shm, torch/NCCL/CUDA).")
@click.option("--fr", "fr_dir", type=click.Path(), default=None,
              help="Read a directory of PyTorch Flight Recorder dumps (one file per rank): where the ranks' "
                   "collectives diverge.")
@click.option("--prefix", "fr_prefix", default=None,
              help="With --fr: the dump files' name before the rank (guessed when the names agree).")
@click.option("--world-size", "fr_world", type=Number(int, 1, 1 << 20), default=None,
              help="With --fr: the job's number of ranks, to name the ranks that left no dump (gloo's dumps "
                   "do not record it).")
def explain(text: tuple, log_path: Optional[str], as_json: bool, max_wait: float, here: bool,
            fr_dir: Optional[str], fr_prefix: Optional[str], fr_world: Optional[int]) -> int:
    """Name the known causes in an error message or job log (TEXT, --log FILE, or - for stdin), or where the
    ranks diverge in Flight Recorder dumps (--fr DIR)."""
    if fr_dir is not None:
        if text or log_path or here:
            raise UsageError("explain-input", "--fr reads dumps: give it without TEXT, --log or --here",
                             "run 'ddpdoctor explain --fr DIR' on its own")
        from ddpdoctor.postmortem.divergence import explain_dumps_command

        return explain_dumps_command(fr_dir, fr_prefix, as_json, fr_world)
    if fr_prefix is not None or fr_world is not None:
        raise UsageError("explain-input", "--prefix and --world-size describe Flight Recorder dumps and need "
                         "--fr DIR", "add --fr DIR, or drop them")
    from ddpdoctor.postmortem.explain import explain_command

    return explain_command(text, log_path, as_json, max_wait, here=here)


@cli.command()
@click.argument("pids", nargs=-1, type=Number(int, 1, 2147483647), metavar="[PID]...")
@click.option("--wait", type=Number(float, 0.0, 3600.0, low_open=True, unit="seconds"), default=3.0, show_default=True, help="Seconds to wait for each stack.")
def stacks(pids: tuple, wait: float) -> int:
    """Print every rank's Python stack, grouped by place (PIDS: a torchrun agent or the ranks; none: find them)."""
    from ddpdoctor.postmortem.stacks import stacks_command

    return stacks_command(pids, wait)


@cli.command(epilog=exit_code_help("run"),
             context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--hang-timeout", type=Number(float, 1.0, 31536000.0, unit="seconds"), default=300.0, show_default=True,
              help="Seconds without progress on any rank before the job counts as hung.")
@click.option("--dir", "run_dir", type=click.Path(file_okay=False), default=None,
              help="Where to save output, stacks and verdict: a new path, an empty folder or an earlier run's "
                   "(ddpdoctor removes only the files it made) [default: a new directory under "
                   "$XDG_STATE_HOME/ddpdoctor/runs, i.e. ~/.local/state/ddpdoctor/runs].")
@click.option("--keep", is_flag=True, help="Keep the run directory even when the job succeeded.")
@click.option("--keep-hung", is_flag=True, help="After reporting a hang, leave the job running.")
@click.option("--straggler-window", type=Number(float, 0.5, 86400.0, unit="seconds"), default=60.0, show_default=True,
              help="Seconds per window of the straggler score (each rank's own work between collectives).")
@click.option("--straggler-windows", type=Number(int, 1, 1000), default=3, show_default=True,
              help="Windows in a row a rank must score under 0.8 to be named a straggler.")
@click.option("--no-watch", "no_watch", multiple=True, metavar="NAMES",
              help="Turn off watches for silent bugs, comma-separated: sampler-epoch, data-plan, desync, bn-drift, "
                   "solo-wait (or DDPDOCTOR_WATCH_<NAME>=0).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the run's report.html (verdict, timeline per rank, stragglers, findings) to this "
                   "path, even for a healthy run.")
@click.option("--list", "list_runs", is_flag=True,
              help="List the kept run directories under the runs root (age, size, verdict), then exit.")
@click.option("--prune", metavar="AGE", default=None,
              help="Remove the run directories older than AGE (7d, 12h, 30m) under the runs root: only those "
                   "carrying ddpdoctor's run marker, only the files it lists, following no links.")
@click.option("--dry-run", is_flag=True, help="With --prune: say what would be removed, remove nothing.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(hang_timeout: float, run_dir: Optional[str], keep: bool, keep_hung: bool, straggler_window: float,
        straggler_windows: int, no_watch: tuple, html_path: Optional[str], list_runs: bool, prune: Optional[str],
        dry_run: bool, command: tuple) -> int:
    """Run a training command (after --) and explain it if it hangs or dies; or list (--list) or prune
    (--prune AGE) the kept run directories."""
    from ddpdoctor.postmortem.jobrun import RunSpec, run_job
    from ddpdoctor.postmortem.watches import parse_no_watch
    from ddpdoctor.report.document import check_json_target

    if html_path is not None:
        if not html_path.strip():
            raise UsageError("json-path", "--html '' is empty (an unset variable?)", "pass a file path")
        check_json_target(html_path, "--html")

    if dry_run and prune is None:
        raise UsageError("run-usage", "--dry-run goes with --prune AGE", "add --prune 7d (or another age)")
    if list_runs or prune is not None:
        if command:
            raise UsageError("run-usage", "--list and --prune manage the kept run directories and run no "
                             f"command, but one was given ({_shown(' '.join(command))})",
                             "drop the command, or drop --list/--prune")
        from ddpdoctor.postmortem.runs import runs_command

        return runs_command(list_runs, prune, dry_run)
    if not command:
        raise click.UsageError("Missing argument 'COMMAND...': the training command, after --",
                               click.get_current_context())

    # a closed stdout or stderr (>&-) is already /dev/null here (__main__): the job runs, its code returned
    return run_job(RunSpec(command=list(command), hang_timeout=hang_timeout, run_dir=run_dir, keep=keep,
                           keep_hung=keep_hung, straggler_window=straggler_window,
                           straggler_windows=straggler_windows, no_watch=parse_no_watch(no_watch),
                           html=html_path))


def _quiet_logs() -> None:
    logging.basicConfig(level=logging.WARNING, format="ddpdoctor: %(message)s")


def main(pending: Sequence[int] = ()) -> None:
    """Console-script entry point (through :mod:`ddpdoctor.__main__`, which catches signals from the start).

    Ctrl-C and SIGTERM are handled from the first moment: the first one stops the command cleanly
    (``check`` prints a report of what ran), a second one exits at once (130), never with a traceback.
    ``pending``: signals that arrived while the command started; acted on as soon as it can stop cleanly.
    """
    import warnings

    # A CPU torch wheel does not install numpy and says so on import; ddpdoctor never needs numpy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    install_interrupt_handlers()
    if pending:
        note_pending(pending[0])
    cli.main()
