"""Shared test fixtures: every test must leave no child process and no listening socket behind."""

from __future__ import annotations

import os
import sys
import time

import psutil
import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


def _listening(pid: int) -> set:
    try:
        return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN}
    except psutil.Error:
        return set()


@pytest.fixture(autouse=True)
def no_leftovers():
    """Fail a test that leaves a child process or a listening socket of this process behind."""
    me = psutil.Process()
    before_children = {p.pid for p in me.children(recursive=True)}
    before_listen = _listening(me.pid)
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [p for p in me.children(recursive=True) if p.pid not in before_children and p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
        if not left:
            break
        time.sleep(0.05)
    assert not left, f"processes left behind: {[(p.pid, p.cmdline()) for p in left]}"
    extra = _listening(me.pid) - before_listen
    assert not extra, f"sockets left listening: {extra}"


@pytest.fixture
def cli_env():
    """Environment for running the CLI in a subprocess: no launcher variables, test plugins importable."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_", "SLURM_",
                                "OMPI_", "PMI_", "TORCHELASTIC_", "GROUP_RANK", "DDPDOCTOR_", "FAULT_"))}
    env["PYTHONPATH"] = TESTS + os.pathsep + env.get("PYTHONPATH", "")
    env["NO_COLOR"] = "1"
    return env


@pytest.fixture
def clean_launcher_env(monkeypatch):
    """In-process runs: no launcher variables leak in from the outer environment."""
    for k in list(os.environ):
        if k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_", "SLURM_", "OMPI_",
                         "PMI_", "TORCHELASTIC_", "GROUP_RANK", "DDPDOCTOR_", "FAULT_")):
            monkeypatch.delenv(k)
    return monkeypatch
