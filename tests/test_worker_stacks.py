"""How ``ddpdoctor check`` reads a worker's Python stacks: by a thread of the worker, under the GIL, with
faulthandler's signal only when that thread does not answer (the GIL held by C code).

faulthandler's all-threads dump from a signal handler walks the other threads' frames while they run
Python, and can crash the process it reads (SIGSEGV, CPython issue 116008): a hung check's diagnosis
must not turn "hung at X" into "died of SIGSEGV". The worker-like processes here set themselves up with
the worker's own function (``answer_stack_requests``) and are read with the supervisor's
(``read_stacks``); the last test is a whole ``ddpdoctor check`` run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import faults
from ddpdoctor.runner.supervisor import Worker, read_stacks
from ddpdoctor.runner.worker import WorkerSpec, make_stack_request
from ddpdoctor.system.stackframes import where_hung
from ddpdoctor.system.threadstacks import END

WORKER_LIKE = r'''
import os, sys, threading, time
from ddpdoctor.runner.worker import WorkerSpec, answer_stack_requests
from faults import churn, hold_the_gil

spec = WorkerSpec(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, backend="gloo", timeout=1.0,
                  store_addr="", store_port=0, prefix="", checks=(), stack_path=sys.argv[2], log_path=os.devnull)
keep = answer_stack_requests(spec)
threading.Thread(target=churn, name="churn", daemon=True).start()  # a thread running Python all the time
print("ready", threading.main_thread().ident, flush=True)
if sys.argv[1] == "gil":
    hold_the_gil()
else:
    time.sleep(120)  # MARK:sleep
'''


def _spec(tmp_path) -> WorkerSpec:
    return WorkerSpec(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, backend="gloo",
                      timeout=1.0, store_addr="", store_port=0, prefix="", checks=(),
                      stack_path=str(tmp_path / "stack0"), log_path=os.devnull)


def _worker_like(cli_env, tmp_path, mode):
    """A process set up as a check's worker (its stack request made first, as the supervisor does) whose
    thread runs Python all the time, its main thread asleep (``sleep``) or in C code that holds the GIL
    (``gil``): (process, the Worker the supervisor would hold for it)."""
    spec = _spec(tmp_path)
    make_stack_request(spec)
    script = tmp_path / "worker_like.py"
    script.write_text(WORKER_LIKE)
    proc = subprocess.Popen([sys.executable, str(script), mode, spec.stack_path], env=cli_env,
                            stdout=subprocess.PIPE, text=True)
    ready, main = proc.stdout.readline().split()
    assert ready == "ready"
    return proc, Worker(spec, proc.pid, main_thread=int(main))


def _line(text: str, where: str) -> int:
    return next(i for i, x in enumerate(where.splitlines(), start=1) if text in x)


def _faults_line(text: str) -> int:
    with open(faults.__file__) as f:
        return _line(text, f.read())


def _stop(proc) -> None:
    proc.kill()
    proc.wait()
    proc.stdout.close()


@pytest.mark.timeout(90)
def test_a_worker_with_a_busy_thread_is_read_by_its_stack_thread_and_survives(cli_env, tmp_path):
    """Twenty reads of a worker whose other thread runs Python (the case faulthandler's dump can crash):
    each is the stack thread's (never the signal: faulthandler's file stays empty), names the line the
    main thread sleeps on, shows the busy thread too, and the process is alive after."""
    proc, worker = _worker_like(cli_env, tmp_path, "sleep")
    try:
        line = _line("MARK:sleep", WORKER_LIKE)
        for _ in range(20):
            dump = read_stacks({0: worker}, wait=3.0)[0]
            assert dump.method == "thread", dump
            assert where_hung(dump.text).endswith(f"worker_like.py:{line})"), dump.text
            assert "in churn\n" in dump.text or "in rec\n" in dump.text, dump.text
            assert dump.text.startswith(f"Thread 0x{worker.main_thread:016x} ") and END not in dump.text
            assert dump.how() == "stack read by the worker's stack thread (under the GIL)"
        assert proc.poll() is None
        assert os.path.getsize(worker.spec.stack_path) == 0  # faulthandler was never asked
    finally:
        _stop(proc)


@pytest.mark.timeout(90)
def test_a_worker_whose_gil_is_held_is_read_by_faulthandler(cli_env, tmp_path):
    """A main thread in C code that never lets the GIL go leaves the stack thread no turn: after 60% of
    the wait the worker gets SIGUSR1 (safe then: no other thread runs Python), the dump says why it
    was read that way, names the main thread's line (the signal may be handled on the busy thread: the
    main thread's block is put first), and the process is alive after."""
    proc, worker = _worker_like(cli_env, tmp_path, "gil")
    try:
        deadline = time.monotonic() + 30
        while True:  # until its main thread holds the GIL (read by the thread just before: not yet)
            dump = read_stacks({0: worker}, wait=1.0)[0]
            if dump.method != "thread" or time.monotonic() > deadline:
                break
            assert "hold_the_gil" not in dump.text, dump.text
            time.sleep(0.1)
        assert dump.method == "signal", dump
        assert dump.why == "its stack thread did not answer within 0.6s (the GIL held?)"
        assert dump.how() == ("stack read with faulthandler (SIGUSR1): its stack thread did not answer within "
                              "0.6s (the GIL held?)")
        gil = _faults_line("2**64")
        assert where_hung(dump.text) == f"match, called from hold_the_gil (tests/faults.py:{gil})", dump.text
        assert dump.text.startswith(f"Current thread 0x{worker.main_thread:016x} "), dump.text  # whichever handled it
        assert proc.poll() is None
    finally:
        _stop(proc)


