"""`srun -n N ddpdoctor check` on a real (single-node) Slurm cluster started for the test."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slurm_local import LocalSlurm, slurm_unavailable

pytestmark = pytest.mark.skipif(slurm_unavailable() is not None, reason=str(slurm_unavailable()))


@pytest.fixture(scope="module")
def slurm():
    try:
        cluster = LocalSlurm(cpus=4).__enter__()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:  # the daemons, not ddpdoctor: skip, say why
        pytest.skip(f"a local Slurm could not start here: {exc}")
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.timeout(120)
def test_srun_world_is_joined_and_reported_once(slurm, cli_env):
    env = {**cli_env, "SLURM_CONF": slurm.env["SLURM_CONF"]}
    p = subprocess.run(["srun", "-n", "3", "--oversubscribe", sys.executable, "-m", "ddpdoctor", "check",
                        "--only", "env,port,process-group"], env=env, capture_output=True, text=True, timeout=100)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("ddpdoctor 0.1.0: slurm job of 3 ranks (gloo) on 1 node") == 1
    assert "3 ranks on 1 node joined in" in p.stdout
    assert "is free and bound on the master; reachable from ranks 1-2" in p.stdout


@pytest.mark.timeout(120)
def test_srun_failure_exits_non_zero_on_every_task(slurm, cli_env):
    env = {**cli_env, "SLURM_CONF": slurm.env["SLURM_CONF"], "DDPDOCTOR_PLUGINS": "faults", "FAULT_RANK": "1"}
    p = subprocess.run(["srun", "-n", "2", "--oversubscribe", "--kill-on-bad-exit=0", sys.executable, "-m",
                        "ddpdoctor", "check", "--only", "fault-raise"], env=env, capture_output=True, text=True,
                       timeout=100)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "rank 1: check raised ValueError: injected failure on rank 1" in p.stdout


@pytest.mark.timeout(120)
def test_srun_rank_killed_mid_collective_leads_the_verdict(slurm, cli_env, tmp_path):
    from rootcause import Cell, cell_env, read_stamp, run_cli, verdict_line, verify

    cell = Cell("sigkill", "during", 3, 1, "srun")
    stamp = str(tmp_path / "stamp")
    env = {**cell_env(cli_env, cell, stamp), "SLURM_CONF": slurm.env["SLURM_CONF"]}
    code, lines = run_cli(["srun", "-n", "3", "--oversubscribe", "--kill-on-bad-exit=0", sys.executable, "-m",
                           "ddpdoctor", "check", "--timeout", "30", "--only", "fault-matrix,fault-none"], env, 100)
    text = "\n".join(line for _, line in lines)
    found = verdict_line(lines)
    assert found is not None, text
    at, status, summary = found
    verify(cell, status, summary)
    assert at - read_stamp(stamp) < 15, text
    assert code == 1, text
