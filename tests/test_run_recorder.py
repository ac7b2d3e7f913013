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
