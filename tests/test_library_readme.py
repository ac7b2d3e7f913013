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
