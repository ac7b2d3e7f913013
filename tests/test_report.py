"""The report: whole rendered output compared, JSON round trips, merge semantics, hang locations."""

from __future__ import annotations

import json

from ddpdoctor.check import WorldInfo
from ddpdoctor.system.stackframes import where_hung
from ddpdoctor.report.document import RunReport
from ddpdoctor.report.terminal import Style, render
from ddpdoctor.result import CheckResult, Outcome, Status, format_ranks, merge_outcomes

WORLD = WorldInfo(world_size=3, backend="gloo", hosts={0: "a", 1: "a", 2: "a"}, arrived=(0, 1, 2))


def sample() -> RunReport:
    o = [Outcome(0, Status.PASS, "free"), Outcome(1, Status.WARN, "slow", hint="go faster", finding="slow"),
         Outcome(2, Status.PASS, "free")]
    return RunReport(WORLD, (
        CheckResult("env", Status.PASS, "python 3.11", duration=0.01),
        merge_outcomes("port", o),
        CheckResult("process-group", Status.FAIL, "ranks 0-1 share one GPU", hint="set the device",
                    finding="duplicate-gpu", ranks=(0, 1), details=("rank  host",), duration=1.25),
        CheckResult("bn-sync", Status.SKIP, "needs 2 GPUs, found 0"),
    ), duration=2.0)


def test_plain_rendering_is_exact():
    assert render(sample(), Style(fancy=False)) == "\n".join([
        "ddpdoctor 0.1.0: local world of 3 ranks (gloo) on 1 node",
        "[ok]    env            python 3.11  (0.01s)",
        "[warn]  port           rank 1: slow  (0.00s)",
        "                       fix: go faster",
        "[FAIL]  process-group  ranks 0-1 share one GPU  (1.25s)",
        "                       fix: set the device",
        "[skip]  bn-sync        needs 2 GPUs, found 0  (0.00s)",
        "1 passed, 1 warned, 1 failed, 1 skipped in 2.0s; exit 1",
    ])


def test_verbose_rendering_shows_details_and_the_ranks_that_differ():
    text = render(sample(), Style(fancy=False), verbose=True)
    assert "                       rank  host" in text
    assert "                       rank 1: warn: slow" in text
    assert "rank 0: pass: free" in text  # statuses differ, so every rank is shown


def test_fancy_rendering_uses_glyphs_and_color():
    text = render(sample(), Style(fancy=True))
    assert "\x1b[32m✓\x1b[0m env" in text and "\x1b[31m✗\x1b[0m process-group" in text


def test_exit_codes_and_strict():
    r = sample()
    assert r.exit_code() == 1
    warn_only = RunReport(WORLD, (CheckResult("x", Status.WARN, "w", hint="h"),))
    assert warn_only.exit_code() == 0 and warn_only.exit_code(strict=True) == 1
    assert RunReport(WORLD, (), interrupted="SIGINT").exit_code() == 130


def test_json_document_round_trips():
    doc = json.loads(json.dumps(sample().to_dict()))
    assert doc["schema"] == 1 and doc["status"] == "fail" and doc["exit_code"] == 1
    assert doc["counts"] == {"pass": 1, "warn": 1, "fail": 1, "skip": 1}
    back = [CheckResult.from_dict(c) for c in doc["checks"]]
    assert back == list(sample().results)


def test_merge_lets_the_failure_lead_over_the_timeouts_it_caused_and_keeps_every_rank():
    o = [Outcome(2, Status.PASS, "ok"), Outcome(0, Status.TIMEOUT, "hung", hint="h"),
         Outcome(1, Status.FAIL, "bad", hint="f")]
    m = merge_outcomes("c", o)
    assert m.status == Status.FAIL and m.ranks == (1,) and m.hint == "f"
    assert [x.rank for x in m.outcomes] == [0, 1, 2]
    crash = merge_outcomes("c", [Outcome(0, Status.TIMEOUT, "hung"), Outcome(1, Status.CRASH, "boom"),
                                 Outcome(2, Status.TIMEOUT, "hung")])
    assert crash.status == Status.CRASH and crash.ranks == (1,) and crash.summary == "rank 1: boom"
    hang = merge_outcomes("c", [Outcome(0, Status.PASS, "ok"), Outcome(1, Status.TIMEOUT, "hung")])
    assert hang.status == Status.TIMEOUT and hang.ranks == (1,)  # nobody failed: the hang is the verdict
    worst = merge_outcomes("c", [Outcome(0, Status.WARN, "w", hint="x"), Outcome(1, Status.CRASH, "c")])
    assert worst.status == Status.CRASH
    same = merge_outcomes("c", [Outcome(0, Status.FAIL, "x", hint="h"), Outcome(1, Status.FAIL, "x", hint="h"),
                                Outcome(2, Status.PASS, "y")])
    assert same.summary == "ranks 0-1: x"


def test_format_ranks():
    assert format_ranks([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8" and format_ranks([]) == ""


def test_where_hung_names_the_call_and_the_caller():
    stack = """Thread 0x00007f (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007e (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/u/proj/train.py", line 88 in step
  File "/venv/lib/python3.11/site-packages/ddpdoctor/runner/worker.py", line 70 in run_guarded
"""
    assert where_hung(stack) == "all_reduce, called from step (/home/u/proj/train.py:88)"  # as given
    assert where_hung("") == "an unknown place (no Python stack)"


def test_errors_survive_pickling_across_processes():
    import pickle

    from ddpdoctor.errors import LauncherError, UsageError

    for err in (UsageError("bad-nproc", "--nproc 0 is not a number of ranks", "use --nproc 1 or more"),
                LauncherError("bad-launcher-env", "RANK='abc' is not an integer", "set it to a whole number")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and back.one_line() == err.one_line() and back.exit_code == err.exit_code
