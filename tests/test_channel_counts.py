"""The control plane's store messages per rank do not grow with the world (runner/channel.py COUNTS).

A real local world of 2 and of 4 ranks runs env, port and process-group with
DDPDOCTOR_CHANNEL_COUNTS set; every worker writes its counts at its end. The writes and reads a
rank makes (hello, directives, results) must be the same at both sizes; ``wait`` calls are left
out (a rank waiting for a directive longer than a second polls again, which depends on the load).
"""

from __future__ import annotations

import json

import pytest

from ddpdoctor.runner.local import run_checks
from ddpdoctor.runner.options import RunOptions


def _counts(folder, n):
    out = {}
    for r in range(n):
        with open(folder / f"rank{r}.json") as f:
            out[r] = json.load(f)
    with open(folder / "supervisor.json") as f:
        out["supervisor"] = json.load(f)
    return out


@pytest.mark.timeout(120)
def test_messages_per_rank_do_not_grow_with_the_world(clean_launcher_env, tmp_path):
    per_size = {}
    for n in (2, 4):
        folder = tmp_path / str(n)
        folder.mkdir()
        clean_launcher_env.setenv("DDPDOCTOR_CHANNEL_COUNTS", str(folder))
        out = run_checks(RunOptions(only=["env", "port", "process-group"], nproc=n, timeout=30))
        assert out.exit_code == 0
        per_size[n] = _counts(folder, n)
    shapes = {n: {(c["write"], c["read"]) for r, c in counts.items() if r != "supervisor"}
              for n, counts in per_size.items()}
    assert len(shapes[2]) == 1 and shapes[2] == shapes[4], shapes
    writes, reads = next(iter(shapes[2]))
    # hello (its key, the roll and the counter), per check run: the directive, the result and the roll
    assert writes == 3 + 2 * 2 and reads == 3 + 1, (writes, reads)  # port runs in the supervisor
    for n, counts in per_size.items():
        assert sum(counts["supervisor"].values()) > 0
