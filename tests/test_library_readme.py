"""The README's training-code example runs, and gives the same answer in worlds of 1 and 3 ranks."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import pytest

from worlds import run_world

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = "## In your training code"


def _example() -> str:
    for path in (ROOT / "README.md",):
        if path.exists() and MARKER in path.read_text():
            section = path.read_text().split(MARKER, 1)[1]
            code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
            return code
    raise AssertionError(f"no {MARKER!r} section with a python example in README.md")


def _run_example(rank, world, code):
    out = io.StringIO()
    namespace = {"__name__": "__main__"}
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README example", "exec"), namespace)
    return out.getvalue(), namespace["accuracy"], len(namespace["predictions"]), namespace["totals"]


@pytest.mark.timeout(60)
def test_readme_example_runs_alone_and_in_a_gloo_world():
    code = _example()
    (alone,) = run_world(_run_example, 1, code, backend=None, timeout=30)
    world = run_world(_run_example, 3, code, timeout=30)
    printed, accuracy, count, totals = alone
    assert count == 103 and totals == {"samples": 103}
    assert printed == f"accuracy {accuracy:.4f} on 103 samples\n"
    assert world[0] == (printed, accuracy, 103, {"samples": 105})  # 3 x 35: two padding duplicates
    assert [w[0] for w in world[1:]] == ["", ""]
    assert all(w[1:] == (accuracy, 103, {"samples": 105}) for w in world)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_example_exits_cleanly_every_time(cli_env, tmp_path):
    """Run as a user runs it: 2 processes with torchrun's variables, a normal interpreter exit each,
    10 times: exit 0 and nothing on stderr, every time (it used to abort about one exit in eight with
    "terminate called without an active exception": the process group alive at interpreter exit)."""
    import subprocess
    import sys

    script = tmp_path / "example.py"
    script.write_text(_example())
    # torch's own import-time note when numpy is absent (a CPU torch wheel has none) is not the example's.
    env = dict(cli_env, PYTHONWARNINGS="ignore:Failed to initialize NumPy", OMP_NUM_THREADS="1")
    problems = []
    for run in range(10):
        port = _free_port()
        procs = [subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env=dict(env, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
                 for r in range(2)]
        for r, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=240)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                    q.communicate()
                raise
            if p.returncode != 0 or err:
                problems.append(f"run {run} rank {r}: exit {p.returncode}, stderr {err[-400:]!r}")
            if r == 0:
                assert out.startswith("accuracy ") and out.endswith(" on 103 samples\n"), out
    assert not problems, "\n".join(problems)
