"""``ddpdoctor run``, ``stacks`` and ``explain`` on programs written like the popular DDP tutorials (issue 14).

Real processes on CPU (gloo): an ``mp.spawn`` trainer (quiet epoch longer than the hang timeout, a
rank that raises, a rank that skips a collective, a rank reading a slow file), a
``torch.distributed.launch`` script taking ``--local-rank``, a torchrun DDP loop where one of 3 ranks
skips a step. Every run directory goes under ``tmp_path`` (``XDG_STATE_HOME`` or ``--dir``).

The healthy programs run ``HEALTHY_REPEAT`` times (default 2 in the suite; ``DDPDOCTOR_HEALTHY_REPEAT=10``
for the full check): each must exit 0 with the one success line, and no rank may have been signalled
(no stack file written: the stack signal was never sent).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ddpdoctor.causes.matcher import explain_text, first_failure
from ddpdoctor.exitcodes import ExitCode
from jobscripts import DDP_SKIP, LAUNCH, SPAWN, free_port, mark_line, write_script

CMD = [sys.executable, "-m", "ddpdoctor"]
HEALTHY_REPEAT = int(os.environ.get("DDPDOCTOR_HEALTHY_REPEAT", "2"))


def _env(cli_env, tmp_path, **extra):
    return {**cli_env, "XDG_STATE_HOME": str(tmp_path / "state"), **extra}


def spawn_cmd(script, mode, quiet=0.0, nproc=2):
    return [sys.executable, script, str(free_port()), mode, str(quiet), str(nproc)]


def ddprun(tmp_path, env, job, *, hang=3.0, extra=(), timeout=240, cwd=None):
    run_dir = tmp_path / "run"
    args = CMD + ["run", "--hang-timeout", str(hang), "--dir", str(run_dir), *extra, "--", *job]
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return p, run_dir


def short(path: str) -> str:
    """A script path as ddpdoctor shows it: as given (tmp_path is not under the cwd, so all of it)."""
    return path


def assert_nothing_left(run_dir):
    pids = [int(os.path.basename(p)[5:-5]) for p in glob.glob(str(run_dir / "proc-*.json"))]
    assert pids
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes of the job left running: {alive}"


def assert_never_signalled(run_dir):
    """The stacks were never read: every rank's stack files (the signal's and its hook thread's) are empty."""
    files = glob.glob(str(run_dir / "stacks-*.txt"))
    assert files
    written = [f for f in files + glob.glob(str(run_dir / "stackans-*.txt")) if os.path.getsize(f)]
    assert not written, f"a healthy job was signalled: {written}"


# --- healthy programs: never killed, never signalled ----------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("attempt", range(HEALTHY_REPEAT))
def test_mp_spawn_quiet_epoch_longer_than_the_hang_timeout_is_not_a_hang(cli_env, tmp_path, attempt):
    script = write_script(tmp_path, "spawn_train.py", SPAWN)
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path), spawn_cmd(script, "quiet", 4.5), hang=3,
                        extra=("--keep",))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "rank 0 done 16" in p.stdout and "rank 1 done 16" in p.stdout
    assert "ddpdoctor run: 2 ranks, exit 0 in " in p.stderr and ", no hang, no rank died" in p.stderr
    assert "hung" not in p.stderr
    records = [json.loads(Path(f).read_text()) for f in glob.glob(str(run_dir / "proc-*.json"))]
    assert sorted(r["rank"] for r in records if r["role"] == "spawn") == [0, 1]  # named by rank, not by pid
    assert_never_signalled(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("attempt", range(HEALTHY_REPEAT))
def test_rank_reading_a_slow_file_is_not_a_hang(cli_env, tmp_path, attempt):
    """Rank 1 reads a FIFO fed one byte every 0.2 s for 5 s (longer than --hang-timeout 3) while rank 0
    waits in all_reduce: no output, no CPU, no stack change; the bytes it reads are its progress."""
    script = write_script(tmp_path, "spawn_train.py", SPAWN)
    fifo = tmp_path / "slow"
    os.mkfifo(fifo)
    env = _env(cli_env, tmp_path, SLOW_FILE=str(fifo))
    p, run_dir = ddprun(tmp_path, env, spawn_cmd(script, "slowio", 5), hang=3, extra=("--keep",))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "ddpdoctor run: 2 ranks, exit 0" in p.stderr and "hung" not in p.stderr
    assert_never_signalled(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("attempt", range(HEALTHY_REPEAT))
def test_launch_script_ready_for_local_rank_runs_clean(cli_env, tmp_path, attempt):
    script = write_script(tmp_path, "launch_train.py", LAUNCH)
    job = [sys.executable, "-m", "torch.distributed.launch", "--standalone", "--nproc-per-node=2", script, "x"]
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path, SCRIPT_READY="1"), job, hang=5, extra=("--keep",))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "local rank 0 sum 2" in p.stdout and "local rank 1 sum 2" in p.stdout
    assert "ddpdoctor run: 2 ranks, exit 0" in p.stderr
    assert_never_signalled(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("attempt", range(HEALTHY_REPEAT))
def test_ddp_loop_of_three_ranks_healthy(cli_env, tmp_path, attempt):
    script = write_script(tmp_path, "ddp_train.py", DDP_SKIP)
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
           "--monitor-interval=0.2", script, "train"]
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path), job, hang=5, extra=("--keep",))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "ddpdoctor run: 3 ranks, exit 0" in p.stderr
    assert_never_signalled(run_dir)


