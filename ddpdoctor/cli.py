"""The ``ddpdoctor`` command: thin commands over :mod:`ddpdoctor.runner` and the report.

Every error reaches the user as one line with the documented exit code; never a traceback.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any, Optional, Sequence

import click

from ddpdoctor import __version__
from ddpdoctor.errors import DdpdoctorError
from ddpdoctor.exitcodes import EXIT_CODE_HELP, ExitCode

__all__ = ["main", "cli"]


class _Group(click.Group):
    """Turns click's usage errors and our own errors into one line and the right exit code."""

    def main(self, args: Optional[Sequence[str]] = None, prog_name: Optional[str] = None, **extra: Any) -> Any:
        try:
            rv = super().main(args=args, prog_name=prog_name or "ddpdoctor", standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else "", err=False)
            sys.exit(ExitCode.OK)
        except click.UsageError as exc:
            cmd = exc.ctx.command_path if exc.ctx else "ddpdoctor"
            click.echo(f"error[usage]: {exc.format_message()}; see '{cmd} --help'", err=True)
            sys.exit(ExitCode.USAGE)
        except click.Abort:
            click.echo("interrupted", err=True)
            sys.exit(ExitCode.INTERRUPTED)
        except DdpdoctorError as exc:
            click.echo(exc.one_line(), err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(ExitCode.USAGE)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(ExitCode.INTERRUPTED)
        except Exception as exc:  # noqa: BLE001 - an internal error is one line plus a pointer
            last = traceback.extract_tb(exc.__traceback__)[-1]
            click.echo(f"error[internal]: {type(exc).__name__}: {exc} (at {last.filename}:{last.lineno}); "
                       "please report this with the output of 'ddpdoctor env'", err=True)
            sys.exit(ExitCode.INTERNAL)
        sys.exit(rv if isinstance(rv, int) else ExitCode.OK)


def _world_options(command: Any) -> Any:
    """The options that choose the world, shared by ``check`` and ``bench``."""
    options = [
        click.option("--nproc", type=int, default=None, help="Ranks in a local world [default: one per GPU, else 2]."),
        click.option("--backend", type=click.Choice(["gloo", "nccl"]), default=None,
                     help="Backend under test [default: nccl with GPUs, else gloo]."),
        click.option("--master-addr", default="127.0.0.1", show_default=True,
                     help="Rendezvous address (local mode)."),
        click.option("--master-port", type=click.IntRange(0, 65535), default=0, show_default=True,
                     help="Rendezvous port (local mode); 0 lets the OS pick a free one."),
        click.option("--local", "mode", flag_value="local", help="Spawn a local world even under a launcher."),
        click.option("--join", "mode", flag_value="join", help="Join the launcher's world (the default under one)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.group(cls=_Group, epilog=EXIT_CODE_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ddpdoctor")
def cli() -> None:
    """Find out whether a PyTorch distributed (DDP) job will work, and why not."""


@cli.command(epilog=EXIT_CODE_HELP)
@_world_options
@click.option("--only", multiple=True, metavar="NAMES", help="Run only these checks (comma-separated).")
@click.option("--skip", multiple=True, metavar="NAMES", help="Skip these checks (comma-separated).")
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Deadline per check, in seconds.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the report as JSON (schema 1) to this path.")
@click.option("--strict", is_flag=True, help="Warnings fail the run (exit 1).")
@click.option("--model", metavar="PKG.MODULE:FACTORY", default=None,
              help="Run param-sync and bn-sync on your model: a zero-argument callable returning an nn.Module.")
@click.option("--input-shape", metavar="N,C,H,W", default=None,
              help="Batch shape to feed --model [default: guessed from its first layer].")
@click.option("--min-busbw", type=click.FloatRange(min=0), default=None, metavar="GBPS",
              help="Fail the collectives check when a timed operation's busbw (GB/s) is below this.")
@click.option("-v", "--verbose", is_flag=True, help="Show details and every rank's outcome.")
def check(nproc: Optional[int], backend: Optional[str], master_addr: str, master_port: int, only: tuple,
          skip: tuple, timeout: float, json_path: Optional[str], strict: bool, model: Optional[str],
          input_shape: Optional[str], mode: Optional[str], min_busbw: Optional[float], verbose: bool) -> int:
    """Run the checks on a local world, or join the world torchrun/srun/mpirun started."""
    from ddpdoctor.runner.registry import all_checks, select_checks
    from ddpdoctor.report.terminal import Style, TerminalProgress, footer
    from ddpdoctor.runner.options import RunOptions
    from ddpdoctor.runner.local import run_checks

    _quiet_logs()
    opts = RunOptions(nproc=nproc, backend=backend, master_addr=master_addr, master_port=master_port,
                      only=only, skip=skip, timeout=timeout, mode=mode or "auto", strict=strict,
                      options={"model": model, "input_shape": input_shape, "min_busbw": min_busbw})
    out = sys.stdout
    style = Style.for_stream(out)
    names = [c.name for c in all_checks() if not c.on_request] + [c.name for c in select_checks(only, skip)
                                                                  if c.on_request]
    progress = TerminalProgress(out, style, verbose, names)
    outcome = run_checks(opts, progress)
    report = outcome.report
    if report is None:  # a non-reporting rank in joined mode
        if outcome.message:
            click.echo(outcome.message, err=True)
        return outcome.exit_code
    from ddpdoctor.report.terminal import render_result

    width = progress.width
    for result in report.results:
        if result.name not in progress.printed:
            out.write("\n".join(render_result(result, style, width, verbose)) + "\n")
    out.write(footer(report, strict) + "\n")
    out.flush()
    if json_path:
        try:
            report.write_json(json_path, strict)
        except OSError as exc:
            click.echo(f"error[json-write]: cannot write {json_path}: {exc.strerror}; choose a writable path",
                       err=True)
            return ExitCode.INTERNAL if outcome.exit_code == 0 else outcome.exit_code
    return outcome.exit_code


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


@cli.command(epilog=EXIT_CODE_HELP)
@_world_options
@click.option("--min-bytes", default="8", show_default=True, help="Smallest size (bytes; K/M/G suffixes).")
@click.option("--max-bytes", default="16M", show_default=True, help="Largest size (bytes; K/M/G suffixes).")
@click.option("--ops", multiple=True, metavar="NAMES",
              help="Operations or families, comma-separated (all_reduce, broadcast, ...) [default: all].")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16", "int64"]), default="float32",
              show_default=True)
@click.option("--iters", type=click.IntRange(min=1), default=20, show_default=True, help="Timed calls per row.")
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True, help="Untimed calls first.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Deadline for the sweep, seconds.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the rows and the report as JSON to this path.")
@click.option("-v", "--verbose", is_flag=True, help="Show per-rank times and every rank's outcome.")
def bench(nproc: Optional[int], backend: Optional[str], master_addr: str, master_port: int, min_bytes: str,
          max_bytes: str, ops: tuple, dtype: str, iters: int, warmup: int, timeout: float,
          json_path: Optional[str], mode: Optional[str], verbose: bool) -> int:
    """Sweep every collective over sizes and print an nccl-tests-like table (local or joined)."""
    from ddpdoctor.runner.bench import run_bench

    _quiet_logs()
    return run_bench(nproc=nproc, backend=backend, master_addr=master_addr, master_port=master_port,
                     min_bytes=min_bytes, max_bytes=max_bytes, ops=ops, dtype=dtype, iters=iters, warmup=warmup,
                     timeout=timeout, json_path=json_path, mode=mode or "auto", verbose=verbose)


