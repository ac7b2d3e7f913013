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

# Tests pin the device they mean: every test runs on CPU (gloo, no visible GPU) in this process and in
# every rank and CLI run it starts, so a GPU machine runs the same suite; `gpu`-marked tests hand the
# machine's own CUDA_VISIBLE_DEVICES back to the processes they start (gpu_support.gpu_env()).
ORIGINAL_CUDA_VISIBLE_DEVICES = os.environ.get("CUDA_VISIBLE_DEVICES")
os.environ["CUDA_VISIBLE_DEVICES"] = ""


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


# --- Nothing left in /tmp --------------------------------------------------------------------------
# The suite runs with a private temporary directory (TMPDIR and tempfile.tempdir, inherited by every
# rank, CLI run and network-namespace host it starts), so what is left there is this suite's own even
# while other suites share /tmp; at the end, anything left there besides pytest's tmp_path folders
# fails the session, and the directory is removed.
_SESSION_TMP: dict = {}


def pytest_sessionstart(session):
    import tempfile

    base = tempfile.mkdtemp(prefix="ddpdoctor-suite-")
    _SESSION_TMP.update(base=base, old_tmpdir=os.environ.get("TMPDIR"))
    os.environ["TMPDIR"] = base
    tempfile.tempdir = base


def pytest_sessionfinish(session, exitstatus):
    import shutil
    import tempfile

    base = _SESSION_TMP.pop("base", None)
    if base is None:
        return
    # pytest's own tmp_path folders, and torch's per-user compile cache (one fixed name, reused, that
    # torch keeps in /tmp on every machine), are not leftovers; nor are the log folders and error files
    # of torchrun agents that tests stop on purpose (torch removes them only when its agent exits
    # normally). Everything in this private folder is removed below in any case.
    left = sorted(os.path.join(base, n) for n in os.listdir(base)
                  if not n.startswith(("pytest-of-", "torchinductor_", "torchelastic_", "pytorch-errorfile-")))
    shutil.rmtree(base, ignore_errors=True)
    old = _SESSION_TMP.pop("old_tmpdir")
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old
    tempfile.tempdir = None
    if left:
        session.config.get_terminal_writer().line(
            f"FAILED: the test suite left temporary files behind: {left}", red=True, bold=True)
        if session.exitstatus == 0:
            session.exitstatus = 1