# --- broken programs: the verdict names the rank, the call and the cause --------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mp_spawn_rank_that_raises_is_the_cause(cli_env, tmp_path):
    script = write_script(tmp_path, "spawn_train.py", SPAWN)
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path), spawn_cmd(script, "raise"), hang=30)
    assert p.returncode == 1, p.stderr[-3000:]
    verdict = p.stderr[p.stderr.index("ddpdoctor run:"):]
    cause = (f"process 1 of mp.spawn raised RuntimeError: boom on rank 1 at demo_basic "
             f"({short(script)}:{mark_line(SPAWN, 'spawn_raise')})")
    assert verdict.startswith(f"ddpdoctor run: the job failed (exit 1); cause: {cause}")
    assert "(ProcessRaisedException) is its report of that failure" in verdict  # the launcher's part, summarised
    assert "finished" not in verdict and "hung" not in verdict
    assert json.loads((run_dir / "verdict.json").read_text())["cause"] == cause
    # explain on the saved log finds the same cause, attributed to process 1
    e = subprocess.run(CMD + ["explain", "--log", str(run_dir / "output.raw.log")], env=cli_env,
                       capture_output=True, text=True, timeout=60)
    assert e.returncode == 0 and f"first failure: {cause}" in e.stdout
    assert "no known cause" not in e.stdout
    assert_nothing_left(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mp_spawn_rank_that_skips_a_collective_is_the_odd_one_out(cli_env, tmp_path):
    script = write_script(tmp_path, "spawn_train.py", SPAWN)
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path), spawn_cmd(script, "skip", nproc=3), hang=4)
    assert p.returncode == ExitCode.HUNG, p.stderr[-3000:]
    name = short(script)
    assert "ddpdoctor run: hung: no rank made progress for 4s" in p.stderr
    assert (f"  ranks 0,2: all_reduce, called from demo_basic ({name}:{mark_line(SPAWN, 'spawn_all_reduce')})"
            in p.stderr)
    assert (f"  rank 1:    barrier, called from demo_basic ({name}:{mark_line(SPAWN, 'spawn_barrier')})"
            "   <- the odd one out") in p.stderr
    assert {s["rank"] for s in json.loads((run_dir / "verdict.json").read_text())["stacks"]} == {0, 1, 2}
    assert_nothing_left(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_launch_script_without_local_rank_is_explained(cli_env, tmp_path):
    script = write_script(tmp_path, "launch_train.py", LAUNCH)
    job = [sys.executable, "-m", "torch.distributed.launch", "--standalone", "--nproc-per-node=2", script, "x"]
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path), job, hang=30)
    assert p.returncode != 0, p.stderr[-3000:]
    assert "unrecognized arguments: --local-rank=" in p.stderr
    assert "launcher-local-rank-arg: the launcher passes --local-rank, the script does not accept it" in p.stderr
    assert "parser.add_argument('--local-rank', '--local_rank'" in p.stderr
    assert "hung" not in p.stderr
    assert (run_dir / "verdict.txt").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_rank_skipping_a_step_is_the_odd_one_out(cli_env, tmp_path):
    """Rank 1 of 3 skips a training step: it reaches the final barrier while ranks 0,2 are still in
    DDP's backward (the reducer's all_reduce, no torch.distributed frame on the stack)."""
    script = write_script(tmp_path, "ddp_train.py", DDP_SKIP)
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
           "--monitor-interval=0.2", script, "skip"]
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path), job, hang=4)
    assert p.returncode == ExitCode.HUNG, p.stderr[-3000:]
    name = short(script)
    lines = p.stderr.splitlines()
    odd = [" ".join(line.split()) for line in lines if "<- the odd one out" in line]  # column padding varies
    assert odd == [f"rank 1: barrier, called from train ({name}:{mark_line(DDP_SKIP, 'ddp_barrier')}) "
                   "<- the odd one out"], p.stderr[-3000:]
    # ranks 0 and 2 wait in DDP's own communication (forward buffer broadcast or backward all_reduce;
    # which one depends on how gloo paired the step-shifted collectives)
    ddp = [line for line in lines if line.startswith(("  rank 0:", "  rank 2:", "  ranks 0,2:"))]
    assert ddp and all(": DDP " in line for line in ddp), p.stderr[-3000:]
    assert_nothing_left(run_dir)


