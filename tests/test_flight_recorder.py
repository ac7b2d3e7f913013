"""``ddpdoctor explain --fr DIR``: Flight Recorder dumps read into the first divergent collective per group.

Real dumps come from two real gloo jobs (tests/fr_jobs.py), one mp.spawn (4 ranks) and one torchrun (3
ranks), each holding several scenarios in separate process groups, so two launches cover them all:
a collective only rank 0 calls, two ranks calling different operations, a rank killed before it could
dump, a silent shape mismatch, DDP's own collectives against a barrier, a truncated ring, a healthy
group. NCCL dumps cannot be produced here (no GPU): they are fixtures written from the schema in the
headers the torch wheel ships (torch/csrc/distributed/c10d/FlightRecorder.hpp, format 2.10).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

from ddpdoctor.postmortem.divergence import find_divergences
from ddpdoctor.postmortem.flight_recorder import read_dumps
from fr_jobs import SPAWN_GROUPS, TORCHRUN_DDP, mark_line, run_spawn, run_torchrun

CMD = [sys.executable, "-m", "ddpdoctor", "explain"]


def explain(args, env, timeout=60):
    return subprocess.run(CMD + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def by_group(verdicts):
    return {v.group: v for v in verdicts}


# --- real gloo jobs -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spawn_job(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))}
    script, out, proc = run_spawn(tmp_path_factory.mktemp("spawn"), env)
    assert sorted(os.listdir(out)) == ["fr-0", "fr-1", "fr-2", "fr-json-0", "fr-json-1", "fr-json-2"], proc.stdout
    return str(script), str(out)


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))}
    script, out, proc = run_torchrun(tmp_path_factory.mktemp("torchrun"), env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return str(script), str(out)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("prefix", ["fr-", "fr-json-"])
def test_spawn_job_groups_read_right(spawn_job, prefix):
    """Default group fine; group A: rank 0 alone entered #2 (ranks 1, 2 last entered #1); group B: rank 1
    all_reduce, rank 2 broadcast at #1; rank 3 (killed) left no dump. Pickle and JSON dumps read alike."""
    script, out = spawn_job
    unsized = read_dumps(out, prefix)
    assert unsized.world == [0, 1, 2] and not unsized.world_known  # gloo's pg_config lists no ranks
    dumps = read_dumps(out, prefix, world_size=4)
    assert dumps.world == [0, 1, 2, 3] and dumps.missing == [3]
    groups = by_group(find_divergences(dumps))
    assert sorted(groups) == ["0", "1", "2"]
    default, a, b = groups["0"], groups["1"], groups["2"]
    assert default.kind == "none"
    assert default.missing == [3] and default.last_completed == 2
    assert a.kind == "absent" and a.seq == 2 and a.members == [0, 1, 2]
    assert [r for r, _ in a.absent] == [1, 2] and all(e.seq == 1 for _, e in a.absent)
    assert a.variants[0][0] == [0] and a.variants[0][1].op == "all_reduce"
    assert b.kind == "mismatch" and b.seq == 1 and b.members == [1, 2]
    assert {e.op: rs for rs, e in b.variants} == {"all_reduce": [1], "broadcast": [2]}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_spawn_job_explain_names_lines_and_missing_rank(spawn_job, cli_env):
    script, out = spawn_job
    text = SPAWN_GROUPS
    proc = explain(["--fr", out], cli_env)
    assert proc.returncode == 2 and "several prefixes" in proc.stderr and "--prefix" in proc.stderr
    proc = explain(["--fr", out, "--prefix", "fr-"], cli_env)
    assert proc.returncode == 0 and "pass --world-size N" in proc.stdout, proc.stderr
    proc = explain(["--fr", out, "--prefix", "fr-", "--world-size", "4"], cli_env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "- rank 3 left no dump: dead, or stuck outside any collective" in lines
    assert any(line.startswith("process group '0' (default_pg), ranks 0-3") for line in lines)
    assert "process group '1' (undefined), ranks 0-2: the ranks diverge at collective #2" in lines
    assert (f"    rank 0 entered #2 all_reduce [4] Float at {script}:{mark_line(text, 'rank0_only')} in work"
            in lines)
    assert (f"    rank 1 never entered #2; last entered #1 all_reduce [4] Float at {script}:"
            f"{mark_line(text, 'a_common')} in work" in lines)
    assert f"    rank 1 called #1 all_reduce [4] Float at {script}:{mark_line(text, 'b_all_reduce')} in work" in lines
    assert f"    rank 2 called #1 broadcast [4] Float at {script}:{mark_line(text, 'b_broadcast')} in work" in lines
    assert "`if rank == 0:`" in proc.stdout
    doc = json.loads(explain(["--fr", out, "--prefix", "fr-json-", "--json", "--world-size", "4"], cli_env).stdout)
    assert doc["missing_ranks"] == [3]
    assert [(g["group"], g["kind"], g["divergent_seq"]) for g in doc["groups"][1:]] == [("1", "absent", 2),
                                                                                       ("2", "mismatch", 1)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_ddp_barrier_shape_and_truncated_ring(torchrun_job, cli_env):
    """Default group: at #5 rank 0's barrier meets DDP's forward broadcast on ranks 1-2 (named as DDP's);
    group S: rank 2's [2,2] against [4] (gloo completed it silently); group H: a ring that lost its
    oldest entries still reads as no divergence."""
    script, out = torchrun_job
    dumps = read_dumps(out, "fr-")
    assert min(e.seq for e in dumps.dumps[0].entries if e.group == "1") > 1  # the ring really was truncated
    groups = by_group(find_divergences(dumps))
    assert groups["1"].kind == "none" and groups["1"].last_completed == 30
    shape = groups["2"]
    assert shape.kind == "mismatch" and shape.seq == 1 and shape.last_completed == 1
    assert {e.input_sizes: rs for rs, e in shape.variants} == {((4,),): [0, 1], ((2, 2),): [2]}
    default = groups["0"]
    assert default.kind == "mismatch"
    assert {e.op: rs for rs, e in default.variants} == {"barrier": [0], "broadcast": [1, 2]}
    proc = explain(["--fr", out, "--prefix", "fr-"], cli_env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    seq = default.seq
    assert f"    rank 0 called #{seq} barrier at {script}:{mark_line(TORCHRUN_DDP, 'barrier')} in main" in lines
    assert (f"    ranks 1-2 called #{seq} broadcast [3] Int (DDP's forward (bucket rebuild or buffer sync)) at "
            f"{script}:{mark_line(TORCHRUN_DDP, 'step')} in main" in lines)
    assert "one side is DDP's own collective" in proc.stdout
    assert "process group '1' (undefined), ranks 0-2: no divergence (last collective #30; #30 completed)" in lines
    assert "rank 2 called #1 all_reduce [2,2] Float" in proc.stdout and "silently" in proc.stdout
