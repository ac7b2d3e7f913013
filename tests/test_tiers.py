"""The suite's own guards hold in both tiers and under pytest-xdist (issue 23, "Its own tests").

Each test runs a small suite of its own in a subprocess with this suite's conftest.py: a file left in
the temporary directory fails the session whether the tests run in one process or in xdist workers
(whose own checks the controller must report), and a long test not marked slow is named at the end.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

LEAKY = '''
import os, tempfile, time

def test_leaves_a_file():
    if os.environ.get("LEAK"):
        fd, path = tempfile.mkstemp(prefix="leftover-")
        os.close(fd)

def test_takes_its_time():
    time.sleep(float(os.environ.get("NAP", "0")))

def test_other():
    pass
'''


TIMED = '''
import os, time
import pytest

def _timed(name, seconds):
    t0 = time.time()
    time.sleep(seconds)
    with open(os.path.join(os.environ["TIMES"], name), "w") as f:
        f.write(f"{t0} {time.time()}")

@pytest.mark.parametrize("i", range(6))
def test_shared(i):
    _timed(f"shared{i}", 0.4)

@pytest.mark.serial
def test_alone():
    _timed("alone", 1.0)

@pytest.mark.parametrize("i", range(6, 12))
def test_shared_later(i):
    _timed(f"shared{i}", 0.4)
'''


def _suite(tmp_path, *args, source=LEAKY, **env):
    """Run a small suite with this suite's conftest.py; return (exit code, output)."""
    suite = tmp_path / "suite"
    suite.mkdir(exist_ok=True)
    shutil.copy(os.path.join(TESTS, "conftest.py"), suite / "conftest.py")
    (suite / "test_small.py").write_text(source)
    # Only the plugins named here (xdist where asked): the installed ones (hypothesis...) cost seconds to load.
    # Nothing of this suite's own (its lock, its workers' names) reaches the small one.
    clean = {k: v for k, v in os.environ.items() if k not in ("LEAK", "NAP", "PYTEST_ADDOPTS")
             and not k.startswith(("DDPDOCTOR_", "PYTEST_XDIST_"))}
    clean["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(suite),
                        *args, str(suite)], cwd=suite, env={**clean, **env}, capture_output=True, text=True,
                       timeout=100)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "2"]], ids=["one-process", "xdist"])
def test_a_file_left_in_the_temporary_directory_fails_the_session(tmp_path, workers):
    if workers:
        pytest.importorskip("xdist")
    code, out = _suite(tmp_path, *workers)
    assert code == 0 and "3 passed" in out, out
    code, out = _suite(tmp_path, *workers, LEAK="1")
    assert code == 1, out
    assert re.search(r"FAILED: the test suite left temporary files behind: \['[^']*/leftover-\w+'\]", out), out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "2"]], ids=["one-process", "xdist"])
def test_a_long_test_not_marked_slow_is_named(tmp_path, workers):
    if workers:
        pytest.importorskip("xdist")
    code, out = _suite(tmp_path, *workers, NAP="1.2", DDPDOCTOR_TEST_SLOW_NOTE="1")
    assert code == 0, out  # a note, never a failure
    assert "tests over 1 s not marked slow" in out, out
    named = re.findall(r"^\s*[\d.]+ s  (\S+): mark it @pytest.mark.slow", out, re.M)
    assert [n.split("::")[-1] for n in named] == ["test_takes_its_time"], out


@pytest.mark.timeout(120)
def test_a_serial_test_runs_with_no_other_test_beside_it(tmp_path):
    pytest.importorskip("xdist")
    times = tmp_path / "times"
    times.mkdir()
    code, out = _suite(tmp_path, "-p", "xdist", "-n", "2", source=TIMED, TIMES=str(times))
    assert code == 0 and "13 passed" in out, out
    spans = {p.name: tuple(map(float, p.read_text().split())) for p in times.iterdir()}
    assert len(spans) == 13, spans
    alone = spans.pop("alone")
    beside = [name for name, (t0, t1) in spans.items() if t0 < alone[1] and alone[0] < t1]
    assert not beside, f"ran beside the serial test: {beside}"


def test_both_tiers_are_documented_and_the_marker_registered():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert re.search(r'^\s*"slow: ', f.read(), re.M)
    with open(os.path.join(ROOT, "README.md")) as f:
        setup = f.read().split("## Set up", 1)[1].split("\n## ", 1)[0]
    assert 'python -m pytest -m "not slow"' in setup
