"""Rank information: crafted launcher environments, no process group, and real gloo worlds."""

from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch
import torch.distributed as dist

import ddpdoctor.training as lib
from ddpdoctor.compat import accelerate, detectron2, lightning, mmengine
from ddpdoctor.training import (RankConflictWarning, get_local_rank, get_local_world_size, get_node_rank, get_rank,
                            get_world_size, is_distributed, is_main_process, rank_info)
from worlds import run_world

_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL")
_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variables and no --local_rank argument; tests add what they need."""
    for name in list(os.environ):
        if name in _NAMES or name.startswith(_PREFIXES):
            monkeypatch.delenv(name)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    monkeypatch.setattr("ddpdoctor.training.ranks._WARNED", set())  # each test sees its own warn-once lines
    return monkeypatch


def _values():
    return (get_rank(), get_world_size(), get_local_rank(), get_local_world_size(), get_node_rank())


LAUNCHERS = {
    "torchrun": ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"},
                 [], (5, 8, 1, 4, 1),
                 {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK", "node_rank": "GROUP_RANK"}),
    "slurm": ({"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NODEID": "1",
               "SLURM_STEP_ID": "0", "SLURM_TASKS_PER_NODE": "4(x2)"},
              [], (6, 8, 2, 4, 1),
              {"rank": "SLURM_PROCID", "world_size": "SLURM_NTASKS", "local_rank": "SLURM_LOCALID",
               "node_rank": "SLURM_NODEID"}),
    "mpi": ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
             "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1"},
            [], (3, 4, 1, 2, 1),
            {"rank": "OMPI_COMM_WORLD_RANK", "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK"}),
    "pmi": ({"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"},
            [], (2, 3, 2, 3, 0), {"rank": "PMI_RANK", "world_size": "PMI_SIZE", "local_rank": "MPI_LOCALRANKID"}),
    "legacy-under-env": ({"RANK": "1", "WORLD_SIZE": "2"}, ["--local_rank=1"], (1, 2, 1, 2, 0),
                         {"rank": "RANK", "local_rank": "--local_rank"}),
    "legacy-arg-only": ({}, ["--local_rank", "3"], (0, 1, 3, 1, 0), {"local_rank": "--local_rank"}),
    "none": ({}, [], (0, 1, 0, 1, 0), {"rank": "default", "world_size": "default"}),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_launcher_environments_give_rank_values_and_sources(clean_env, name):
    env, argv, expected, sources = LAUNCHERS[name]
    for key, value in env.items():
        clean_env.setenv(key, value)
    clean_env.setattr(sys, "argv", ["train.py", *argv])
    assert _values() == expected
    info = rank_info(warn=False)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.node_rank) == expected
    assert {k: info.sources[k] for k in sources} == sources
    assert info.warnings == ()
    assert info.backend is None
    assert is_distributed() is (expected[1] > 1)
    if name == "legacy-arg-only":  # a local rank without a global one: rank-zero code runs only where it is 0
        with pytest.warns(RankConflictWarning, match=r"--local_rank=3 is set but no global rank variable"):
            assert is_main_process() is False
    else:
        assert is_main_process() is (expected[0] == 0)
    assert is_main_process(local=True) is (expected[2] == 0)
    # Nothing here may start a process group or CUDA as a side effect.
    assert not dist.is_initialized()
    assert not torch.cuda.is_initialized()


@pytest.mark.timeout(30)
def test_rank_info_warns_when_rank_and_slurm_procid_disagree(clean_env):
    for key, value in {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "SLURM_PROCID": "2",
                       "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0", "SLURM_LOCALID": "2"}.items():
        clean_env.setenv(key, value)
    with pytest.warns(RankConflictWarning, match=r"RANK=1 but SLURM_PROCID=2"):
        info = rank_info()
    assert info.rank == 1 and info.launcher == "torchrun"
    assert len(info.warnings) == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize("env, expected", [
    ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, "LOCAL_RANK is missing"),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0", "SLURM_NTASKS_PER_NODE": "4"},
     "SLURM_LOCALID and LOCAL_RANK are missing"),
])
def test_rank_info_warns_when_local_rank_is_missing_on_a_multi_node_job(clean_env, env, expected):
    for key, value in env.items():
        clean_env.setenv(key, value)
    with pytest.warns(RankConflictWarning, match=expected):
        info = rank_info()
    assert info.local_rank == 0 and info.sources["local_rank"] == "default"


@pytest.mark.timeout(30)
def test_rank_info_without_conflicts_issues_no_warning(clean_env):
    for key, value in LAUNCHERS["torchrun"][0].items():
        clean_env.setenv(key, value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rank_info().warnings == ()


def _world_ranks(rank, world):
    env_rank_before = get_rank()
    info = rank_info(warn=False)
    return (env_rank_before, get_world_size(), get_local_rank(), is_distributed(), is_main_process(),
            info.sources["rank"], info.backend, info.warnings)


@pytest.mark.timeout(60)
def test_ranks_come_from_the_process_group_in_a_gloo_world():
    results = run_world(_world_ranks, 3, timeout=30)
    assert results == [(r, 3, r, True, r == 0, "process_group", "gloo", ()) for r in range(3)]


def _stale_env(rank, world):
    info = rank_info(warn=False)
    return get_rank(), info.warnings


@pytest.mark.timeout(60)
def test_process_group_wins_over_a_stale_rank_variable_and_says_so():
    results = run_world(_stale_env, 2, env={"RANK": "0"}, timeout=30)
    assert results[0] == (0, ())
    rank, lines = results[1]
    assert rank == 1
    assert len(lines) == 1 and "RANK=0 but the process group says rank=1" in lines[0]


def _before_init(rank, world):
    return _values(), is_distributed(), dist.is_initialized()


@pytest.mark.timeout(60)
def test_ranks_are_known_before_init_process_group():
    results = run_world(_before_init, 2, backend=None, timeout=30)
    assert results == [((r, 2, r, 2, 0), True, False) for r in range(2)]


@pytest.mark.timeout(30)
def test_world_of_one_without_launcher(clean_env):
    assert _values() == (0, 1, 0, 1, 0)
    assert not is_distributed() and is_main_process() and is_main_process(local=True)


@pytest.mark.timeout(30)
def test_library_exports_every_name_it_lists():
    for name in lib.__all__:
        assert getattr(lib, name) is not None, name
    assert lib.main_process_first is lib.zero_first
    assert lib.rank_zero_print is lib.print0


# --- rank-zero code on the right rank only (issue 27) ------------------------------------------------------

_RAN: list[str] = []


@lib.rank_zero_only(default="skipped")
def _save_checkpoint():  # decorated at import, before any launcher variable is read, as users do
    _RAN.append("saved")
    return "saved"


_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "JSM_NAMESPACE_RANK")
# scenario -> (environment, get_rank(), get_world_size(), runs rank-zero code, a warning's start or None)
RANK_ZERO = [
    ({"RANK": "1"}, 1, 1, False, "RANK=1 is set without its world size"),
    ({"SLURM_PROCID": "2"}, 2, 1, False, "SLURM_PROCID=2 is set without its world size"),
    ({"JSM_NAMESPACE_RANK": "4"}, 4, 1, False, "JSM_NAMESPACE_RANK=4 is set without its world size"),
    ({"PMI_RANK": "3"}, 3, 1, False, "PMI_RANK=3 is set without its world size"),
    ({"OMPI_COMM_WORLD_RANK": "1"}, 1, 1, False, None),  # Open MPI's rank alone is a complete launcher
    ({"LOCAL_RANK": "1"}, 0, 1, False, "LOCAL_RANK=1 is set but no global rank variable"),
    ({"LOCAL_RANK": "0"}, 0, 1, True, "LOCAL_RANK=0 is set but no global rank variable"),
    ({"RANK": "0", "SLURM_PROCID": "3"}, 0, 1, False, "RANK=0 but SLURM_PROCID=3"),
    ({"SLURM_PROCID": "0", "JSM_NAMESPACE_RANK": "2"}, 0, 1, False, "SLURM_PROCID=0 but JSM_NAMESPACE_RANK=2"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "JSM_NAMESPACE_RANK": "1"}, 0, 2, False,
     "RANK=0 but JSM_NAMESPACE_RANK=1"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "OMPI_COMM_WORLD_RANK": "1"}, 0, 2, False,
     "RANK=0 but OMPI_COMM_WORLD_RANK=1"),
    ({"RANK": "abc"}, 0, 1, False, "RANK='abc' is not a rank"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "SLURM_PROCID": "0"}, 0, 2, True, None),
    ({}, 0, 1, True, None),
]


def _rank_zero_scenario(index, world):
    env, *_ = RANK_ZERO[index]
    for name in list(os.environ):
        if name in _RANK_VARS or name.startswith(_PREFIXES):
            del os.environ[name]
    os.environ.update(env)
    sys.argv = ["train.py"]
    lightning.rank_zero_only.rank = lightning._fabric_rank()  # what Fabric computes at import in this environment
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ran = _save_checkpoint()
        rank, size = get_rank(), get_world_size()
        get_rank()  # a second call warns no more
        main = is_main_process()
        peers = (lightning.rank_zero_only(lambda: True, default=False)(),
                 accelerate.on_main_process(lambda: True)() is True, detectron2.is_main_process(),
                 mmengine.is_main_process())
    lines = [str(w.message) for w in caught if w.category is RankConflictWarning]
    return ran, _RAN, rank, size, main and all(peers) if main else main or any(peers), lines


@pytest.mark.timeout(60)
def test_rank_zero_code_runs_only_where_every_rank_variable_says_zero():
    # Each scenario is its own process, with only its variables set.
    results = run_world(_rank_zero_scenario, len(RANK_ZERO), backend=None, timeout=45)
    # main: is_main_process() and the compat modules' rank-zero helpers (lightning, accelerate, detectron2,
    # mmengine) all agree with rank_zero_only
    for (env, rank, size, runs, warning), (ran, log, got_rank, got_size, main, lines) in zip(RANK_ZERO, results):
        assert (ran, log, main) == (("saved", ["saved"], True) if runs else ("skipped", [], False)), env
        assert (got_rank, got_size) == (rank, size), env
        if warning is None:
            assert lines == [], env
        else:
            assert any(line.startswith(warning) for line in lines), (env, lines)
            assert len(lines) == len(set(lines)), (env, lines)  # each line once per process


def _stale_slurm_under_a_group(rank, world):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _save_checkpoint(), is_main_process(), get_rank()
    return out, [str(w.message) for w in caught if w.category is RankConflictWarning]


@pytest.mark.timeout(60)
def test_rank_zero_code_needs_the_process_group_and_the_variables_to_agree():
    # A stale SLURM_PROCID=1 inherited by both ranks of a gloo world: the process group's rank 0 is not
    # rank 0 for Slurm, so neither rank writes as rank 0; get_rank() follows the process group.
    results = run_world(_stale_slurm_under_a_group, 2, env={"SLURM_PROCID": "1"}, timeout=45)
    assert [out for out, _ in results] == [("skipped", False, 0), ("skipped", False, 1)]
    assert results[0][1] == ["rank-zero code did not run: RANK=0, SLURM_PROCID=1, the process group's rank=0; "
                             "they must all say 0: unset the stale variable"]
