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
from fr_jobs import SPAWN_GROUPS, SPAWN_RAISE, TORCHRUN_DDP, mark_line, run_spawn, run_spawn_raise, run_torchrun

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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ranks_that_raise_before_the_collective_are_named(tmp_path, cli_env):
    """gloo raises locally on a size ([5] against [4]) or dtype (float64) mismatch in all_gather before the
    recorder sees the call; the dumps written at the raise show ranks 1-2 never entered #2."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))}
    script, out, proc = run_spawn_raise(tmp_path, env)
    assert "invalid tensor size" in proc.stdout or "different dtypes" in proc.stdout, proc.stdout[-2000:]
    assert sorted(os.listdir(out)) == ["fr-0", "fr-1", "fr-2", "fr-json-0", "fr-json-1", "fr-json-2"], proc.stdout
    default = by_group(find_divergences(read_dumps(str(out), "fr-")))["0"]
    assert (default.kind, default.seq) == ("absent", 2)
    assert default.variants[0][0] == [0] and default.variants[0][1].op == "all_gather"
    assert [(r, e.seq, e.op) for r, e in default.absent] == [(1, 1, "all_reduce"), (2, 1, "all_reduce")]
    proc = explain(["--fr", str(out), "--prefix", "fr-"], cli_env)
    lines = proc.stdout.splitlines()
    assert f"    rank 0 entered #2 all_gather [4] Float at {script}:{mark_line(SPAWN_RAISE, 'gather')} in work" in lines
    assert (f"    rank 2 never entered #2; last entered #1 all_reduce [4] Float at {script}:"
            f"{mark_line(SPAWN_RAISE, 'raise_common')} in work" in lines)
    assert "raised before entering it" in proc.stdout


# --- NCCL fixtures, written from the schema in torch's FlightRecorder.hpp (format 2.10) ---------------

def _nccl_entry(record_id, pg_id, group, seq, op, state, dtype="Float", size=1024, retired=None,
                filename="/work/train.py", line=40):
    """One entry as FlightRecorder<EventType>::getCollectiveTrace writes it (keys from FlightRecorder.hpp)."""
    return {"record_id": record_id, "pg_id": pg_id, "process_group": (group, "default_pg" if group == "0" else "tp"),
            "thread_name": "pt_main_thread", "thread_id": "1", "collective_seq_id": seq, "p2p_seq_id": 0,
            "op_id": seq, "profiling_name": f"nccl:{op}", "time_created_ns": 1_000 + record_id,
            "input_sizes": [[size]], "input_dtypes": [dtype], "output_sizes": [[size]], "output_dtypes": [dtype],
            "state": state, "time_discovered_started_ns": None if state == "scheduled" else 2_000,
            "time_discovered_completed_ns": 3_000 if state == "completed" else None,
            "retired": state == "completed" if retired is None else retired, "timeout_ms": 600_000,
            "is_p2p": False, "duration_ms": 1.5 if state == "completed" else None,
            "frames": [{"name": "all_reduce", "filename": "/venv/lib/python3.11/site-packages/torch/distributed/"
                        "distributed_c10d.py", "line": 2800},
                       {"name": "step", "filename": filename, "line": line}]}


def write_nccl_fixture(path, ranks=(0, 1, 2, 3)):
    """4 ranks: the default group completes #1-#5; ranks 0-2 enter #6 (started, rank 2's retired without
    completing: timed out), rank 3 last completed #5. Group '1' (ranks 0, 1): #1 Float against BFloat16."""
    path.mkdir(exist_ok=True)
    for r in ranks:
        entries = [_nccl_entry(i, 0, "0", i + 1, "all_reduce", "completed") for i in range(5)]
        if r != 3:
            entries.append(_nccl_entry(5, 0, "0", 6, "all_reduce", "started", retired=(r == 2), line=44))
        if r in (0, 1):
            entries.append(_nccl_entry(6, 1, "1", 1, "all_reduce", "started",
                                       dtype="Float" if r == 0 else "BFloat16", line=52))
        status = {"0": {"last_enqueued_collective": 6 if r != 3 else 5, "last_started_collective": 6 if r != 3 else 5,
                        "last_completed_collective": 5}}
        if r in (0, 1):
            status["1"] = {"last_enqueued_collective": 1, "last_started_collective": 1, "last_completed_collective": 0}
        doc = {"version": "2.10", "comm_lib_version": "2.21.5",
               "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
                             "1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}},
               "pg_status": status, "entries": entries, "nccl_comm_state": {}}
        (path / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(doc))
    return path


