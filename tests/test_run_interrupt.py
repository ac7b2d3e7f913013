"""``ddpdoctor run``: Ctrl-C on a hung job gives the ranks' stacks and exits 130, and every verdict is the
last thing on screen, after the launcher's own closing traceback (issue 23). Real torchrun gloo jobs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psutil
import pytest

from jobscripts import torchrun
from traces import check_trace

CMD = [sys.executable, "-m", "ddpdoctor", "run"]

HUNG = r'''
import sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} up", flush=True)
if rank == 0:
    dist.barrier()  # MARK:barrier
else:
    time.sleep(3600)  # MARK:sleep
'''


def line_of(text: str, mark: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if f"# MARK:{mark}" in line)


def verdict_block(err: str, head: str) -> list:
    """The lines from the last one starting with ``head`` to the end; every one after it is the verdict's
    (indented): nothing of the job's or the launcher's comes after the verdict."""
    lines = err.rstrip("\n").splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith(head))
    block = lines[start:]
    assert all(line.startswith("  ") for line in block[1:]), "\n".join(lines[-30:])
    return block


def start_run(tmp_path, env, command, extra=()):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(CMD + ["--hang-timeout", "300", "--dir", str(run_dir), *extra, "--", *command], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, run_dir


def wait_for_log(run_dir, text: str, count: int, proc, timeout: float = 120) -> None:
    """Until ``text`` appears ``count`` times in the job's output (the raw log)."""
    log = run_dir / "output.raw.log"
    deadline = time.monotonic() + timeout
    while not (log.exists() and log.read_text(errors="replace").count(text) >= count):
        assert proc.poll() is None, "run ended early"
        assert time.monotonic() < deadline, f"no {text!r} x{count} in {timeout}s"
        time.sleep(0.2)


def finish(proc, timeout: float = 120) -> tuple:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def job_pids(run_dir) -> list:
    return [int(p.name[5:-5]) for p in run_dir.glob("proc-*.json")]


def assert_nothing_left(pids) -> None:
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {alive}"


@pytest.mark.timeout(180)
def test_ctrl_c_on_a_hung_job_prints_both_ranks_stacks_last_and_exits_130(cli_env, tmp_path):
    script = tmp_path / "hung.py"
    script.write_text(HUNG)
    proc, run_dir = start_run(tmp_path, cli_env, torchrun(str(script)))
    try:
        wait_for_log(run_dir, " up", 2, proc)
        time.sleep(2)  # both ranks past their print: in the barrier and the sleep
        proc.send_signal(signal.SIGINT)
        out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-3000:]
    assert "ddpdoctor run: SIGINT: reading the ranks' stacks" in err
    block = verdict_block(err, "ddpdoctor run: interrupted by SIGINT")
    verdict = "\n".join(block)
    assert f"rank 0: barrier, called from <module> ({script}:{line_of(HUNG, 'barrier')})" in verdict, verdict
    assert f"rank 1: <module> ({script}:{line_of(HUNG, 'sleep')})" in verdict, verdict
    assert "stacks read with the in-process handler" in verdict
    # led by the Flight Recorder's reading, dumped on the interrupt while rank 0 was blocked in the barrier
    assert block[1] == "  Flight Recorder: collective #1 of the default group: rank 0 entered, rank 1 never did", verdict
    assert block[2].startswith("    rank 0: #1 barrier") and f"{script}:{line_of(HUNG, 'barrier')}" in block[2], verdict
    assert block[3] == (f"    rank 1: entered nothing in this group; now at <module> ({script}:{line_of(HUNG, 'sleep')})"), \
        verdict
    assert block[-1].startswith("  SIGINT passed to the job; it ") and block[-1].endswith("; exit 130")
    # the launcher's closing traceback came before the verdict, not after it
    assert "SignalException" in err[:err.index("ddpdoctor run: interrupted by SIGINT")]
    assert "stopped by SIGINT" not in err
    saved = (run_dir / "verdict.txt").read_text()
    assert saved.startswith("ddpdoctor run: interrupted by SIGINT") and "barrier" in (run_dir / "stacks.txt").read_text()
    assert_nothing_left(job_pids(run_dir))
    # the timeline: both ranks marked where the interrupt found them, rank 0 inside its barrier (which
    # ended, with an error, when the job was stopped; or never, when the rank was killed first)
    trace = json.loads((run_dir / "trace.json").read_text())
    ranks = check_trace(trace)
    marks = {ranks[e["pid"]]: e for e in trace["traceEvents"] if e["ph"] == "i"}
    assert f"barrier, called from <module> ({script}:{line_of(HUNG, 'barrier')})" in marks[0]["args"]["what"], marks
    assert marks[1]["args"]["what"].startswith("rank 1 interrupted at <module>"), marks
    calls = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(ranks[e["pid"]], e["args"]["op"].split()[0], e["args"]["n"]) for e in calls] == [(0, "barrier", 1)], calls
    assert calls[0]["ts"] < marks[0]["ts"] <= calls[0]["ts"] + calls[0]["dur"] + 1, (calls, marks)


