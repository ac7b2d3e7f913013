"""``ddpdoctor run``'s ``bn-drift`` watch (issue 24): BatchNorm statistics that differ where it matters.

Real gloo jobs run unchanged under ``run``: one torchrun job of 3 ranks with three planted bugs in three
models (DDP with ``broadcast_buffers=False``; a model never wrapped in DDP; default DDP evaluated through
``model.module``) and a clean model beside them, then the clean twins alone (torchrun, 2 ranks: default
DDP with BatchNorm trained and evaluated through the wrapper, whose ranks differ by one update after every
step, which is not a bug; and the buffer broadcast off with the fix applied). Each rank's data is shifted
by its rank.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from jobscripts import mark_line, write_script
from test_watches import _env, ddprun, found, summary, torchrun, verdict
from watchjobs import BATCHNORM

FIX = ("fix: call ddpdoctor.sync_bn_stats(model) on every rank before evaluation and checkpointing (CPU and GPU), "
       "or on GPU convert with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_batchnorm_drift_is_named_per_cause_with_ranks_line_size_and_fixes(cli_env, tmp_path):
    script = write_script(tmp_path, "bn.py", BATCHNORM)
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path),
                        torchrun(script, "syncoff,noddp,moduleeval,clean", "10", nproc=3))
    assert p.returncode == 0, p.stderr[-3000:]
    named = found(p.stderr, "bn-drift")
    assert len(named) == 3, p.stderr[-4000:]

    def at(func, mark):
        return f"{func} ({script}:{mark_line(BATCHNORM, mark)})"

    def one(text):
        lines = [line for line in named if text in line]
        assert len(lines) == 1, named
        line = lines[0]
        assert line.startswith("ddpdoctor run: [bn-drift] ranks 0, 1, 2: BatchNorm running statistics differ "
                               "across ranks at "), line
        assert "1 layer by more than 1%: " in line and line.endswith(FIX[len("fix: "):]), line
        return line

    sync_off = one("syncoff.module.1 by ")
    assert "(rank 2 against rank 0)" in sync_off  # the rank whose data is furthest from rank 0's
    assert (f"DistributedDataParallel was built with its buffer broadcast off (broadcast_buffers=False or "
            f"forward_sync_buffers=False, at {at('worker', 'bn_syncoff')})") in sync_off
    no_ddp = one("noddp.1 by ")
    assert f"the model is never wrapped in DistributedDataParallel (trained at {at('train', 'bn_train')})" in no_ddp
    module_eval = one("moduleeval.module.1 by ")
    assert (f"the model is evaluated through model.module (at {at('worker', 'bn_module_eval')}), which skips DDP's "
            "broadcast of rank 0's buffers") in module_eval
    assert "fix: evaluate through the DDP model (model(x), not model.module(x)), or call ddpdoctor.sync_bn_stats" \
        in module_eval
    for line in named:  # the size of the drift: a percentage above the 1% threshold
        size = float(re.search(r"\.1 by ([0-9.]+)% \(rank", line).group(1))
        assert size > 1.0, line
    assert "clean.module" not in p.stderr  # the clean model beside them: silent
    assert "[bn-drift]" in summary(p.stderr) and "[desync]" in summary(p.stderr)  # in the final summary too
    # desync names the unwrapped model too (its ranks read their own data), by the names of its first step: never
    # left out because the ranks took different windows (each reads the period on its own beat), nor by position
    [desync] = found(p.stderr, "desync")
    assert desync.startswith("ddpdoctor run: [desync] ranks 0, 1, 2: "), desync
    assert ": model.0.weight, model.1.weight, " in desync and "optimizer 1 parameter" not in desync, desync
    assert ("are stepped by an optimizer but in no DistributedDataParallel model: nothing averages its gradients "
            f"({at('train', 'bn_step')})") in desync, desync
    v = verdict(run_dir)
    bn = [f for f in v["findings"] if f["watch"] == "bn-drift"]
    assert sorted(f["where"] for f in bn) == sorted([at("worker", "bn_syncoff"), at("train", "bn_train"),
                                                     at("worker", "bn_module_eval")])
    assert all(f["ranks"] == [0, 1, 2] for f in bn)
    assert not list(run_dir.glob("bn-*"))  # every record read and removed


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_default_ddp_trained_and_evaluated_through_the_wrapper_and_the_fixed_job_are_silent(cli_env, tmp_path):
    """torchrun, 2 ranks: default DDP, whose ranks' statistics differ by one update after every step
    (rank-dependent data) until the next forward through DDP, training or evaluation, makes them equal;
    and DDP with broadcast_buffers=False fixed as the finding says (sync_bn_stats before every evaluation
    and at the end). Nothing to name."""
    script = write_script(tmp_path, "bn.py", BATCHNORM)
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path),
                        torchrun(script, "clean,fixed", "20"), extra=("--keep",))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "[bn-drift]" not in p.stderr and "silent bug" not in p.stderr, p.stderr[-3000:]
    assert "no hang, no rank died; kept " in summary(p.stderr)
    assert not list(run_dir.glob("bn-*"))  # the records (the fixed model's) were read and removed


RANK_SIDE = r"""
import json, os, sys
sys.path.insert(0, sys.argv[2])  # the injected folder, as run puts it on PYTHONPATH
import _ddpdoctor_watches
off, on = sys.argv[1] + "/off", sys.argv[1] + "/on"
os.environ["DDPDOCTOR_WATCH_BN_DRIFT"] = "0"  # what --no-watch bn-drift sets in the job's environment
_ddpdoctor_watches.start(off, {"rank": 0})  # before torch: installed when `import torch` ends
import torch
from torch.nn.modules.batchnorm import _BatchNorm


def job():
    bn = torch.nn.BatchNorm1d(4)
    opt = torch.optim.SGD(bn.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        bn(torch.randn(8, 4)).sum().backward()
        opt.step()
    bn.eval()
    bn(torch.randn(8, 4))  # an evaluation of a model never wrapped: recorded when the watch is on


def records(folder):
    return sorted(n.split("-")[2] for n in os.listdir(folder) if n.startswith("bn-"))


job()
seen = {"off": [getattr(_BatchNorm.forward, "_ddpdoctor_watch", False), records(off)]}
os.environ["DDPDOCTOR_WATCH_BN_DRIFT"] = "1"  # the positive control, in the same process: the watch on
assert _ddpdoctor_watches._Rank(on, {"rank": 0}).install()
job()
seen["on"] = [getattr(_BatchNorm.forward, "_ddpdoctor_watch", False), records(on)]
print(json.dumps(seen))
"""


def test_bn_drift_is_switched_off_by_its_variable_in_the_rank(tmp_path):
    """The rank side alone, in a real process: DDPDOCTOR_WATCH_BN_DRIFT=0 (what --no-watch bn-drift sets)
    leaves torch's BatchNorm untouched and records nothing; the same job with the watch on records the
    evaluation of a model never wrapped in DDP."""
    import ddpdoctor.postmortem.rundir as rundir

    inject = tmp_path / "inject"
    inject.mkdir()
    for source, name in rundir.inject_files():
        if name != "sitecustomize.py":
            os.symlink(source, inject / name)
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    script = tmp_path / "rank_side.py"
    script.write_text(RANK_SIDE)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DDPDOCTOR_")}
    p = subprocess.run([sys.executable, str(script), str(tmp_path), str(inject)], capture_output=True, text=True,
                       timeout=100, env=clean)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.splitlines()[-1]) == {"off": [False, []], "on": [True, ["eval"]]}