# --- stacks on an mp.spawn job ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stacks_descends_from_the_mp_spawn_parent(cli_env, tmp_path):
    """``stacks <mp.spawn parent>`` finds the 3 ranks below it (never the resource tracker), by rank."""
    script = write_script(tmp_path, "spawn_train.py", SPAWN)
    run_dir = tmp_path / "run"
    job = subprocess.Popen(CMD + ["run", "--hang-timeout", "300", "--dir", str(run_dir), "--",
                                  *spawn_cmd(script, "skip", nproc=3)], env=_env(cli_env, tmp_path),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        parent = None
        deadline = time.monotonic() + 200
        out = ""
        while time.monotonic() < deadline:
            records = [json.loads(Path(f).read_text()) for f in glob.glob(str(run_dir / "proc-*.json"))]
            top = [r for r in records if r["role"] == "top"]
            ranks = [r for r in records if r["role"] == "spawn" and r.get("rank") is not None]
            if top and len(ranks) == 3:
                parent = top[0]["pid"]
                p = subprocess.run(CMD + ["stacks", str(parent)], env={**cli_env, "DDPDOCTOR_STACKS_METHOD": "handler"},
                                   capture_output=True, text=True, timeout=60)
                out = p.stdout
                # settled: ranks 0 and 2 in the all_reduce rank 1 skipped. Rank 0 may also stay in DDP's
                # backward for good (its reducer's all_reduce met rank 2's plain one): both are true states.
                if "barrier, called from" in out and ("ranks 0,2: all_reduce, called from" in out
                                                      or time.monotonic() > deadline - 170):
                    break
            time.sleep(0.5)
        lines = out.splitlines()
        name = short(script)
        assert lines[0] == "ddpdoctor stacks: 3 rank processes", out
        barrier = f"barrier, called from demo_basic ({name}:{mark_line(SPAWN, 'spawn_barrier')})"
        assert any(line.startswith("rank 1:") and barrier in line for line in lines), out
        if lines[1].startswith("ranks 0,2:"):  # the settled state: rank 1 alone elsewhere
            assert lines[1] == f"ranks 0,2: all_reduce, called from demo_basic ({name}:{mark_line(SPAWN, 'spawn_all_reduce')})"
            assert lines[2] == f"rank 1:    {barrier}   <- the odd one out"
        else:  # rank 0 held in DDP's backward: every rank named with its own place
            assert any(line.startswith("rank 0:") for line in lines[1:4]), out
            assert any(line.startswith("rank 2:") for line in lines[1:4]), out
        assert job.poll() is None  # reading stacks stopped nothing
        # SIGTERM to ddpdoctor run stops the whole tree (mp.spawn parent and its ranks)
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert_nothing_left(run_dir)


# --- the messages, produced for real on CPU --------------------------------------------------------

MESSAGES = r'''
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp


def main(rank, world_size, port, what):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    if what == "syncbn":
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(
            torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3)))
        torch.nn.parallel.DistributedDataParallel(model)  # MARK:messages_ddp
    elif what == "uneven":  # an uneven last batch gathered as is
        t = torch.ones(4 if rank == 0 else 3)
        dist.all_gather([torch.empty_like(t) for _ in range(world_size)], t)
    elif what == "mixed":  # rank 1 sizes the output list for rank 0's batch (gloo refuses locally)
        if rank == 1:
            dist.all_gather([torch.empty(4) for _ in range(world_size)], torch.ones(3))
        import time
        time.sleep(3)  # rank 0: fails later (its peer is gone), so mp.spawn reports rank 1 first
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(2, int(sys.argv[1]), sys.argv[2]), nprocs=2, join=True)
'''


def _messages(tmp_path, cli_env, what, port=None):
    script = write_script(tmp_path, "messages.py", MESSAGES)
    p = subprocess.run([sys.executable, script, str(port or free_port()), what], env=cli_env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert p.returncode != 0
    return p.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_messages_of_real_cpu_jobs_are_explained(cli_env, tmp_path):
    import socket

    log = _messages(tmp_path, cli_env, "syncbn")
    ids = {m.cause.id: m for m in explain_text(log)}
    assert "ddp-syncbn-cpu" in ids, log[-2000:]
    assert first_failure(log).endswith("raised ValueError: SyncBatchNorm layers only work with GPU modules at main "
                                       f"({short(str(tmp_path / 'messages.py'))}:{mark_line(MESSAGES, 'messages_ddp')})")

    log = _messages(tmp_path, cli_env, "mixed")
    ids = {m.cause.id: m for m in explain_text(log)}
    assert "gloo-size-mismatch" in ids and 1 in ids["gloo-size-mismatch"].ranks, log[-2000:]

    log = _messages(tmp_path, cli_env, "uneven")  # gloo aborts the receiving rank: SIGABRT
    ids = {m.cause.id: m for m in explain_text(log)}
    assert "gloo-size-mismatch" in ids, log[-2000:]
    assert "Received data size doesn't match expected size" in ids["gloo-size-mismatch"].evidence
    assert first_failure(log) is not None and "SIGABRT" in first_failure(log)

    with socket.socket() as held:  # the port the program sets in code is taken
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        log = _messages(tmp_path, cli_env, "none", port=port)
    ids = {m.cause.id: m for m in explain_text(log)}
    assert "port-in-use-in-code" in ids and "port-in-use" not in ids, log[-2000:]
    m = ids["port-in-use-in-code"]
    assert "the log shows the port the program actually used" in m.meaning and str(port) in m.meaning
    assert f"if the program sets port {port} in code, change it there" in m.fix
    assert "export MASTER_PORT" not in m.fix
