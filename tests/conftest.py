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


# --- Nothing left in /tmp --------------------------------------------------------------------------
# The suite runs with a private temporary directory (TMPDIR, inherited by every rank and CLI run), so
# what it leaves behind is its own even while other suites share /tmp; at the end anything left there
# besides pytest's own tmp_path folders fails the session. Paths that bypass TMPDIR are globbed in /tmp.
_TMP_PATTERNS = ("hosts-*", "ddpdoctor-*")
_SESSION_TMP = {}


def pytest_sessionstart(session):
    import glob
    import tempfile

    base = tempfile.mkdtemp(prefix="ddpdoctor-suite-")
    _SESSION_TMP.update(base=base, before={p for pat in _TMP_PATTERNS for p in glob.glob(os.path.join("/tmp", pat))},
                        old_tmpdir=os.environ.get("TMPDIR"))
    os.environ["TMPDIR"] = base
    tempfile.tempdir = base


def pytest_sessionfinish(session, exitstatus):
    import glob
    import shutil
    import tempfile

    base = _SESSION_TMP.get("base")
    if base is None:
        return
    left = sorted(os.path.join(base, n) for n in os.listdir(base) if not n.startswith("pytest-of-"))
    new = sorted({p for pat in _TMP_PATTERNS for p in glob.glob(os.path.join("/tmp", pat))}
                 - _SESSION_TMP["before"] - {base})
    new = [p for p in new if not os.path.basename(p).startswith("ddpdoctor-suite-")]
    shutil.rmtree(base, ignore_errors=True)
    if _SESSION_TMP["old_tmpdir"] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = _SESSION_TMP["old_tmpdir"]
    tempfile.tempdir = None
    if left or [p for p in new if os.path.basename(p).startswith("hosts-")]:
        session.config.get_terminal_writer().line(
            f"FAILED: the test suite left temporary files behind: {left + new}", red=True, bold=True)
        if session.exitstatus == 0:
            session.exitstatus = 1
