"""``ddpdoctor locate``: the ``locate`` check through the check runner, so it runs in the same local and
joined worlds as ``ddpdoctor check`` (any launcher, one or more ranks per node); this module prints
its verdict and writes the JSON.
"""

from __future__ import annotations

import sys
from typing import Optional

from ddpdoctor.report.document import save_json
from ddpdoctor.report.terminal import Style, command_seconds, footer, header, render_result
from ddpdoctor.runner.local import run_checks
from ddpdoctor.runner.options import RunOptions

__all__ = ["run_locate"]


def run_locate(*, nproc: Optional[int], backend: Optional[str], master_addr: str, master_port: int, size: int,
               iters: int, round_timeout: Optional[float], min_busbw: Optional[float], tolerance: float, timeout: float,
               json_path: Optional[str], mode: str, verbose: bool, html_path: Optional[str] = None) -> int:
    """Run the plan, print the verdict on the reporting rank, write ``json_path``; the exit code.

    The exit code is ``check``'s: 1 when a node is silent or below ``--min-busbw`` (the job would fail),
    0 with slow suspects (a warning: the job runs, slowly), 2 for bad options.
    """
    settings = {"size": size, "iters": iters, "min_busbw": min_busbw, "tolerance": tolerance}
    if round_timeout is not None:
        settings["round_timeout"] = round_timeout
    opts = RunOptions(nproc=nproc, backend=backend, master_addr=master_addr, master_port=master_port,
                      only=["process-group", "locate"], timeout=timeout, mode=mode, options={"locate": settings},
                      broken_plugins=False)
    outcome = run_checks(opts)
    if outcome.reported_elsewhere():
        return outcome.exit_code
    report = outcome.report
    style = Style.for_stream(sys.stdout)
    width = max(len(r.name) for r in report.results)
    lines = [header(report.world)]
    for result in report.results:
        lines += render_result(result, style, width, verbose or result.name == "locate")
    code = outcome.exit_code
    if json_path:  # before the footer, which says the command's real exit code (74: the JSON not written)
        code = save_json(json_path, report.to_dict(), code)
    located = next((r for r in report.results if r.name == "locate"), None)
    lead = next((o for o in located.outcomes if o.data.get("verdict")), None) if located else None
    html_note = ""
    if html_path and lead is not None:
        from ddpdoctor.report.page import write_page
        from ddpdoctor.report.pictures import locate_page

        code = write_page(html_path, locate_page(lead.data, f"{located.status.label}: {located.summary}",
                                                 located.hint or "", tolerance), code)
    elif html_path:
        html_note = f"ddpdoctor locate: --html not written: {located.summary if located else 'locate did not run'}\n"
    lines.append(footer(report, False, code, command_seconds()))
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    if html_note:
        sys.stderr.write(html_note)
    return code