@cli.command(epilog=EXIT_CODE_HELP)
@_world_options
@click.option("--size", default="4M", show_default=True, help="Bytes per all_reduce in each test (K/M/G suffixes).")
@click.option("--iters", type=click.IntRange(min=1), default=5, show_default=True, help="Timed calls per test.")
@click.option("--round-timeout", type=click.FloatRange(min=0.5, max=3600), default=None,
              help="Deadline of one round, seconds [default: a quarter of --timeout, 2-10 s].")
@click.option("--min-busbw", type=click.FloatRange(min=0), default=None, metavar="GBPS",
              help="Absolute floor: a test below this busbw (GB/s) is slow whatever the others do.")
@click.option("--tolerance", type=click.FloatRange(min=0.05, max=0.95), default=0.3, show_default=True,
              help="Relative: a test slower than the healthy median by more than this fraction is slow.")
@click.option("--timeout", type=click.FloatRange(min=1, max=86400), default=300.0, show_default=True,
              help="Deadline for the whole plan, seconds.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the report (with every round's readings) as JSON to this path.")
@click.option("-v", "--verbose", is_flag=True, help="Show every check's details and every rank's outcome.")
def locate(nproc: Optional[int], backend: Optional[str], master_addr: str, master_port: int, size: str,
           iters: int, round_timeout: Optional[float], min_busbw: Optional[float], tolerance: float, timeout: float,
           json_path: Optional[str], mode: Optional[str], verbose: bool) -> int:
    """Find the slow or dead node, link or group of nodes in a few rounds of parallel tests."""
    from ddpdoctor.runner.bench import parse_bytes
    from ddpdoctor.runner.locate import run_locate

    _quiet_logs()
    return run_locate(nproc=nproc, backend=backend, master_addr=master_addr, master_port=master_port,
                      size=parse_bytes(size, "--size"), iters=iters, round_timeout=round_timeout,
                      min_busbw=min_busbw, tolerance=tolerance, timeout=timeout, json_path=json_path, mode=mode or "auto",
                      verbose=verbose)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
