"""The ``ddpdoctor`` command as a user runs it: real subprocesses, real signals, real exit codes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from ddpdoctor.exitcodes import ExitCode

CMD = [sys.executable, "-m", "ddpdoctor"]


def run(args, env, timeout=60):
    return subprocess.run(CMD + args, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(90)
def test_check_passes_and_writes_versioned_json(cli_env, tmp_path):
    path = tmp_path / "report.json"
    p = run(["check", "--json", str(path)], cli_env)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "ddpdoctor 0.1.0: local world of 2 ranks (gloo) on 1 node"
    names = ["env", "port", "process-group", "collectives", "sampler", "param-sync", "bn-sync"]
    status_lines = [line for line in lines if line.startswith("[")]
    assert [line.split()[0:2] for line in status_lines] == [["[ok]", n] for n in names]
    assert lines[lines.index(status_lines[4]) + 1].split()[:2] == ["tip:", "call"]  # sampler's fix
    assert lines[-1].startswith("7 passed in ") and lines[-1].endswith("; exit 0")
    assert "Traceback" not in p.stderr
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1 and doc["status"] == "pass" and doc["exit_code"] == 0
    assert doc["world"]["world_size"] == 2 and doc["world"]["backend"] == "gloo"
    assert [c["name"] for c in doc["checks"]] == names
    for c in doc["checks"]:
        assert set(c) >= {"name", "status", "summary", "hint", "ranks", "outcomes"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,needle", [
    (["check", "--only", "proces-group"], "no check named 'proces-group'; did you mean 'process-group'?"),
    (["check", "--nproc", "0"], "'0' is out of range; accepted: an integer from 1 to 1024"),
    (["check", "--master-port", "70000"], "'70000' is out of range; accepted: an integer from 0 to 65535"),
    (["check", "--backend", "nccl"], "--backend nccl"),
    (["check", "--backend", "mpi"], "'mpi' is not one of 'gloo', 'nccl'"),
    (["check", "--timeout", "0"], "'0' is out of range; accepted: a number > 0 and <= 86400 (seconds)"),
    (["frobnicate"], "No such command 'frobnicate'"),
])
def test_bad_input_is_one_line_and_exit_2(cli_env, args, needle):
    p = run(args, cli_env)
    assert p.returncode == ExitCode.USAGE, p.stdout + p.stderr
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert needle in err
    assert "Traceback" not in err and p.stdout == ""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env_patch,needle", [
    ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' is not an integer"),
    ({"RANK": "abc"}, "RANK='abc' is not an integer"),
    ({"RANK": "abc", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"}, "RANK='abc' is not an integer"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK=3 is not below WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"},
     "MASTER_PORT=99999 is out of range"),
])
def test_bad_launcher_environment_is_a_usage_error(cli_env, env_patch, needle):
    p = run(["check"], {**cli_env, **env_patch})
    assert p.returncode == ExitCode.USAGE, p.stdout + p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and needle in p.stderr


@pytest.mark.timeout(60)
def test_list_names_every_check(cli_env):
    p = run(["list"], cli_env)
    assert p.returncode == 0
    names = [line.split()[0] for line in p.stdout.splitlines()]
    assert names == ["env", "port", "process-group", "collectives", "sampler", "param-sync", "bn-sync",
                     "collectives-bench", "locate"]


@pytest.mark.timeout(60)
def test_env_prints_the_environment_and_redacts_secrets(cli_env):
    env = {**cli_env, "HF_TOKEN": "hf_supersecret123", "NCCL_DEBUGG": "INFO", "MY_PASSWORD": "pw-xyz",
           "NCCL_SOCKET_IFNAME": "eth0"}
    p = run(["env"], env)
    assert p.returncode == 0
    assert "hf_supersecret123" not in p.stdout and "pw-xyz" not in p.stdout
    assert "NCCL_SOCKET_IFNAME=eth0" in p.stdout
    assert "warn: NCCL_DEBUGG is not a variable NCCL or PyTorch reads; did you mean NCCL_DEBUG?" in p.stdout
    assert p.stdout.splitlines()[0].startswith("ddpdoctor ") and p.stdout.splitlines()[4].startswith("python ")


@pytest.mark.timeout(90)
def test_secrets_never_reach_the_report_or_json(cli_env, tmp_path):
    path = tmp_path / "r.json"
    env = {**cli_env, "WANDB_API_KEY": "wandb-secret-777", "TORCH_NCCL_SECRET_TOKEN": "tok-888"}
    p = run(["check", "-v", "--json", str(path), "--only", "env"], env)
    assert p.returncode == 0, p.stderr
    text = p.stdout + path.read_text()
    assert "wandb-secret-777" not in text and "tok-888" not in text
    assert "TORCH_NCCL_SECRET_TOKEN=<redacted>" in p.stdout


@pytest.mark.timeout(60)
def test_strict_turns_warnings_into_failure(cli_env):
    env = {**cli_env, "NCCL_DEBUGG": "INFO"}
    p = run(["check", "--only", "env"], env)
    assert p.returncode == 0 and "[warn]  env" in p.stdout
    assert "fix: rename NCCL_DEBUGG to NCCL_DEBUG" in p.stdout
    p = run(["check", "--only", "env", "--strict"], env)
    assert p.returncode == ExitCode.CHECK_FAILED


def _wait_for_workers(proc, n, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = psutil.Process(proc.pid).children(recursive=True)
        if len(kids) >= n:
            return kids
        time.sleep(0.05)
    raise AssertionError(f"only {len(kids)} workers started")


def _assert_gone(procs, timeout=5):
    deadline = time.monotonic() + timeout
    alive = procs
    while time.monotonic() < deadline:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.05)
    raise AssertionError(f"left running: {[p.pid for p in alive]}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig,name", [(signal.SIGINT, "SIGINT"), (signal.SIGTERM, "SIGTERM")])
def test_interrupt_prints_partial_report_and_leaves_nothing(cli_env, sig, name):
    env = {**cli_env, "DDPDOCTOR_PLUGINS": "faults", "FAULT_RANK": "0", "FAULT_SLEEP": "600"}
    proc = subprocess.Popen(CMD + ["check", "--only", "env,fault-hang,fault-none", "--timeout", "60"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        workers = _wait_for_workers(proc, 2)
        time.sleep(1.0)  # let env finish and fault-hang start
        os.killpg(proc.pid, sig) if sig == signal.SIGINT else proc.send_signal(sig)  # Ctrl-C hits the group
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == ExitCode.INTERRUPTED, out + err
    assert "[ok]    env" in out
    assert re.search(rf"\[skip\]\s+fault-hang\s+interrupted \({name}\) while running", out), out
    assert re.search(rf"\[skip\]\s+fault-none\s+not run: interrupted \({name}\)", out), out
    assert out.splitlines()[-1].endswith(f"exit 130 (interrupted by {name})")
    assert "Traceback" not in err
    _assert_gone(workers)


@pytest.mark.timeout(60)
def test_sigkill_of_ddpdoctor_takes_the_workers_and_frees_the_port(cli_env, tmp_path):
    from ddpdoctor.system.ports import free_port

    port = free_port()
    # TMPDIR: a SIGKILLed process cannot remove its own work folder; it lands in the test's tmp_path
    env = {**cli_env, "DDPDOCTOR_PLUGINS": "faults", "FAULT_RANK": "1", "FAULT_SLEEP": "600", "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(CMD + ["check", "--only", "fault-hang", "--timeout", "60", "--master-port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = _wait_for_workers(proc, 2)
    time.sleep(0.5)
    proc.kill()
    proc.wait(timeout=10)
    _assert_gone(workers)
    with socket.socket() as s:  # the port is free again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    p = run(["check", "--only", "port,process-group", "--master-port", str(port)], cli_env)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.timeout(60)
def test_rank_killed_with_sigkill_mid_collective_is_named_and_nothing_survives(cli_env):
    env = {**cli_env, "DDPDOCTOR_PLUGINS": "faults", "FAULT_RANK": "1"}  # rank 1 skips the all_reduce
    proc = subprocess.Popen(CMD + ["check", "--nproc", "3", "--timeout", "20",
                                   "--only", "process-group,fault-skip-collective,fault-none"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        workers = sorted(_wait_for_workers(proc, 3), key=lambda p: p.pid)  # forked in rank order
        time.sleep(1.5)  # ranks 0 and 2 enter all_reduce; rank 1 skips it
        workers[0].kill()  # SIGKILL rank 0 mid-collective
        out, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out + err
    assert re.search(r"\[CRASH\]\s+fault-skip-collective\s+rank 0 was killed by SIGKILL during 'fault-skip-collective'; "
                     r"rank 2 was left waiting in all_reduce, called from run \(tests/faults.py:\d+\)"
                     r"(, then lost the connection to it \([^)]*\))?; rank 1 finished", out), out
    assert "fix: SIGKILL is often the kernel's OOM killer" in out
    _assert_gone(workers)
