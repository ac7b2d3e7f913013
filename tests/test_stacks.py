"""``ddpdoctor stacks``: find a live job's ranks, read their stacks without stopping them, group them."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from ddpdoctor.system.stackframes import where_hung
from ddpdoctor.postmortem.rundir import inject_files
from ddpdoctor.postmortem.stacks import RankProcess, StackReading, pyspy_to_faulthandler, render_groups
from jobscripts import line_of, torchrun, write_train

CMD = [sys.executable, "-m", "ddpdoctor"]

PYSPY_DUMP = """Process 4242: python train.py hang
Python v3.11.7 (/usr/bin/python3.11)

Thread 4250 (idle): "ddpdoctor-heartbeat"
    beat (/tmp/run/.inject/sitecustomize.py:62)
Thread 4242 (idle): "MainThread"
    all_reduce (/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252)
    wrapper (/usr/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83)
    step (/home/me/proj/train.py:88)
    <module> (/home/me/proj/train.py:120)
"""


@pytest.mark.timeout(10)
def test_pyspy_dump_is_read_like_faulthandler():
    assert where_hung(pyspy_to_faulthandler(PYSPY_DUMP)) == "all_reduce, called from step (/home/me/proj/train.py:88)"


def _reading(rank, place, collective):
    stack = 'File "/x/torch/distributed/distributed_c10d.py", line 1 in all_reduce' if collective else "x"
    return StackReading(RankProcess(100 + rank, rank), "handler", stack, place=place)


@pytest.mark.timeout(10)
def test_grouping_names_the_odd_one_out():
    lines = render_groups([_reading(0, "all_reduce at a", True), _reading(2, "all_reduce at a", True),
                           _reading(3, "all_reduce at a", True), _reading(1, "read (dataset.py:40)", False)])
    assert lines[0] == "ranks 0,2-3: all_reduce at a"
    assert lines[1] == "rank 1:      read (dataset.py:40)   <- the odd one out"
    # two ranks, both in a collective: no odd one by count or by place
    lines = render_groups([_reading(0, "all_reduce at a", True), _reading(1, "barrier at b", True)])
    assert not any("odd one" in line for line in lines)


@pytest.fixture
def job_with_handler(cli_env, tmp_path):
    """A 3-rank torchrun job where rank 1 skipped an all_reduce, started with the injected handler."""
    run_dir = tmp_path / "run"
    inject = run_dir / ".inject"
    inject.mkdir(parents=True)
    for source, name in inject_files():  # the hook and the modules it loads (the stack thread, the Flight Recorder)
        shutil.copy(source, inject / name)
    env = {**cli_env, "PYTHONPATH": f"{inject}{os.pathsep}{cli_env['PYTHONPATH']}", "DDPDOCTOR_RUN_DIR": str(run_dir),
           "DDPDOCTOR_BEAT_S": "0.2"}
    script = write_train(tmp_path)
    proc = subprocess.Popen(torchrun(script, "skip", "10", nproc=3), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    pids = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(pids) < 3:
            pids = [int(os.path.basename(p)[5:-5]) for p in glob.glob(str(run_dir / "proc-*.json"))]
            time.sleep(0.2)
        assert len(pids) == 3
        yield proc, pids, script, env
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait()
        psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_stacks_of_a_live_torchrun_job(job_with_handler, cli_env):
    proc, pids, script, env = job_with_handler
    deadline = time.monotonic() + 60
    while True:  # the ranks may still be importing torch, or between two steps, on a busy machine: ask until all hang
        p = subprocess.run(CMD + ["stacks", str(proc.pid)], env={**cli_env, "DDPDOCTOR_STACKS_METHOD": "handler"},
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        if ("barrier" in p.stdout and "ranks 0,2: all_reduce" in p.stdout) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    lines = p.stdout.splitlines()
    name = script  # shown as given: not under the cwd, so the whole path
    assert lines[0] == "ddpdoctor stacks: 3 rank processes"
    assert lines[1] == f"ranks 0,2: all_reduce, called from train ({name}:{line_of('all_reduce')})"
    assert lines[2] == f"rank 1:    barrier, called from train ({name}:{line_of('barrier')})   <- the odd one out"
    assert lines[3] == "stacks read with the in-process handler"
    assert "not reachable" not in p.stdout
    # beside each stack, the rank's last recorded collectives, asked of the live ranks (a dump thread):
    # skip mode, 10 steps: ranks 0 and 2 are in all_reduce #10, rank 1 (it skipped one) in barrier #10;
    # gloo leaves every entry "scheduled": completion is pg_status's, never "scheduled" for finished work
    sections = {}
    for block in p.stdout.split("\n--- ")[1:]:
        head, _, body = block.partition("\n")
        sections[head.split(" (pid")[0]] = body
    for rank in (0, 2):
        body = sections[f"rank {rank}"]
        assert body.startswith("Flight Recorder, last collectives:\n"), body[:600]
        assert "  #8 all_reduce [4] Float (default group): completed\n" in body, body[:600]
        assert "  #9 all_reduce [4] Float (default group): completed\n" in body, body[:600]
        assert "  #10 all_reduce [4] Float (default group): entered, not completed\n" in body, body[:600]
    assert "  #10 barrier" in sections["rank 1"] and "(default group): entered, not completed" in sections["rank 1"]
    assert "scheduled" not in p.stdout
    assert proc.poll() is None and all(psutil.pid_exists(p) for p in pids)  # the job was not stopped


@pytest.mark.timeout(60)
def test_a_process_without_handler_is_never_signalled(cli_env):
    env = {**cli_env, "RANK": "0", "LOCAL_RANK": "0", "DDPDOCTOR_STACKS_METHOD": "handler"}
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        time.sleep(0.3)
        p = subprocess.run(CMD + ["stacks", str(sleeper.pid)], env=env, capture_output=True, text=True, timeout=30)
        assert p.returncode == 1
        assert "rank 0 (pid %d): no stack: not started under 'ddpdoctor run'" % sleeper.pid in p.stdout
        assert ("Flight Recorder: not reachable (the job was not started under 'ddpdoctor run', which asks each "
                "rank for its last collectives)") in p.stdout.splitlines()
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.timeout(30)
def test_unknown_pid_is_a_usage_error(cli_env):
    p = subprocess.run(CMD + ["stacks", "999999999"], env=cli_env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and p.stderr.startswith("error[no-such-pid]: no process with PID 999999999")


DDP_BACKWARD = '''Current thread 0x00007f0000000001 (most recent call first):
  File "/v/lib/python3.11/site-packages/torch/autograd/graph.py", line 829 in _engine_run_backward
  File "/v/lib/python3.11/site-packages/torch/autograd/__init__.py", line 364 in backward
  File "/v/lib/python3.11/site-packages/torch/_tensor.py", line 630 in backward
  File "/home/me/proj/train.py", line 30 in train
  File "/home/me/proj/train.py", line 40 in <module>
'''
DDP_BUFFERS = '''Current thread 0x00007f0000000001 (most recent call first):
  File "/v/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 2130 in _distributed_broadcast_coalesced
  File "/v/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 2050 in _default_broadcast_coalesced
  File "/v/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 2030 in _sync_buffers
  File "/v/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1600 in _pre_forward
  File "/v/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1690 in forward
  File "/home/me/proj/train.py", line 29 in train
'''
BARRIER = '''Current thread 0x00007f0000000001 (most recent call first):
  File "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4900 in barrier
  File "/v/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/me/proj/train.py", line 33 in train
'''


@pytest.mark.timeout(10)
def test_ddp_communication_counts_as_a_collective():
    from ddpdoctor.postmortem.stacks import collective_of, describe_place

    assert collective_of(DDP_BACKWARD) == "DDP backward (reducer all_reduce)"
    assert collective_of(DDP_BUFFERS) == "DDP forward (buffer broadcast)"
    assert collective_of(BARRIER) == "barrier"
    assert collective_of('Current thread 0x1 (most recent call first):\n  File "/p/x.py", line 3 in read\n') is None
    assert describe_place(DDP_BACKWARD) == "DDP backward (reducer all_reduce), called from train (/home/me/proj/train.py:30)"
    # ranks 0,2 in DDP's backward, rank 1 in a barrier: rank 1 is the odd one out (it skipped a step)
    readings = [StackReading(RankProcess(100 + r, r), "handler", s, place=describe_place(s))
                for r, s in ((0, DDP_BACKWARD), (1, BARRIER), (2, DDP_BACKWARD))]
    lines = render_groups(readings)
    assert lines[0] == "ranks 0,2: DDP backward (reducer all_reduce), called from train (/home/me/proj/train.py:30)"
    assert lines[1] == "rank 1:    barrier, called from train (/home/me/proj/train.py:33)   <- the odd one out"


MP_PARENT = r'''
import multiprocessing as mp, sys, time


def work():
    time.sleep(60)


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    lock = ctx.Lock()  # starts multiprocessing's resource tracker
    procs = [ctx.Process(target=work) for _ in range(2)]
    for p in procs:
        p.start()
    print("ready", flush=True)
    for p in procs:
        p.join()
'''


@pytest.mark.timeout(60)
def test_multiprocessing_children_are_the_ranks_never_the_resource_tracker(cli_env, tmp_path):
    from ddpdoctor.postmortem.stacks import find_ranks

    script = tmp_path / "parent.py"
    script.write_text(MP_PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], env=cli_env, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        children = psutil.Process(parent.pid).children()
        tracker = [c for c in children if "resource_tracker" in " ".join(c.cmdline())]
        assert tracker and len(children) == 3
        workers = sorted((c for c in children if c not in tracker), key=lambda c: (c.create_time(), c.pid))
        ranks = find_ranks([parent.pid])
        assert [(r.label, r.pid) for r in ranks] == [(f"process {i}", c.pid) for i, c in enumerate(workers)]
        # given every child's PID, the tracker is still not a rank
        assert {r.pid for r in find_ranks([c.pid for c in children])} == {c.pid for c in children} - {tracker[0].pid}
        # and without a handler, nothing is signalled
        p = subprocess.run(CMD + ["stacks", str(parent.pid)], env={**cli_env, "DDPDOCTOR_STACKS_METHOD": "handler"},
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 1 and p.stdout.startswith("ddpdoctor stacks: 2 rank processes")
        assert all(c.is_running() for c in children)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        parent.stdout.close()


@pytest.mark.timeout(10)
def test_ranks_a_step_apart_in_ddp_are_one_family():
    """Rank 1 skipped a step: rank 0 waits in DDP's forward, rank 2 in its backward, rank 1 in a barrier."""
    from ddpdoctor.postmortem.stacks import describe_place

    readings = [StackReading(RankProcess(100 + r, r), "handler", s, place=describe_place(s))
                for r, s in ((0, DDP_BUFFERS), (1, BARRIER), (2, DDP_BACKWARD))]
    odd = [line for line in render_groups(readings) if "odd one out" in line]
    assert odd == ["rank 1: barrier, called from train (/home/me/proj/train.py:33)   <- the odd one out"]