def test_nccl_fixture_states_read(tmp_path):
    """started/completed states and a retired-but-not-completed entry: rank 3 never entered #6 of the
    default group; group '1' diverges on dtype at #1."""
    dumps = read_dumps(str(write_nccl_fixture(tmp_path / "nccl")))
    assert dumps.prefix == "nccl_trace_rank_" and dumps.world == [0, 1, 2, 3] and dumps.world_known
    groups = by_group(find_divergences(dumps))
    default, tp = groups["0"], groups["1"]
    assert (default.kind, default.seq, default.last_completed) == ("absent", 6, 5)
    assert default.variants[0][0] == [0, 1, 2] and [(r, e.seq, e.state) for r, e in default.absent] == [
        (3, 5, "completed")]
    assert default.timed_out == [2]  # retired without completing; gloo's retired entries never count
    assert (tp.kind, tp.seq, tp.members) == ("mismatch", 1, [0, 1])
    assert "different dtypes" in tp.cause and "BFloat16" in tp.cause


def test_nccl_fixture_rank_without_dump_is_waited_on(tmp_path, cli_env):
    """With rank 3's dump gone, ranks 0-2 all entered #6 and it never completed: they wait on rank 3."""
    out = write_nccl_fixture(tmp_path / "nccl", ranks=(0, 1, 2))
    default = by_group(find_divergences(read_dumps(str(out))))["0"]
    assert (default.kind, default.seq, default.missing) == ("waiting", 6, [3])
    proc = explain(["--fr", str(out)], cli_env)
    assert proc.returncode == 0, proc.stderr
    assert "- rank 3 left no dump: dead, or stuck outside any collective" in proc.stdout.splitlines()
    assert "it waits for rank 3, which left no dump" in proc.stdout
    assert "    ranks 0-2 entered #6 all_reduce [1024] Float at /work/train.py:44 in step" in proc.stdout.splitlines()
    assert "    rank 2: #6 retired without completing (the watchdog timed it out)" in proc.stdout.splitlines()


# --- bad and hostile input: one line, exit 2, no code run --------------------------------------------

