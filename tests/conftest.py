"""Shared test fixtures: every test must leave no child process and no listening socket behind."""

from __future__ import annotations

import contextlib
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


# --- Two tiers ------------------------------------------------------------------------------------
# `python -m pytest -m "not slow"` is the fast tier, for the development loop; `python -m pytest` is
# the full suite, CI's. A test that runs longer than SLOW_NOTE seconds and is not marked slow is named
# at the end of the run, so that it gets marked: a note, never a failure. On a loaded machine every
# test is slower, so the threshold grows with the load per core at the test's end (at load 20 on 2
# cores a test is named past 100 s). DDPDOCTOR_TEST_SLOW_NOTE sets a fixed threshold instead (tests/
# test_tiers.py uses it). Under pytest-xdist the controller sees every worker's reports and notes them.
SLOW_NOTE = 10.0
_FIXED_NOTE = os.environ.get("DDPDOCTOR_TEST_SLOW_NOTE")
_UNMARKED_SLOW: list = []


def _slow_threshold() -> float:
    if _FIXED_NOTE:
        return float(_FIXED_NOTE)
    return SLOW_NOTE * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def pytest_addoption(parser):
    parser.addini("serial_first", type="bool", default=False,
                  help="run the tests marked serial first (this suite sets it in pyproject.toml)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The tests marked ``serial`` first, where the ini option ``serial_first`` is set (this suite's
    pyproject.toml; a stable sort: all else keeps its order). A serial test that comes up while the other
    xdist worker is in a test waits for that test to end (see "Tests that run alone" below), and the
    other worker's test is most likely a long one: scattered through the collection, the twelve serial
    tests waited on tests of up to a minute and a half. First, they run while the other worker goes
    through the first files' short tests."""
    if config.getini("serial_first"):
        items.sort(key=lambda item: item.get_closest_marker("serial") is None)


def pytest_runtest_logreport(report):
    if report.when == "call" and "slow" not in report.keywords and report.duration > _slow_threshold():
        _UNMARKED_SLOW.append((report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    for note in _LOCK_NOTES:
        terminalreporter.line(note, yellow=True)
    if _UNMARKED_SLOW:
        limit = float(_FIXED_NOTE) if _FIXED_NOTE else SLOW_NOTE
        terminalreporter.section(f"tests over {limit:.0f} s not marked slow"
                                 + ("" if _FIXED_NOTE else " (the limit grows with the machine's load)"))
        for duration, nodeid in sorted(_UNMARKED_SLOW, reverse=True):
            terminalreporter.line(f"{duration:6.1f} s  {nodeid}: mark it @pytest.mark.slow (the fast tier is "
                                  f"-m \"not slow\")")


# --- Tests that run alone -----------------------------------------------------------------------
# The suite runs in 2 pytest-xdist workers (addopts). A test marked `serial` measures time or bandwidth
# on this machine (locate's link tests, straggler scores): under xdist it runs with no other test
# beside it. Every test holds a lock on one file for its run (setup to teardown) before pytest-timeout's
# clock starts: shared for most, exclusive for a `serial` one. A turnstile (a second lock, held by a
# serial test from the moment it waits until it ends) keeps new tests from starting while a serial one
# waits, so it never starves. The longest wait is one test of the other worker (each has its timeout);
# past LOCK_WAIT the test runs anyway and a note says so.
LOCK_WAIT = 1800.0
_LOCK_NOTES: list = []


def _lock(f, mode: int, deadline: float) -> bool:
    import fcntl

    while True:
        try:
            fcntl.flock(f, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    import fcntl

    path = os.environ.get("DDPDOCTOR_SUITE_LOCK")
    if not path:
        yield
        return
    serial = item.get_closest_marker("serial") is not None
    deadline = time.monotonic() + LOCK_WAIT
    with open(path + ".turnstile", "a") as turnstile, open(path, "a") as lock:
        held = _lock(turnstile, fcntl.LOCK_EX, deadline)
        held = held and _lock(lock, fcntl.LOCK_EX if serial else fcntl.LOCK_SH, deadline)
        if not serial and held:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        if not held:
            _LOCK_NOTES.append(f"{item.nodeid}: ran without its {'exclusive' if serial else 'shared'} lock "
                               f"after {LOCK_WAIT:.0f} s of waiting")
        yield  # the files' close releases both locks


# --- Nothing left in /tmp --------------------------------------------------------------------------
# The suite runs with a private temporary directory (TMPDIR and tempfile.tempdir, inherited by every
# rank, CLI run and network-namespace host it starts), so what is left there is this suite's own even
# while other suites share /tmp; at the end, anything left there besides pytest's tmp_path folders
# fails the session, and the directory is removed.
#
# Under pytest-xdist (`-n 2`) the controller makes its folder first and starts the workers with it as
# their TMPDIR; each worker makes its own folder inside it, checks and removes it at its end, and sends
# what it found to the controller (xdist's workeroutput), which fails the session. A worker that dies
# before its check leaves its folder in the controller's, where the controller's own check finds it.
_SESSION_TMP: dict = {}
_WORKERS_LEFT: list = []


def pytest_sessionstart(session):
    import tempfile

    base = tempfile.mkdtemp(prefix="ddpdoctor-suite-")
    _SESSION_TMP.update(base=base, old_tmpdir=os.environ.get("TMPDIR"))
    if "DDPDOCTOR_SUITE_LOCK" not in os.environ:  # the controller's (or the only) process: workers inherit it
        os.environ["DDPDOCTOR_SUITE_LOCK"] = os.path.join(base, "suite.lock")
        _SESSION_TMP["lock"] = True
    os.environ["TMPDIR"] = base
    tempfile.tempdir = base


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist, in the controller: a worker's leftovers, found by its own session-finish check, and its
    notes of tests that ran without their lock."""
    _WORKERS_LEFT.extend(getattr(node, "workeroutput", {}).get("ddpdoctor_left", []))
    _LOCK_NOTES.extend(getattr(node, "workeroutput", {}).get("ddpdoctor_lock_notes", []))


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
    if _SESSION_TMP.pop("lock", False):
        for name in ("suite.lock", "suite.lock.turnstile"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(base, name))
        del os.environ["DDPDOCTOR_SUITE_LOCK"]
    left = sorted(os.path.join(base, n) for n in os.listdir(base)
                  if not n.startswith(("pytest-of-", "torchinductor_", "torchelastic_", "pytorch-errorfile-")))
    shutil.rmtree(base, ignore_errors=True)
    old = _SESSION_TMP.pop("old_tmpdir")
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old
    tempfile.tempdir = None
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports it (see above)
        workeroutput["ddpdoctor_left"] = left
        workeroutput["ddpdoctor_lock_notes"] = list(_LOCK_NOTES)
        return
    left += _WORKERS_LEFT
    if left:
        session.config.get_terminal_writer().line(
            f"FAILED: the test suite left temporary files behind: {left}", red=True, bold=True)
        if session.exitstatus == 0:
            session.exitstatus = 1
