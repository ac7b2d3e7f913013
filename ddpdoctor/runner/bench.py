"""``ddpdoctor bench``: the collectives sweep through the check runner, printed like nccl-tests.

The sweep is the ``collectives-bench`` check (on request only), so it runs in exactly the local and
joined modes ``ddpdoctor check`` does; this module turns its result into the table and the JSON.
"""

from __future__ import annotations

import re
import sys
from typing import IO, Optional, Sequence

from ddpdoctor.check import WorldInfo
from ddpdoctor.errors import UsageError
from ddpdoctor.report.progress import Progress
from ddpdoctor.result import Status
from ddpdoctor.system.redact import safe_text

__all__ = ["parse_bytes", "format_size", "run_bench", "TableProgress"]

MAX_BYTES = 1 << 34  # 16 GiB: one buffer of a collective
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str, flag: str = "--max-bytes") -> int:
    """``"16M"`` -> 16777216 (K, M, G are powers of 1024, as in nccl-tests).

    Raises:
        UsageError: not a positive size, naming the value.
    """
    match = re.fullmatch(r"\s*(\d{1,12}(?:\.\d{1,6})?)\s*([KMG]?)(?:I?B)?\s*", str(text), re.IGNORECASE)
    value = int(float(match.group(1)) * _UNITS[match.group(2).upper()]) if match else 0
    if value < 1:
        raise UsageError("bad-size", f"{flag} {text!r} is not a size in bytes", f"use e.g. {flag} 8, 64K or 16M")
    if value > MAX_BYTES:
        raise UsageError("bad-size", f"{flag} {text} is larger than 16G", f"use {flag} 16G or less")
    return value


def format_size(n: int) -> str:
    """``1048576`` -> ``1M``: the shortest way to write a size in nccl-tests' units."""
    for unit in ("G", "M", "K"):
        if n >= _UNITS[unit] and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def run_bench(*, nproc: Optional[int], backend: Optional[str], master_addr: str, master_port: int,
              min_bytes: str, max_bytes: str, ops: Sequence[str], dtype: str, iters: int, warmup: int,
              timeout: float, json_path: Optional[str], mode: str, verbose: bool,
              html_path: Optional[str] = None) -> int:
    """Run the sweep, print the table on the reporting rank, write ``json_path``; the exit code.

    Raises:
        UsageError: bad sizes or operation names (exit 2), before anything starts.
    """
    if nproc == 1 and mode != "join":
        raise UsageError("bench-one-rank", "--nproc 1: the bandwidth table times transfers between ranks, and one "
                         "rank has none", "use --nproc 2 or more (with one GPU: --backend gloo --nproc 2, on CPU)")
    from ddpdoctor.checks.collectives import bench_rows
    from ddpdoctor.diagnostics.collective_plan import select_ops
    from ddpdoctor.report.terminal import Style, command_seconds, footer, header, render_result
    from ddpdoctor.runner.options import RunOptions
    from ddpdoctor.runner.local import run_checks

    from ddpdoctor.report.document import check_json_target, save_json

    lo, hi = parse_bytes(min_bytes, "--min-bytes"), parse_bytes(max_bytes, "--max-bytes")
    if json_path:
        check_json_target(json_path)
    if html_path:
        check_json_target(html_path, "--html")
    if lo > hi:
        raise UsageError("bad-size", f"--min-bytes {format_size(lo)} is larger than --max-bytes {format_size(hi)}",
                         "make --min-bytes the smaller one")
    names = [n.strip() for item in ops for n in item.split(",") if n.strip()]
    if ops and not names:
        raise UsageError("no-collectives", f"--ops '{safe_text(','.join(ops))}' names no operation",
                         "name the operations (all_reduce, broadcast, ...) or leave --ops out to sweep them all")
    try:
        chosen = select_ops(names) if names else []
    except ValueError as exc:
        raise UsageError("unknown-collective", str(exc), "see 'ddpdoctor bench --help'") from None
    settings = {"min_bytes": lo, "max_bytes": hi, "ops": chosen, "dtype": dtype, "iters": iters, "warmup": warmup}
    opts = RunOptions(nproc=nproc, backend=backend, master_addr=master_addr, master_port=master_port,
                      only=["collectives-bench"], timeout=timeout, mode=mode, options={"bench": settings},
                      broken_plugins=False)
    out = sys.stdout
    table = TableProgress(out, f"# {dtype}, sizes {lo}..{hi} bytes, {warmup} warm-up + {iters} timed calls per "
                               "row; time averaged over ranks; busbw as nccl-tests")
    outcome = run_checks(opts, table)
    if outcome.reported_elsewhere():
        return outcome.exit_code
    report = outcome.report
    result = report.results[0]
    style = Style.for_stream(out)
    if result.status == Status.SKIP:  # never an empty table: one line saying why
        out.write(f"ddpdoctor bench: not run: {result.summary}\n")
        out.flush()
        return outcome.exit_code
    rows = bench_rows(result.outcomes, report.world.world_size)
    if not table.greeted_world:
        out.write(header(report.world) + "\n" + table.settings + "\n")
    lines = table.rest(rows)  # the rows not printed as they were measured (a rank that never reported them)
    lines += render_result(result, style, len(result.name), False)
    if verbose:
        lines += [f"  {d}" for d in result.details[len(rows) + 2:]]
        lines += [f"  rank {o.rank}: {o.status.label}: {o.summary}" for o in result.outcomes]
    code = outcome.exit_code
    if json_path:  # before the footer, which says the command's real exit code (74: the JSON not written)
        doc = {"schema": 1, "settings": settings, "world": report.world.to_dict(), "status": report.status.label,
               "exit_code": int(outcome.exit_code), "rows": rows, "report": report.to_dict()}
        code = save_json(json_path, doc, code)
    if html_path:  # before the footer too: a page that could not be written is its exit code
        from ddpdoctor.diagnostics.collective_plan import render_table
        from ddpdoctor.report.page import write_page
        from ddpdoctor.report.pictures import bench_page

        code = write_page(html_path, bench_page(rows, [header(report.world), table.settings], render_table(rows),
                                                f"{result.status.label}: {result.summary}"), code)
    lines.append(footer(report, False, code, command_seconds()))
    out.write("\n".join(lines) + "\n")
    out.flush()
    return code


class TableProgress(Progress):
    """Prints the bench's header as soon as the world formed, and each row of the table as soon as every
    rank timed it (as nccl-tests does), instead of everything at the end."""

    def __init__(self, out: IO[str], settings: str) -> None:
        self.out = out
        self.settings = settings
        self.greeted_world = False
        self.printed = 0

    def greeted(self, world: WorldInfo) -> None:
        from ddpdoctor.report.terminal import header

        self.greeted_world = True
        self._write([header(world), self.settings])

    def measured(self, name: str, item: object) -> None:
        if isinstance(item, dict):
            self._write(self._lines([item]))

    def rest(self, rows: Sequence[dict]) -> list:
        """The lines of the rows not printed yet (the head first, when no row was)."""
        return self._lines(rows[self.printed:]) if len(rows) > self.printed else []

    def _lines(self, rows: Sequence[dict]) -> list:
        from ddpdoctor.diagnostics.collective_plan import render_table

        table = render_table(rows)
        head = [f"# {line}" for line in table[:2]] if self.printed == 0 else []
        self.printed += len(rows)
        return head + [f"  {line}" for line in table[2:]]

    def _write(self, lines: list) -> None:
        self.out.write("".join(line + "\n" for line in lines))
        self.out.flush()