def env(as_json: bool) -> int:
    """Print the environment report alone (copy-paste ready for a bug report)."""
    import json

    from ddpdoctor.dist import launcher
    from ddpdoctor.checks.env import assess, collect_environment, describe_environment

    _quiet_logs()
    info = launcher.detect()
    facts = collect_environment(local_world_size=info.local_world_size)
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return ExitCode.OK
    for line in describe_environment(facts):
        click.echo(line)
    findings = assess(facts)
    for status, _, summary, hint in findings.items:
        click.echo(f"{status.label}: {summary}" + (f" -> {hint}" if hint else ""))
    return ExitCode.OK


@cli.command()
@click.argument("text", nargs=-1)
@click.option("--log", "log_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Read a job log (several ranks interleaved is fine).")
@click.option("--json", "as_json", is_flag=True, help="Print the causes as JSON.")
@click.option("--here", is_flag=True,
              help="Also check the causes against this machine (interfaces, GPUs, /dev/shm, torch/NCCL/CUDA).")
def explain(text: tuple, log_path: Optional[str], as_json: bool, here: bool) -> int:
    """Name the known causes in an error message or job log (TEXT, --log FILE, or - for stdin)."""
    from ddpdoctor.postmortem.explain import explain_command

    return explain_command(text, log_path, as_json, here=here)


@cli.command()
@click.argument("pids", nargs=-1, type=int)
@click.option("--wait", type=float, default=3.0, show_default=True, help="Seconds to wait for each stack.")
def stacks(pids: tuple, wait: float) -> int:
    """Print every rank's Python stack, grouped by place (PIDS: a torchrun agent or the ranks; none: find them)."""
    from ddpdoctor.postmortem.stacks import stacks_command

    return stacks_command(pids, wait)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--hang-timeout", type=float, default=300.0, show_default=True,
              help="Seconds without progress on any rank before the job counts as hung.")
@click.option("--dir", "run_dir", type=click.Path(file_okay=False), default=None,
              help="Where to save output, stacks and verdict [default: ./ddpdoctor-run-<time>].")
@click.option("--keep-hung", is_flag=True, help="After reporting a hang, leave the job running.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(hang_timeout: float, run_dir: Optional[str], keep_hung: bool, command: tuple) -> int:
    """Run a training command (after --) and explain it if it hangs or dies."""
    from ddpdoctor.postmortem.jobrun import RunSpec, run_job

    return run_job(RunSpec(command=list(command), hang_timeout=hang_timeout, run_dir=run_dir,
                           keep_hung=keep_hung))


def _quiet_logs() -> None:
    logging.basicConfig(level=logging.WARNING, format="ddpdoctor: %(message)s")


def main() -> None:
    """Console-script entry point."""
    import warnings

    # A CPU torch wheel does not install numpy and says so on import; ddpdoctor never needs numpy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    cli.main()