HANDLES = r'''
import sys, time
print("up", flush=True)
try:
    time.sleep(600)
except KeyboardInterrupt:
    print("saved a checkpoint", flush=True)
    sys.exit(0)
'''

IGNORES = r'''
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
print("up", flush=True)
time.sleep(600)
'''


@pytest.mark.timeout(120)
def test_a_job_that_handles_ctrl_c_and_exits_0_gives_0(cli_env, tmp_path):
    script = tmp_path / "handles.py"
    script.write_text(HANDLES)
    proc, run_dir = start_run(tmp_path, cli_env, [sys.executable, str(script)])
    try:
        wait_for_log(run_dir, "up", 1, proc)
        proc.send_signal(signal.SIGINT)
        out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "saved a checkpoint" in out
    block = verdict_block(err, "ddpdoctor run: interrupted by SIGINT")
    assert block[-1] == "  SIGINT passed to the job; it ended by itself (exit 0); exit 0"


@pytest.mark.timeout(120)
def test_a_second_ctrl_c_skips_the_wait(cli_env, tmp_path):
    """A job that ignores SIGINT would be waited on for the stop grace (10 s); a second Ctrl-C stops it at
    once, and the verdict still comes, last, with exit 130."""
    script = tmp_path / "ignores.py"
    script.write_text(IGNORES)
    proc, run_dir = start_run(tmp_path, cli_env, [sys.executable, str(script)])
    try:
        wait_for_log(run_dir, "up", 1, proc)
        pids = job_pids(run_dir)
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60  # until run has read the job's stack (then it passes SIGINT on)
        while not any(p.stat().st_size for p in [*run_dir.glob("stacks-*.txt"), *run_dir.glob("stackans-*.txt")]):
            assert time.monotonic() < deadline, "no stack read"
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    block = verdict_block(err, "ddpdoctor run: interrupted by SIGINT")
    assert block[-1] == "  SIGINT passed to the job; it was stopped at once (SIGKILL: interrupted again) (exit 137); " \
                        "exit 130", block
    assert_nothing_left(pids)


FAILS = r'''
import sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} up", flush=True)
if rank == 1:
    time.sleep(1)
    raise RuntimeError("boom on rank 1")  # MARK:raise
dist.barrier()
'''


@pytest.mark.parametrize("case", ["hung", "failed"])
@pytest.mark.timeout(180)
def test_the_verdict_comes_after_the_launchers_closing_traceback(cli_env, tmp_path, case):
    """torchrun prints a traceback of its own as it ends (SignalException when stopped, ChildFailedError
    when a rank failed); the verdict comes after it: the last lines of run's output are the verdict's."""
    script = tmp_path / f"{case}.py"
    script.write_text(HUNG if case == "hung" else FAILS)
    p = subprocess.run(CMD + ["--hang-timeout", "3", "--dir", str(tmp_path / "run"), "--", *torchrun(str(script))],
                       env=cli_env, capture_output=True, text=True, timeout=150)
    err = p.stderr
    if case == "hung":
        assert p.returncode == 124, err[-3000:]
        head = "ddpdoctor run: hung: no rank made progress for 3s"
        block = verdict_block(err, head)
        assert block[0] == head and block[-1].endswith("exit 124")
        assert "Traceback" in err[:err.rindex(head)]  # torchrun's own, when it was stopped
        assert f"rank 0: barrier, called from <module> ({script}:{line_of(HUNG, 'barrier')})" in "\n".join(block)
    else:
        assert p.returncode == 1, err[-3000:]
        # torchrun ends the job itself (ChildFailedError), or, on a slow machine, rank 0 is left waiting
        # for DEATH_GRACE and run stops the job (torchrun's SignalException): the verdict is last either way
        block = verdict_block(err, "ddpdoctor run: ")
        assert block[0].startswith(("ddpdoctor run: the job failed (exit 1); cause: rank 1 raised RuntimeError: "
                                    "boom on rank 1", "ddpdoctor run: rank 1 ended and the others were left waiting"))
        assert "boom on rank 1" in "\n".join(block)
        assert "Traceback" in err[:err.rindex(block[0])]  # the launcher's own, above the verdict