class _Boom:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_hostile_pickle_is_refused_without_running_code(tmp_path, cli_env):
    d = tmp_path / "dumps"
    d.mkdir()
    (d / "fr-0").write_bytes(pickle.dumps({"version": "2.10", "entries": [_Boom()]}))
    proc = subprocess.run(CMD + ["--fr", str(d)], env=cli_env, cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 2 and not (tmp_path / "PWNED").exists()
    assert proc.stderr.startswith("error[fr-dump-unreadable]:") and len(proc.stderr.strip().splitlines()) == 1
    assert "system" in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("case,reference", [
    ("file", "fr-not-a-directory"), ("missing", "fr-not-a-directory"), ("empty", "fr-no-dumps"),
    ("garbage", "fr-dump-unreadable"), ("all-cut", "fr-dump-unreadable"), ("old", "fr-format-too-old"),
    ("prefix", "fr-no-dumps"), ("world", "fr-world-size")])
def test_bad_input_is_one_line_and_exit_2(tmp_path, cli_env, case, reference):
    d = tmp_path / "dumps"
    d.mkdir()
    target, extra = str(d), []
    if case == "file":
        (d / "fr-0").write_bytes(b"x")
        target = str(d / "fr-0")
    elif case == "missing":
        target = str(d / "nowhere")
    elif case == "garbage":
        (d / "fr-0").write_bytes(b"\x80\x04not a pickle at all")
    elif case == "all-cut":
        (d / "fr-0").write_bytes(pickle.dumps({"version": "2.10", "entries": []})[:20])
    elif case == "old":
        (d / "fr-0").write_bytes(pickle.dumps({"version": "1.5", "entries": []}))
    elif case == "prefix":
        (d / "fr-0").write_bytes(pickle.dumps({"version": "2.10"}))
        extra = ["--prefix", "other-"]
    elif case == "world":
        (d / "fr-5").write_bytes(pickle.dumps({"version": "2.10"}))
        extra = ["--world-size", "4"]
    proc = explain(["--fr", target] + extra, cli_env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith(f"error[{reference}]:") and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_cut_short_dump_is_a_finding_and_frames_are_escaped(tmp_path, cli_env):
    """A dump cut short by a kill is reported as no dump; control characters in a recorded path are escaped."""
    d = write_nccl_fixture(tmp_path / "nccl")
    full = (d / "nccl_trace_rank_3").read_bytes()
    (d / "nccl_trace_rank_3").write_bytes(full[: len(full) // 2])
    doc = pickle.loads((d / "nccl_trace_rank_0").read_bytes())
    doc["entries"][-2]["frames"][1]["filename"] = "/work/\x1b[31mred.py"
    (d / "nccl_trace_rank_0").write_bytes(pickle.dumps(doc))
    proc = explain(["--fr", str(d)], cli_env)
    assert proc.returncode == 0, proc.stderr
    assert "- rank 3's dump is unreadable (the file ends inside the pickle: cut short" in proc.stdout
    assert "\x1b" not in proc.stdout and "/work/\\e[31mred.py:44" in proc.stdout
    assert "it waits for rank 3" in proc.stdout


def test_explain_fr_refuses_text_and_prefix_alone(cli_env, tmp_path):
    assert explain(["--fr", str(tmp_path), "some text"], cli_env).returncode == 2
    proc = explain(["--prefix", "fr-", "text"], cli_env)
    assert proc.returncode == 2 and "need --fr DIR" in proc.stderr


def test_format_2_3_is_read_and_older_refused(tmp_path, cli_env):
    """Format 2.3 (NCCL-only; its TraceUtils.h writes no thread_name/thread_id keys) reads like 2.10; 2.2 is
    refused in one line naming the oldest format read."""
    out = write_nccl_fixture(tmp_path / "v23")
    for path in out.iterdir():
        doc = pickle.loads(path.read_bytes())
        doc["version"] = "2.3"
        for e in doc["entries"]:
            del e["thread_name"], e["thread_id"]
        path.write_bytes(pickle.dumps(doc))
    default = by_group(find_divergences(read_dumps(str(out))))["0"]
    assert (default.kind, default.seq, [r for r, _ in default.absent]) == ("absent", 6, [3])
    doc = pickle.loads((out / "nccl_trace_rank_0").read_bytes())
    doc["version"] = "2.2"
    (out / "nccl_trace_rank_0").write_bytes(pickle.dumps(doc))
    proc = explain(["--fr", str(out)], cli_env)
    assert proc.returncode == 2 and proc.stderr.startswith("error[fr-format-too-old]:")
    assert "format 2.2; ddpdoctor reads format 2.3 and newer" in proc.stderr


# --- real dumps from another torch, on a GPU machine ----------------------------------------------

REAL = os.path.join(os.path.dirname(__file__), "data", "flight_recorder")


def test_real_dumps_of_torch_2_11_nccl_and_gloo_are_read():
    """Dumps written by torch 2.11 (CUDA 13, NCCL 2.28.9) on an H100 (.scratch/fr_dump.py in the session
    that added them): a 1-rank NCCL world with a sub-group and four 1 GiB all_reduces issued async just
    before the dump, and a 2-rank gloo world whose rank 0 alone used a sub-group of [0]. Both healthy."""
    nccl = read_dumps(os.path.join(REAL, "torch2.11-nccl"))
    assert nccl.prefix == "nccl_trace_rank_" and sorted(nccl.dumps) == [0]
    dump = nccl.dumps[0]
    assert dump.version == "2.10"
    default = by_group(find_divergences(nccl))
    assert set(default) == {"0", "1"}
    assert all(v.kind == "none" for v in default.values()), default
    gloo = read_dumps(os.path.join(REAL, "torch2.11-gloo"))
    assert sorted(gloo.dumps) == [0, 1] and {d.version for d in gloo.dumps.values()} == {"2.10"}
    verdicts = by_group(find_divergences(gloo))
    assert verdicts["0"].kind == "none" and verdicts["1"].kind == "none", verdicts