BUSY = r'''
import re, sys, threading, time


def rec(n):
    return 0 if n == 0 else rec(n - 1) + 1


def churn():  # a thread running Python all the time, as a DataLoader's pin-memory thread does
    while True:
        rec(300)


threading.Thread(target=churn, daemon=True, name="churn").start()
print("ready", flush=True)
if sys.argv[1] == "gil":
    re.match(r"(a+)+$", "a" * 64 + "b")  # MARK:gil (C code that never lets the GIL go)
else:
    time.sleep(120)  # MARK:sleep
'''


def _busy_job(cli_env, tmp_path, mode):
    """A process under ddpdoctor's hook (as a rank) whose thread runs Python all the time, its main thread
    asleep (``sleep``) or in C code that holds the GIL (``gil``): (process, RankProcess)."""
    run_dir = tmp_path / "run"
    inject = run_dir / ".inject"
    inject.mkdir(parents=True)
    for source, name in inject_files():
        shutil.copy(source, inject / name)
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    env = {**cli_env, "PYTHONPATH": f"{inject}{os.pathsep}{cli_env['PYTHONPATH']}", "DDPDOCTOR_RUN_DIR": str(run_dir),
           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "DDPDOCTOR_STACKS_METHOD": "handler"}
    proc = subprocess.Popen([sys.executable, str(script), mode], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    deadline = time.monotonic() + 30
    while not (run_dir / f"proc-{proc.pid}.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, RankProcess(proc.pid, 0, run_dir=str(run_dir))


def _busy_line(mark):
    return next(i for i, x in enumerate(BUSY.splitlines(), start=1) if f"MARK:{mark}" in x)


@pytest.mark.timeout(90)
def test_reading_a_busy_process_never_signals_it(cli_env, tmp_path, monkeypatch):
    """faulthandler's all-threads dump from a signal handler walks the other threads' frames while they
    run, and crashed such a process within three reads (SIGSEGV, CPython issue 116008). The hook's own
    thread reads the stacks under the GIL: twenty reads, all by the hook, the process alive after."""
    from ddpdoctor.postmortem.stacks import read_stacks

    monkeypatch.setenv("DDPDOCTOR_STACKS_METHOD", "handler")
    proc, rank = _busy_job(cli_env, tmp_path, "sleep")
    try:
        for _ in range(20):
            (r,) = read_stacks([rank], 3.0)
            assert r.method == "handler", (r.method, r.error, r.fallback)
            assert r.place == f"<module> ({tmp_path / 'busy.py'}:{_busy_line('sleep')})", r.stack
            assert ("in rec\n" in r.stack or "in churn\n" in r.stack) and "# ddpdoctor stacks end" not in r.stack
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@pytest.mark.timeout(90)
def test_a_process_whose_gil_is_held_is_read_by_faulthandler(cli_env, tmp_path, monkeypatch):
    """A main thread stuck in C code that holds the GIL (a catastrophic regular expression) leaves the
    hook's thread no turn: the reader says so and falls back to the signal, safe then (no thread runs
    Python), and names the line."""
    from ddpdoctor.postmortem.stacks import read_stacks, render_groups

    monkeypatch.setenv("DDPDOCTOR_STACKS_METHOD", "handler")
    proc, rank = _busy_job(cli_env, tmp_path, "gil")
    try:
        time.sleep(0.5)
        (r,) = read_stacks([rank], 3.0)
        assert r.method == "signal", (r.method, r.error)
        assert r.place.endswith(f"<module> ({tmp_path / 'busy.py'}:{_busy_line('gil')})"), (r.place, r.stack)
        assert "did not answer within 1.8s (the GIL held?)" in r.fallback
        assert f"rank 0 (pid {proc.pid}): read with faulthandler: its hook's thread did not answer" in \
            "\n".join(render_groups([r]))
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
