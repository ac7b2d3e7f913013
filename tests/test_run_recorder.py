"""``ddpdoctor run`` reads the Flight Recorder of a hung mp.spawn DDP job: the verdict leads with the
collective where rank 0 called a barrier (a rank-0 checkpoint) while rank 1 ran backward (DDP's reducer
all-reduce, which no Python frame of the user's calls). Real gloo ranks; the dumps are asked of the
live ranks by the hook's recorder thread."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from ddpdoctor.exitcodes import ExitCode

CMD = [sys.executable, "-m", "ddpdoctor", "run"]

DDP_BARRIER = r'''
import sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def work(rank, world, store):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    model = DDP(torch.nn.Linear(4, 4))
    for step in range(3):
        if step == 2 and rank == 0:
            dist.barrier()  # MARK:checkpoint
        model(torch.ones(2, 4)).sum().backward()  # MARK:step
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(work, args=(2, sys.argv[1]), nprocs=2)
'''


def line_of(text: str, mark: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if f"# MARK:{mark}" in line)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_hang_through_ddps_reducer_against_a_barrier_leads_with_the_collective(cli_env, tmp_path):
    script = tmp_path / "ddp_barrier.py"
    script.write_text(DDP_BARRIER)
    run_dir = tmp_path / "run"
    env = {**cli_env, "XDG_STATE_HOME": str(tmp_path / "state")}
    p = subprocess.run(CMD + ["--hang-timeout", "3", "--dir", str(run_dir), "--", sys.executable, str(script),
                              str(tmp_path / "store")], env=env, capture_output=True, text=True, timeout=170)
    assert p.returncode == ExitCode.HUNG, p.stderr[-3000:]
    lines = p.stderr[p.stderr.index("ddpdoctor run: hung: no rank made progress for 3s\n"):].splitlines()
    m = re.fullmatch(r"  Flight Recorder: collective #(\d+) of the default group: rank 0 called barrier, "
                     r"rank 1 called all_reduce", lines[1])
    assert m, p.stderr[-3000:]
    n = int(m.group(1))
    assert n > 3  # DDP's own collectives (constructor, two steps' gradient all-reduces) came first
    assert lines[2].startswith(f"    rank 0: #{n} barrier") and f"{script}:{line_of(DDP_BARRIER, 'checkpoint')}" in lines[2]
    assert lines[3].startswith(f"    rank 1: #{n} all_reduce"), lines[3]
    assert "DDP" in lines[3] and f"{script}:{line_of(DDP_BARRIER, 'step')}" in lines[3], lines[3]
    assert lines[4].startswith("    cause: ranks called different collectives")
    # then the grouped stacks, as before
    assert any(line.startswith("  rank 1: DDP backward (reducer all_reduce)") for line in lines[5:]), lines
    recorded = json.loads((run_dir / "verdict.json").read_text())["flight_recorder"]
    assert recorded["dumped"] == [0, 1] and recorded["groups"][0]["divergent_seq"] == n


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_with_the_recorder_turned_off_the_hang_verdict_is_as_before(cli_env, tmp_path):
    """TORCH_FR_BUFFER_SIZE=0 (the user's: run keeps it): the ranks dump nothing recorded, and the verdict
    says nothing of the recorder; it still names the ranks' places."""
    from jobscripts import line_of as train_line, torchrun, write_train

    script = write_train(tmp_path)
    run_dir = tmp_path / "run"
    env = {**cli_env, "XDG_STATE_HOME": str(tmp_path / "state"), "TORCH_FR_BUFFER_SIZE": "0"}
    p = subprocess.run(CMD + ["--hang-timeout", "3", "--dir", str(run_dir), "--", *torchrun(script, "hang", "20")],
                       env=env, capture_output=True, text=True, timeout=170)
    assert p.returncode == ExitCode.HUNG, p.stderr[-3000:]
    verdict = p.stderr[p.stderr.index("ddpdoctor run: hung: no rank made progress for 3s\n"):]
    assert "Flight Recorder" not in verdict, verdict
    assert f"  rank 1: dataset_read ({script}:{train_line('dataset')})   <- the odd one out" in verdict
    recorded = json.loads((run_dir / "verdict.json").read_text())["flight_recorder"]
    assert recorded["dumped"] == [] and recorded["unavailable"], recorded


def _dump_dir(tmp_path, statuses: dict):
    """A run directory holding two real gloo dumps (torch 2.11, ranks 0 and 1) and the hook's status
    records ``{pid: record}``."""
    import shutil
    import os

    data = os.path.join(os.path.dirname(__file__), "data", "flight_recorder", "torch2.11-gloo")
    for rank in (0, 1):
        shutil.copy(os.path.join(data, f"fr_trace_rank_{rank}"), tmp_path / f"flight-recorder-rank{rank}")
    for pid, record in statuses.items():
        (tmp_path / f"frdump-{pid}.json").write_text(json.dumps({"pid": pid, **record}))
    return str(tmp_path)


def test_a_dump_left_by_an_earlier_request_is_not_read_as_this_ones(tmp_path):
    """Only a dump that answers this request (or was written at the rank's end) is read: rank 1's file
    answers an earlier look (a stacks request), so rank 1 is named as not answering, not read as it was."""
    import time

    from ddpdoctor.postmortem.recorder import DumpRequest, RankRef, lead_lines, read_recorder

    req = DumpRequest("new", time.time(), 3.0)
    old = time.time() - 600
    run_dir = _dump_dir(tmp_path, {100: {"rank": 0, "why": "request", "token": "new", "file": "flight-recorder-rank0",
                                         "t": time.time()},
                                   101: {"rank": 1, "why": "request", "token": "old", "file": "flight-recorder-rank1",
                                         "t": old}})
    live = read_recorder(run_dir, [RankRef(0, 100, True), RankRef(1, 101, True)], req)
    assert sorted(live.dumps.dumps) == [0]
    assert live.no_dump == {1: "no dump within 3s (busy outside Python, or stopped)"}
    assert "    rank 1: no dump within 3s (busy outside Python, or stopped)" in ["  " + x for x in lead_lines(live)]
    # rank 1 ended (a signal) long after that look: still not its last state
    dead = read_recorder(run_dir, [RankRef(0, 100, True), RankRef(1, 101, False, "ended without a Python exit "
                                                                                  "(killed by a signal)")], req)
    assert dead.no_dump == {1: "left no dump: ended without a Python exit (killed by a signal)"}
    # written at its end (the hook's exit handler), or answering a request moments before it ended: read
    for record in ({"why": "raised", "token": ""}, {"why": "request", "token": "old", "t": time.time() - 5}):
        _dump_dir(tmp_path, {101: {"rank": 1, "file": "flight-recorder-rank1", "t": time.time(), **record}})
        ended = read_recorder(run_dir, [RankRef(0, 100, True), RankRef(1, 101, False, "raised")], req)
        assert sorted(ended.dumps.dumps) == [0, 1] and not ended.no_dump, record


def test_a_torch_older_than_the_oldest_read_gets_one_line(tmp_path):
    """A torch without the recorder: every rank's record is an error; the verdict gets one line naming
    the ranks' torch and the oldest whose recorder is read."""
    import time

    from ddpdoctor.postmortem.recorder import DumpRequest, RankRef, lead_lines, read_recorder

    req = DumpRequest("t1", time.time(), 3.0)
    for pid, rank in ((100, 0), (101, 1)):
        (tmp_path / f"frdump-{pid}.json").write_text(json.dumps(
            {"pid": pid, "why": "request", "token": "t1", "stage": "quick", "rank": rank,
             "error": "torch 2.4.0 has no Flight Recorder dump for this backend (_dump_fr_trace)"}))
    reading = read_recorder(str(tmp_path), [RankRef(0, 100, True), RankRef(1, 101, True)], req)
    assert reading.dumps is None and lead_lines(reading) == [
        "Flight Recorder: not read: the ranks run torch 2.4.0; ddpdoctor reads the recorder of torch 2.11 and newer"]
    assert reading.unavailable.startswith("torch 2.4.0 has no Flight Recorder dump")
    assert reading.no_dump[0].startswith("could not dump: torch 2.4.0")
    # a torch below the oldest that did dump: read as it is, its first line says so; from 2.11 on, no line
    for version, said in (("2.10.1", True), ("2.11.0", False), ("2.13.0+cpu", False)):
        req = DumpRequest(f"t-{version}", time.time(), 3.0)
        run_dir = _dump_dir(tmp_path, {pid: {"rank": rank, "why": "request", "token": req.token, "stage": "full",
                                             "file": f"flight-recorder-rank{rank}", "t": time.time(), "torch": version}
                                       for pid, rank in ((100, 0), (101, 1))})
        lines = lead_lines(read_recorder(run_dir, [RankRef(0, 100, True), RankRef(1, 101, True)], req))
        older = [x for x in lines if "older than 2.11" in x]
        assert older == ([f"Flight Recorder: the ranks run torch {version}, older than 2.11 (the oldest whose "
                          "recorder ddpdoctor reads): what follows is read as it is, unchecked"] if said else []), lines
        assert any(x.startswith("Flight Recorder: no divergence") for x in lines), lines
