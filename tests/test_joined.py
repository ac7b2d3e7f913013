"""Joined mode: ddpdoctor inside worlds that torchrun (for real) or crafted srun/mpirun environments start."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid

import pytest

from ddpdoctor.system.ports import free_port

CMD = [sys.executable, "-m", "ddpdoctor", "check"]
FOUNDATION = ["--only", "env,port,process-group"]  # the checks these tests are about; the rest are slower
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _torchrun(args, env, nproc=2, timeout=120):
    return subprocess.run(TORCHRUN + ["--standalone", "--nproc-per-node", str(nproc), "-m", "ddpdoctor", "check"]
                          + args, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("nproc", [2, 3])
def test_torchrun_world_is_joined_and_reported_once(cli_env, nproc, tmp_path):
    path = tmp_path / "r.json"
    p = _torchrun(["--json", str(path)] + (FOUNDATION if nproc == 3 else []), cli_env, nproc=nproc)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("ddpdoctor 0.1.0: torchrun job of") == 1  # rank 0 alone prints
    assert p.stdout.splitlines()[0] == f"ddpdoctor 0.1.0: torchrun job of {nproc} ranks (gloo) on 1 node"
    assert f"(torchrun's store) reachable from ranks 0-{nproc - 1} (slowest connect" in p.stdout
    import json

    doc = json.loads(path.read_text())
    assert doc["world"]["mode"] == "joined" and doc["world"]["launcher"] == "torchrun"
    pg = next(c for c in doc["checks"] if c["name"] == "process-group")
    assert sorted(o["rank"] for o in pg["outcomes"]) == list(range(nproc))


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_torchrun_hung_rank_is_named_by_rank_0_and_every_rank_fails(cli_env):
    env = {**cli_env, "DDPDOCTOR_PLUGINS": "faults", "FAULT_RANK": "1", "FAULT_SLEEP": "600"}
    p = _torchrun(["--only", "fault-hang,process-group", "--timeout", "3"], env)
    assert p.returncode != 0
    assert "rank 1 stuck in hang_forever (tests/faults.py:" in p.stdout, p.stdout + p.stderr
    assert "rank 0 finished" in p.stdout
    assert p.stdout.rstrip().endswith("exit 1")


def _spawn(ranks, env_for, timeout=60):
    procs = [subprocess.Popen(CMD + FOUNDATION + ["--timeout", "3"], env=env_for(r), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in ranks]
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=timeout)
            out.append((p.returncode, o, e))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_world_size_mismatch_names_the_ranks_that_never_arrived(cli_env):
    port = free_port()

    def env_for(r):
        return {**cli_env, "RANK": str(r), "WORLD_SIZE": "3", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "3",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}

    (c0, o0, e0), (c1, o1, e1) = _spawn([0, 1], env_for)
    assert (c0, c1) == (1, 1), o0 + e0 + o1 + e1
    assert "rank 2 never arrived within 3s (WORLD_SIZE=3, arrived: 0-1)" in o0
    assert "[ok]    env" in o0  # what could run on the ranks that came, did
    assert o1 == ""


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_slurm_environment_finds_master_from_the_nodelist(cli_env):
    job = str(int(uuid.uuid4().int % 10**6))

    def env_for(r):
        return {**cli_env, "SLURM_PROCID": str(r), "SLURM_STEP_ID": "0", "SLURM_NTASKS": "3",
                "SLURM_LOCALID": str(r), "SLURM_TASKS_PER_NODE": "3", "SLURM_NODEID": "0",
                "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": job}

    results = _spawn([0, 1, 2], env_for)
    (c0, o0, e0) = results[0]
    assert [c for c, _, _ in results] == [0, 0, 0], o0 + e0
    assert o0.splitlines()[0] == "ddpdoctor 0.1.0: slurm job of 3 ranks (gloo) on 1 node"
    assert all(o == "" for _, o, _ in results[1:])


@pytest.mark.timeout(90)
def test_open_mpi_environment_is_joined(cli_env):
    port = free_port()

    def env_for(r):
        return {**cli_env, "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                "MASTER_PORT": str(port)}

    results = _spawn([0, 1], env_for)
    assert [c for c, _, _ in results] == [0, 0], results
    assert results[0][1].splitlines()[0] == "ddpdoctor 0.1.0: mpi job of 2 ranks (gloo) on 1 node"


@pytest.mark.timeout(60)
def test_rank_that_cannot_reach_the_master_says_so_in_one_line(cli_env):
    port = free_port()  # nothing listens there
    env = {**cli_env, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    p = subprocess.run(CMD + ["--timeout", "1"], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert p.stderr.strip() == (f"ddpdoctor rank 1: port: 127.0.0.1:{port} refused the connection for 1s "
                                f"([Errno 111] Connection refused); fix: start rank 0 first or make MASTER_PORT "
                                f"the same on every node; check that MASTER_ADDR names the master node")


@pytest.mark.timeout(60)
def test_unresolvable_master_is_named(cli_env):
    env = {**cli_env, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "no-such-host.invalid",
           "MASTER_PORT": "12345"}
    p = subprocess.run(CMD + ["--timeout", "2"], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert "MASTER_ADDR 'no-such-host.invalid' does not resolve" in p.stderr


@pytest.mark.timeout(90)
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun (Debian: openmpi-bin)")
def test_real_mpirun_world_is_joined(cli_env):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", "-x", "PYTHONPATH", "-x", "NO_COLOR",
           sys.executable, "-m", "ddpdoctor", "check"] + FOUNDATION
    p = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=80)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("ddpdoctor 0.1.0: mpi job of 3 ranks (gloo) on 1 node") == 1
    assert "3 ranks on 1 node joined in" in p.stdout