@pytest.mark.timeout(90)
def test_a_hung_check_names_where_each_rank_hung_and_how_its_stack_was_read(cli_env, tmp_path):
    """A real ``ddpdoctor check`` whose check hangs on rank 1 while a thread of its own runs Python, and on
    rank 2 in C code that holds the GIL: the report names both places, rank 1's stack read by its
    stack thread (the busy thread in it, the rank not killed by the reading), rank 2's by faulthandler
    with the reason; the JSON report says which way each was read."""
    env = {**cli_env, "DDPDOCTOR_PLUGINS": "faults", "FAULT_RANK": "1", "FAULT_GIL_RANK": "2"}
    path = tmp_path / "report.json"
    p = subprocess.run([sys.executable, "-m", "ddpdoctor", "check", "--nproc", "3", "--timeout", "2", "-v",
                        "--only", "fault-hang-busy", "--json", str(path)],
                       env=env, capture_output=True, text=True, timeout=80)
    out = p.stdout
    hang, gil = _faults_line("time.sleep(seconds)"), _faults_line("2**64")
    assert (f"rank 1 stuck in hang_forever (tests/faults.py:{hang}); rank 2 stuck in match, called from "
            f"hold_the_gil (tests/faults.py:{gil}); rank 0 finished") in out, out + p.stderr
    lines = [x.strip() for x in out.splitlines()]
    one = lines.index(f"rank 1: timeout: did not finish: in hang_forever (tests/faults.py:{hang})")
    assert lines[one + 1] == "stack read by the worker's stack thread (under the GIL)", out
    rank1 = lines[one:lines.index(next(x for x in lines if x.startswith("rank 2:")))]
    assert any(x.endswith((" in rec", " in churn")) for x in rank1), out  # its busy thread, read too
    two = lines.index(f"rank 2: timeout: did not finish: in match, called from hold_the_gil (tests/faults.py:{gil})")
    assert lines[two + 1] == ("stack read with faulthandler (SIGUSR1): its stack thread did not answer within 0.6s "
                              "(the GIL held?)"), out
    assert "SIGSEGV" not in out
    (result,) = [r for r in json.loads(path.read_text())["checks"] if r["name"] == "fault-hang-busy"]
    reads = {o["rank"]: o["data"].get("stack_read") for o in result["outcomes"]}
    assert reads == {0: None, 1: "thread", 2: "signal"}, reads
