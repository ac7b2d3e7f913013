"""Root cause first: the rank that failed is the verdict, the ranks left waiting for it are the consequence.

Real worlds (forked local ranks, torchrun, srun, mpirun, `ddpdoctor bench`) in which one rank fails in
each way there is (raises, returns a failed result, os._exit(0), os._exit(3), sys.exit(2), SIGKILL,
SIGSEGV), before the others' rendezvous completes or while they wait in all_reduce. This is the CI
subset: every kind in each mode, every world size and both moments at least once; the whole matrix
is benchmarks/fault_matrix.py --root-cause. Every run uses --timeout 30 and must give its verdict in
under half of it (the benchmark holds the real target, verdict.CAUSE_GRACE).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from ddpdoctor.report.progress import Progress
from ddpdoctor.result import Status
from ddpdoctor.runner.local import run_checks
from ddpdoctor.runner.options import RunOptions
from rootcause import Cell, cell_env, read_stamp, run_cli, torchrun_cmd, verdict_line, verify

TIMEOUT = 30
BOUND = TIMEOUT / 2

LOCAL = [Cell("raise", "before", 2, 1), Cell("fail", "during", 3, 1), Cell("exit0", "during", 4, 2),
         Cell("exit3", "before", 3, 0), Cell("sysexit2", "during", 2, 0), Cell("sigkill", "during", 3, 2),
         Cell("sigsegv", "before", 4, 3)]
TORCHRUN = [Cell("raise", "during", 3, 0, "torchrun"), Cell("fail", "before", 2, 1, "torchrun"),
            Cell("exit0", "before", 3, 2, "torchrun"), Cell("exit3", "during", 4, 1, "torchrun"),
            Cell("sysexit2", "before", 4, 0, "torchrun"), Cell("sigkill", "during", 2, 0, "torchrun"),
            Cell("sigsegv", "during", 3, 1, "torchrun")]


class _Clock(Progress):
    def __init__(self) -> None:
        self.at: dict = {}

    def finished(self, result) -> None:
        self.at[result.name] = time.time()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cell", LOCAL, ids=lambda c: c.name)
def test_local_world_names_the_failed_rank_first_and_fast(clean_launcher_env, tmp_path, cell):
    stamp = str(tmp_path / "stamp")
    for k, v in cell_env({}, cell, stamp).items():
        if k.startswith(("FAULT_", "DDPDOCTOR_")):
            clean_launcher_env.setenv(k, v)
    clock = _Clock()
    out = run_checks(RunOptions(nproc=cell.nproc, timeout=TIMEOUT, only=["fault-matrix", "fault-none"]), clock)
    assert out.report is not None and out.exit_code == 1
    res = {r.name: r for r in out.report.results}
    r = res["fault-matrix"]
    verify(cell, r.status.label, r.summary)
    assert r.ranks == (cell.rank,)
    assert clock.at["fault-matrix"] - read_stamp(stamp) < BOUND
    skipped = res["fault-none"]
    assert skipped.status == Status.SKIP and skipped.summary.startswith(f"not run: rank {cell.rank} ")
    assert skipped.summary.endswith("during 'fault-matrix'")
    if cell.kind == "fail":
        assert r.hint == "undo the injected fault" and r.finding == "injected-fault"  # the cause's own fix


def _joined(cmd_for, cells, base):
    def one(args):
        i, cell = args
        stamp = os.path.join(base["_TMP"], f"stamp{i}")
        env = {k: v for k, v in cell_env(base, cell, stamp).items() if k != "_TMP"}
        code, lines = run_cli(cmd_for(cell), env, timeout=150)
        return cell, code, lines, stamp

    with ThreadPoolExecutor(len(cells)) as pool:
        return list(pool.map(one, enumerate(cells)))


def _assert_joined(cell, code, lines, stamp):
    text = "\n".join(line for _, line in lines)
    found = verdict_line(lines)
    assert found is not None, (cell, text)
    at, status, summary = found
    verify(cell, status, summary)
    assert at - read_stamp(stamp) < BOUND, (cell, at - read_stamp(stamp), text)
    assert "[skip]  fault-none" in text and f"not run: rank {cell.rank} " in text
    assert code != 0, text
    assert text.count("ddpdoctor 0.1.0: ") == 1, text  # one report, from the lowest live coordinator


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_torchrun_worlds_name_the_failed_rank_first_and_fast(cli_env, tmp_path):
    """The seven kinds in torchrun worlds of 2, 3 and 4 ranks, run side by side."""
    results = _joined(torchrun_cmd, TORCHRUN, {**cli_env, "_TMP": str(tmp_path)})
    for cell, code, lines, stamp in results:
        _assert_joined(cell, code, lines, stamp)


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun (Debian: openmpi-bin)")
def test_mpirun_world_names_the_failed_rank_first(cli_env, tmp_path):
    cell = Cell("exit3", "during", 3, 1, "mpirun")

    def cmd(c):
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(c.nproc), "-x", "PYTHONPATH",
                "-x", "NO_COLOR", "-x", "DDPDOCTOR_PLUGINS", "-x", "FAULT_KIND", "-x", "FAULT_WHEN", "-x",
                "FAULT_RANK", "-x", "FAULT_STAMP", "-x", "FAULT_DELAY", "-x", "MASTER_ADDR=127.0.0.1",
                "-x", f"MASTER_PORT={_free_port()}", sys.executable, "-m", "ddpdoctor", "check", "--timeout",
                str(TIMEOUT), "--only", "fault-matrix,fault-none"]

    [(cell, code, lines, stamp)] = _joined(cmd, [cell], {**cli_env, "_TMP": str(tmp_path)})
    _assert_joined(cell, code, lines, stamp)


def _free_port() -> int:
    from ddpdoctor.system.ports import free_port

    return free_port()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_names_the_rank_that_failed_mid_sweep(cli_env, tmp_path):
    stamp = str(tmp_path / "stamp")
    env = {**cell_env(cli_env, Cell("raise", "during", 3, 2), stamp), "DDPDOCTOR_PLUGINS": "bench_faults"}
    code, lines = run_cli([sys.executable, "-m", "ddpdoctor", "bench", "--nproc", "3", "--timeout", str(TIMEOUT),
                           "--max-bytes", "64K", "--iters", "2", "--warmup", "1"], env, timeout=100)
    text = "\n".join(line for _, line in lines)
    found = verdict_line(lines, "collectives-bench")
    assert found is not None, text
    at, status, summary = found
    assert status == "CRASH", text
    assert summary.startswith("rank 2 raised RuntimeError: injected failure on rank 2 (tests/faults.py:"), text
    assert "ranks 0-1 were left waiting in all_reduce" in summary, text
    assert "finished" not in summary
    assert at - read_stamp(stamp) < BOUND
    assert code == 1


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_torchrun_rank_whose_process_vanished_is_named_and_the_stopped_ranks_said_so(cli_env, tmp_path):
    """A rank's launched process is SIGKILLed (as the OOM killer does): torchrun stops the others with
    SIGTERM before anyone can report a death. Rank 0 says what is known; when rank 0 is the one that
    vanished, the lowest rank left says it."""
    cells = [Cell("vanish", "during", 3, 1, "torchrun"), Cell("vanish", "during", 3, 0, "torchrun")]
    (c1, code1, lines1, stamp1), (c0, code0, lines0, _) = _joined(torchrun_cmd, cells,
                                                                 {**cli_env, "_TMP": str(tmp_path)})
    text = "\n".join(line for _, line in lines1)
    found = verdict_line(lines1)
    assert found is not None, text
    at, status, summary = found
    assert status == "CRASH", text
    assert summary.startswith("rank 1 vanished during 'fault-matrix' (the process ended without a result or last "
                              "words); the launcher then stopped ranks 0,2 (SIGTERM"), text
    assert "not run: rank 1 vanished during 'fault-matrix'" in text
    assert at - read_stamp(stamp1) < BOUND, text
    assert code1 != 0
    text0 = "\n".join(line for _, line in lines0)
    assert text0.count("rank 0 vanished (no verdict, no last words") == 1, text0  # rank 1 alone says it
    assert "the launcher then stopped ranks 1-2 (SIGTERM)" in text0, text0
    assert code0 != 0


def test_the_first_own_failure_is_the_cause_and_lost_peer_errors_are_consequences():
    from ddpdoctor.result import Outcome
    from ddpdoctor.runner.verdict import dead_outcome, pick_cause

    lost = Outcome(0, Status.CRASH, "check raised RuntimeError: [pair.cc:553] Connection closed by peer",
                   finding="check-crashed")
    died = dead_outcome(2, {"signal": None, "code": 0, "log": []}, "collectives")
    assert died.summary == "exited with code 0 during 'collectives' (before its result: an exit 0 mid-check is not success)"
    assert died.status == Status.CRASH and "os._exit or sys.exit" in died.hint
    # the survivor's error was seen first, yet the rank that exited is the cause
    assert pick_cause({0: lost, 2: died, 1: Outcome(1, Status.PASS, "ok")}, {0: 1.0, 2: 1.001, 1: 0.5}) == 2
    own = Outcome(1, Status.FAIL, "disk full", hint="free it", finding="disk")
    assert pick_cause({1: own, 3: Outcome(3, Status.FAIL, "other")}, {1: 2.0, 3: 1.0}) == 3  # earliest wins
    assert pick_cause({0: Outcome(0, Status.PASS, "ok")}, {0: 1.0}) is None
    killed = dead_outcome(1, {"signal": "SIGKILL", "code": None, "hint": "oom?", "log": []}, "x")
    assert killed.summary == "was killed by SIGKILL during 'x'" and killed.hint == "oom?"
