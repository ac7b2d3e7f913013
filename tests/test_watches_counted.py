"""``ddpdoctor run``'s ``data-plan`` watch on loaders without ``len()`` (issue 24, watch 2: "or counted").

A real gloo job of 2 ranks under ``run``: each rank streams its own shard from an ``IterableDataset``
(rank 1's shard one batch longer, as a split of a stream by hand often is) through a DDP training loop,
then evaluates on a stream of its own (rank 1's longer: no optimizer step, not compared). Rank 1's extra
batch waits in DDP's all-reduce, which rank 0 never joins: the job hangs. The training pass is named with
each rank's count before the hang verdict, which repeats it; the evaluation pass is not named.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jobscripts import mark_line, write_script

CMD = [sys.executable, "-m", "ddpdoctor"]

STREAM = r'''
import time
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset


class Shard(IterableDataset):
    def __init__(self, samples):
        self.samples = samples

    def __iter__(self):
        g = torch.Generator().manual_seed(self.samples)
        for _ in range(self.samples):
            yield torch.randn(8, generator=g), torch.randn(1, generator=g)


dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with torch.no_grad():
    for x, y in DataLoader(Shard(20 + 10 * rank), batch_size=5):  # MARK:counted_eval
        model.module(x)
for x, y in DataLoader(Shard(25 + 5 * rank), batch_size=5):  # MARK:counted_train
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
time.sleep(30)  # rank 0: the evaluation that follows; rank 1 is held in its extra batch's all-reduce till then
dist.destroy_process_group()
'''


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ranks_counting_different_batches_from_a_stream_are_named_before_the_hang(cli_env, tmp_path):
    script = write_script(tmp_path, "stream.py", STREAM)
    run_dir = tmp_path / "run"
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--monitor-interval=0.2", script]
    p = subprocess.run(CMD + ["run", "--hang-timeout", "4", "--dir", str(run_dir), "--", *job],
                       env={**cli_env, "XDG_STATE_HOME": str(tmp_path / "state")}, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 124, p.stderr[-3000:]
    named = [line for line in p.stderr.splitlines() if line.startswith("ddpdoctor run: [data-plan] ")]
    train = f"<module> ({script}:{mark_line(STREAM, 'counted_train')})"
    assert named == [
        f"ddpdoctor run: [data-plan] ranks 0, 1: the ranks read different numbers of batches in the same pass (the "
        f"1st) over the loader at {train}, which has no len(): batches counted: rank 0 5; rank 1 6 so far (still "
        "reading); a rank with more batches waits in a collective the others never join (the epoch's end hangs) or "
        "pairs collectives of different steps; fix: give every rank the same number of batches: split an "
        "IterableDataset's stream evenly by rank (torch.utils.data.get_worker_info() for its workers too) and stop "
        "every rank at the same count; for uneven inputs on purpose, DDP's join() context manager"], p.stderr[-3000:]
    assert f"({script}:{mark_line(STREAM, 'counted_eval')})" not in p.stderr  # evaluation: uneven, not named
    hung = p.stderr.index("ddpdoctor run: hung: no rank made progress for 4s")
    assert p.stderr.index(named[0]) < hung
    assert "silent bug: [data-plan] ranks 0, 1: the ranks read different numbers of batches" in p.stderr[hung:]
    v = json.loads((run_dir / "verdict.json").read_text())
    assert v["kind"] == "hung" and [(f["watch"], f["where"]) for f in v["findings"]] == [("data-plan", train)]
