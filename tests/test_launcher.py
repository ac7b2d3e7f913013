"""Launcher detection as the runner's joined mode uses it: hostlists, masters, conflicts, bad values."""

from __future__ import annotations

import pytest

from ddpdoctor.errors import LauncherError
from ddpdoctor.training.launcher import derive_port, detect, expand_hostlist


@pytest.mark.parametrize("expr,hosts", [
    ("node01", ["node01"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
    ("a[1-2]b[x,y],c", ["a1bx", "a1by", "a2bx", "a2by", "c"]),
    ("rack1-n[001-002],rack2-n005", ["rack1-n001", "rack1-n002", "rack2-n005"]),
])
def test_hostlist_expansion(expr, hosts):
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize("expr", ["node[01-03", "node01]", "node[5-3]"])
def test_bad_hostlist_names_the_expression(expr):
    with pytest.raises(ValueError, match=r"hostlist"):
        expand_hostlist(expr)


def test_slurm_master_is_the_first_node_and_port_derives_from_the_job():
    env = {"SLURM_PROCID": "5", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "node[07-08]", "SLURM_JOB_ID": "4242",
           "SLURM_NODEID": "1"}
    info = detect(env, argv=[])
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size, info.node_rank) == \
        ("slurm", 5, 8, 1, 4, 1)
    assert info.master_addr == "node07" and info.master_port == derive_port("slurm-4242")
    assert info.master_port != 29500 and 20000 <= info.master_port < 40000
    assert detect({**env, "MASTER_ADDR": "head", "MASTER_PORT": "1234"}, argv=[]).master_port == 1234


def test_salloc_shell_without_a_step_is_not_a_launched_world():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "1"}
    assert detect(env, argv=[]).launcher is None


def test_conflicting_sources_are_reported():
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "OMPI_COMM_WORLD_RANK": "2",
           "OMPI_COMM_WORLD_SIZE": "4"}
    info = detect(env, argv=[])
    assert info.rank == 1
    assert info.conflicts == ("RANK=1 but OMPI_COMM_WORLD_RANK=2; the launcher in charge is torchrun, unset the "
                              "stale OMPI_COMM_WORLD_RANK or launch with one launcher",)


def test_torchrun_under_srun_with_one_task_per_node_is_not_a_conflict():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
           "SLURM_STEP_ID": "0"}
    assert detect(env, argv=[]).conflicts == ()


@pytest.mark.parametrize("env,message", [
    ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' is not an integer"),
    ({"RANK": "abc"}, "RANK='abc' is not an integer"),
    ({"RANK": "abc", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"}, "RANK='abc' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2 is not below"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"}, "MASTER_PORT='http' is not a port number"),
])
def test_invalid_values_raise_in_strict_mode_naming_the_value(env, message):
    assert any(message in p for p in detect(env, argv=[]).problems)
    with pytest.raises(LauncherError, match=message.replace("[", r"\[")):
        detect(env, argv=[], strict=True)
