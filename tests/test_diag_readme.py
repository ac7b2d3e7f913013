"""The training-pitfalls example of docs/library.md runs as written on a 2-rank gloo world."""

from __future__ import annotations

import os
import re
import warnings

import pytest
import torch._dynamo  # noqa: F401 - DDP imports it on first use; once here, not in every forked rank

from worlds import run_world

SNIPPET = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "library.md")


def _example() -> str:
    with open(SNIPPET) as f:
        section = f.read().split("## Training pitfalls", 1)[1].split("\n## ", 1)[0]
        blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1
    return blocks[0]


def _run(rank: int, world: int, code: str) -> tuple:
    scope: dict = {"__name__": "readme_example"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(code, SNIPPET, "exec"), scope)
    return sorted(scope["drift"]), [w.category.__name__ for w in caught]


@pytest.mark.timeout(60)
def test_readme_example_runs_without_warnings_on_two_ranks():
    for drift_layers, warned in run_world(_run, 2, _example(), timeout=50):
        assert drift_layers == ["1"]
        assert warned == []  # set_epoch is called, so guard_sampler stays silent
