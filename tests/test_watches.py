"""``ddpdoctor run``'s watches for silent bugs (issue 24), on real jobs run unchanged under ``run``.

Real gloo worlds of 2 and 3 ranks, mp.spawn and torchrun forms: the tutorial program that never calls
``set_epoch`` (and its fixed twin), a job with four samplers (a constant ``set_epoch``, a hand-made
sampler never told the epoch, and two that are fine: ``set_epoch(epoch)`` with an evaluation pass over the
same loader, ``shuffle=False``) whose DDP model is the desync watch's clean twin, a model never wrapped in
DDP, a module attached after wrapping. Each bug is named once, with its rank(s), line and fix, on the
terminal while the job runs, in the summary and in ``verdict.json``; the clean parts name nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile

import pytest

from jobscripts import free_port, mark_line, write_script
from watchjobs import MODELS, PLANS, SAMPLERS, SEED

CMD = [sys.executable, "-m", "ddpdoctor"]


def _env(cli_env, tmp_path, **extra):
    return {**cli_env, "XDG_STATE_HOME": str(tmp_path / "state"), "DDPDOCTOR_WATCH_WINDOW": "1", **extra}


def torchrun(script, *args, nproc=2):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--monitor-interval=0.2", script, *args]


def ddprun(tmp_path, env, job, *, extra=(), timeout=400):
    run_dir = tmp_path / "run"
    args = CMD + ["run", "--hang-timeout", "20", "--dir", str(run_dir), *extra, "--", *job]
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    return p, run_dir


def found(stderr: str, watch: str) -> list:
    """The lines that named a finding of ``watch`` while the job ran (not the final summary)."""
    return [line for line in stderr.splitlines() if line.startswith(f"ddpdoctor run: [{watch}] ")]


def summary(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("ddpdoctor run: ") and " exit " in line]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def verdict(run_dir) -> dict:
    return json.loads((run_dir / "verdict.json").read_text())


def started(args, env):
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(runs, timeout=400):
    """Wait for the ``run`` processes ``runs``, started together; each one's CompletedProcess. A run still
    going when this ends (a failed wait) gets SIGTERM, which stops its job's whole tree, and is reaped."""
    done = []
    try:
        for run in runs:
            out, err = run.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(run.args, run.returncode, out, err))
    finally:
        for run in runs:
            if run.poll() is None:
                run.terminate()
                try:
                    run.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    run.kill()
                    run.communicate()
    return done


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tutorial_program_without_set_epoch_is_named_and_its_fixed_twin_is_not(cli_env, tmp_path):
    """The tutorial program as its user wrote it (mp.spawn, a DataLoader worker per rank started anew every
    epoch: -j 1), 3 epochs: named once; its fixed twin (--set-epoch), 3 epochs too: nothing named. The two
    jobs are independent (their own state folders and ports), so they run side by side: each one starts
    ten Python processes that import torch, one after another, and leaves a core idle much of the time."""
    script = write_script(tmp_path, "mnist_train.py", SEED)
    port = free_port()
    fixed_port = free_port()
    while fixed_port == port:
        fixed_port = free_port()
    job = [sys.executable, script, "--dist-url", f"tcp://127.0.0.1:{port}", "-j", "1", "--epochs", "3"]
    run_dir = tmp_path / "run"
    fixed_dir = tmp_path / "fixed"
    fixed_dir.mkdir()
    p, fixed = finished([
        started(CMD + ["run", "--hang-timeout", "20", "--dir", str(run_dir), "--", *job], _env(cli_env, tmp_path)),
        started(CMD + ["run", "--hang-timeout", "20", "--", *job[:3], f"tcp://127.0.0.1:{fixed_port}", *job[4:],
                       "--set-epoch"], _env(cli_env, fixed_dir))])
    assert p.returncode == 0, p.stderr[-3000:]
    named = found(p.stderr, "sampler-epoch")
    loop = f"train ({script}:{mark_line(SEED, 'seed_loop')})"
    assert named == [f"ddpdoctor run: [sampler-epoch] ranks 0, 1: the DistributedSampler's shuffled order repeats "
                     f"every epoch: set_epoch is never called, so each training pass over the loader (the loop at "
                     f"{loop}) reads the same order; fix: call sampler.set_epoch(epoch) at the start of every "
                     f"epoch, before the loop over the loader"], p.stderr[-3000:]
    assert found(p.stderr, "desync") == []  # the model is wrapped in DDP: its ranks stay equal
    line = summary(p.stderr)
    assert line.startswith("ddpdoctor run: 2 ranks, exit 0 in ") and "1 silent bug found: [sampler-epoch]" in line
    v = verdict(run_dir)  # kept, with the verdict, although the job succeeded
    assert v["kind"] == "ok" and v["exit_code"] == 0
    assert [(f["watch"], f["ranks"], f["where"]) for f in v["findings"]] == [("sampler-epoch", [0, 1], loop)]
    page = (run_dir / "report.html").read_text()  # the finding in the page's table, with its fix
    findings = page[page.index('<table class="findings">'):]
    assert "<td class=\"l\">sampler-epoch</td><td class=\"l\">0,1</td>" in findings and "set_epoch(epoch)" in findings

    p = fixed
    assert p.returncode == 0, p.stderr[-3000:]
    assert "[sampler-epoch]" not in p.stderr and "[desync]" not in p.stderr and "silent bug" not in p.stderr
    assert summary(p.stderr).endswith("no hang, no rank died")
    assert not list((fixed_dir / "state").rglob("verdict.json"))  # nothing found: the run directory is removed


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_constant_set_epoch_and_a_sampler_never_told_the_epoch_are_named_the_fine_ones_are_not(cli_env, tmp_path):
    """torchrun, 3 ranks, four samplers in one loop; the DDP model (per-rank seeds) is desync's clean twin."""
    script = write_script(tmp_path, "samplers.py", SAMPLERS)
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path), torchrun(script, "3", nproc=3))
    assert p.returncode == 0, p.stderr[-3000:]
    named = found(p.stderr, "sampler-epoch")
    assert len(named) == 2, p.stderr[-3000:]

    def at(mark):
        return f"worker ({script}:{mark_line(SAMPLERS, mark)})"

    constant = next(line for line in named if "set_epoch is called with the same value" in line)
    assert constant.startswith("ddpdoctor run: [sampler-epoch] ranks 0, 1, 2: the DistributedSampler's")
    assert f"(1) every epoch (at {at('constant_set')})" in constant and f"loop at {at('constant_loop')}" in constant
    assert constant.endswith("fix: pass the epoch number that changes every epoch: sampler.set_epoch(epoch)")
    custom = next(line for line in named if "EpochSampler" in line)
    assert custom.startswith("ddpdoctor run: [sampler-epoch] ranks 0, 1, 2: the EpochSampler's first indices "
                             f"repeat from one training pass to the next (the loop at {at('custom_loop')})")
    assert "set_epoch is never called" in custom
    for fine in ("good_loop", "good_eval", "plain_loop"):
        assert at(fine) not in p.stderr
    assert found(p.stderr, "desync") == []
    v = verdict(run_dir)
    assert sorted(f["where"] for f in v["findings"]) == sorted([at("constant_loop"), at("custom_loop")])
    assert all(f["ranks"] == [0, 1, 2] for f in v["findings"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_model_never_wrapped_in_ddp_is_named_while_the_job_runs(cli_env, tmp_path):
    """torchrun, 2 ranks, the same seed, each rank its own data: equal at the first step, apart later."""
    script = write_script(tmp_path, "models.py", MODELS)
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path), torchrun(script, "unwrapped", "150"))
    assert p.returncode == 0, p.stderr[-3000:]
    named = found(p.stderr, "desync")
    assert len(named) == 1, p.stderr[-3000:]
    line = named[0]
    assert line.startswith("ddpdoctor run: [desync] ranks 0, 1: 4 parameter tensors differ across ranks (ranks 0, 1 "
                           "all hold different values), first seen at optimizer step "), line  # a window, not the end
    assert "model.body.weight, model.body.bias, model.head.weight, model.head.bias" in line
    assert "likely reason: the model is never wrapped in DistributedDataParallel" in line
    assert "seeded differently" not in line
    assert f"(worker ({script}:{mark_line(MODELS, 'models_step')}))" in line
    assert "fix: wrap the model in DistributedDataParallel" in line
    assert "1 silent bug found: [desync]" in summary(p.stderr)
    v = verdict(run_dir)
    assert [(f["watch"], f["ranks"]) for f in v["findings"]] == [("desync", [0, 1])]
    assert v["findings"][0]["when"].startswith("at optimizer step ")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_module_attached_after_wrapping_is_named_with_the_ddp_line(cli_env, tmp_path):
    """mp.spawn, 3 ranks seeded by rank: DDP made the body equal, the head attached after it differs."""
    script = write_script(tmp_path, "models.py", MODELS)
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path),
                        [sys.executable, script, "attached", "60", str(free_port()), "3"])
    assert p.returncode == 0, p.stderr[-3000:]
    named = found(p.stderr, "desync")
    assert len(named) == 1, p.stderr[-3000:]
    ddp_line = f"build ({script}:{mark_line(MODELS, 'attached_ddp')})"
    assert named[0] == (
        "ddpdoctor run: [desync] ranks 0, 1, 2: 2 parameter tensors differ across ranks (ranks 0, 1, 2 all hold "
        "different values), first seen at the first optimizer step: model.module.head.weight, "
        "model.module.head.bias; likely reason: model.module.head.weight, model.module.head.bias were attached to "
        f"the model after DistributedDataParallel was built (at {ddp_line}): DDP broadcasts and averages only the "
        "parameters it saw when it was built; fix: attach every module before wrapping: build the whole model, "
        "then DistributedDataParallel(model)")
    assert "body" not in named[0]
    assert [(f["watch"], f["ranks"], f["where"]) for f in verdict(run_dir)["findings"]] == \
        [("desync", [0, 1, 2], ddp_line)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_no_watch_turns_a_watch_off_by_name(cli_env, tmp_path):
    script = write_script(tmp_path, "models.py", MODELS)
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path), torchrun(script, "unwrapped", "30"),
                        extra=("--no-watch", "desync,bn-drift", "--keep"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "[desync]" not in p.stderr and "silent bug" not in p.stderr
    assert not (run_dir / "verdict.json").exists()
    assert not list(run_dir.glob("desync-*"))  # the ranks did not fingerprint at all


@pytest.mark.parametrize("extra, env, bad", [
    (("--no-watch", "desync,sampler"), {}, "--no-watch 'sampler' is not a watch"),
    ((), {"DDPDOCTOR_WATCH_WINDOW": "0"}, "DDPDOCTOR_WATCH_WINDOW='0' is not a number of seconds above 0"),
])
def test_bad_watch_settings_are_one_line_errors_before_the_job_starts(cli_env, tmp_path, extra, env, bad):
    marker = tmp_path / "started"
    p = subprocess.run(CMD + ["run", "--dir", str(tmp_path / "run"), *extra, "--", sys.executable, "-c",
                              f"open({str(marker)!r}, 'w')"], env={**cli_env, **env}, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert bad in p.stderr and "Traceback" not in p.stderr
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ranks_reading_different_data_plans_are_named_before_the_epoch_ends(cli_env, tmp_path):
    """torchrun, 2 ranks: a dataset one sample longer on rank 1, then a split by hand with one more batch on
    rank 1; the job then fails or hangs on the extra batches, and its verdict names the plans too."""
    script = write_script(tmp_path, "plans.py", PLANS)
    run_dir = tmp_path / "run"
    p = subprocess.run(CMD + ["run", "--hang-timeout", "10", "--dir", str(run_dir), "--",
                              *torchrun(script)], env=_env(cli_env, tmp_path), capture_output=True, text=True,
                       timeout=400)
    assert p.returncode != 0, p.stderr[-3000:]
    named = found(p.stderr, "data-plan")
    length = f"<module> ({script}:{mark_line(PLANS, 'plan_length')})"
    split = f"<module> ({script}:{mark_line(PLANS, 'plan_split')})"
    assert len(named) == 2, p.stderr[-3000:]
    assert named[0] == (
        f"ddpdoctor run: [data-plan] ranks 0, 1: the ranks read different data plans at the loop at {length}: "
        "batches: rank 0 5, rank 1 6; dataset length: rank 0 50, rank 1 51; the ranks run different numbers of "
        "batches this epoch: the epoch's end will hang (a rank with more batches waits in a collective the "
        "others never join) or pair collectives of different steps; fix: give every rank the same dataset and "
        "the same DistributedSampler settings (it pads the shards to equal length), or drop_last=True; for "
        "uneven inputs on purpose, DDP's join() context manager"), named[0]
    assert named[1].startswith(f"ddpdoctor run: [data-plan] ranks 0, 1: the ranks read different data plans at "
                               f"the loop at {split}: batches: rank 0 5, rank 1 6; dataset length: rank 0 25, "
                               "rank 1 26; the ranks run different numbers of batches"), named[1]
    verdict_at = next(i for i, line in enumerate(p.stderr.splitlines(keepends=True))
                      if line.startswith("ddpdoctor run: ") and not line.startswith("ddpdoctor run: ["))
    verdict_at = len("".join(p.stderr.splitlines(keepends=True)[:verdict_at]))
    assert p.stderr.index(named[1]) < verdict_at  # named before the job's end
    assert "silent bug: [data-plan]" in p.stderr[verdict_at:]  # and again in the verdict
    v = verdict(run_dir)
    assert [(f["watch"], f["where"]) for f in v["findings"]] == [("data-plan", length), ("data-plan", split)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_hang_mid_window_is_still_a_hang(cli_env, tmp_path):
    """The watches' files are no progress: a job that hangs after its steps began, with 1 s windows, is
    declared hung after --hang-timeout, stacks and all, and no watch names anything."""
    script = write_script(tmp_path, "models.py", MODELS)
    run_dir = tmp_path / "run"
    p = subprocess.run(CMD + ["run", "--hang-timeout", "6", "--dir", str(run_dir), "--",
                              *torchrun(script, "hang", "60")], env=_env(cli_env, tmp_path), capture_output=True,
                       text=True, timeout=400)
    assert p.returncode == 124, p.stderr[-3000:]
    assert "ddpdoctor run: hung: no rank made progress for 6s" in p.stderr
    assert f"({script}:{mark_line(MODELS, 'models_hang')})" in p.stderr  # rank 1's stack: where it stopped
    assert "[desync]" not in p.stderr and "silent bug" not in p.stderr
    assert verdict(run_dir)["findings"] == []


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode, form, reason, mark", [
    ("seeded", "torchrun", "the model is never wrapped in DistributedDataParallel: each rank steps with its own "
     "gradients, and the ranks were seeded differently (their parameters differ from the first step: no DDP "
     "broadcast made them equal)", "models_step"),
    ("nosync", "mp.spawn", "DistributedDataParallel was built with init_sync=False (at build ({script}:{line})): "
     "rank 0's parameters were never broadcast", "nosync_ddp"),
])
def test_ranks_that_start_apart_are_named_at_the_first_step_with_the_reason(cli_env, tmp_path, mode, form, reason,
                                                                               mark):
    script = write_script(tmp_path, "models.py", MODELS)
    job = torchrun(script, mode, "20") if form == "torchrun" else \
        [sys.executable, script, mode, "20", str(free_port()), "2"]
    p, run_dir = ddprun(tmp_path, _env(cli_env, tmp_path), job)
    assert p.returncode == 0, p.stderr[-3000:]
    named = found(p.stderr, "desync")
    assert len(named) == 1, p.stderr[-3000:]
    assert named[0].startswith("ddpdoctor run: [desync] ranks 0, 1: 4 parameter tensors differ across ranks (ranks "
                               "0, 1 all hold different values), first seen at the first optimizer step: "), named[0]
    line = mark_line(MODELS, mark)
    assert "likely reason: " + reason.format(script=script, line=line) in named[0]
    where = verdict(run_dir)["findings"][0]["where"]
    assert where.endswith(f"({script}:{line})"), where


RANK_SIDE = r"""
import glob, json, os, sys
sys.path.insert(0, sys.argv[3])  # the injected folder, as run puts it on PYTHONPATH
os.environ["DDPDOCTOR_WATCH_DESYNC"] = "0"
import _ddpdoctor_watches
_ddpdoctor_watches.start(sys.argv[1], {"rank": 0})  # before torch: installed when `import torch` ends
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
ds = TensorDataset(torch.randn(32, 4))
sampler = DistributedSampler(ds, num_replicas=1, rank=0)
loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=1, persistent_workers=True)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    if sys.argv[2] == "set_epoch":
        sampler.set_epoch(epoch)
    for (x,) in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    with torch.no_grad():
        for (x,) in loader:  # evaluation on the training set: the same iterator (persistent workers)
            model(x)
del loader  # its worker ends here
print(json.dumps([json.load(open(f))["key"].split(":")[0] for f in sorted(glob.glob(sys.argv[1] + "/finding-*"))]))
"""


def _watches_only(tmp_path):
    """A folder with the hook's modules but its sitecustomize (a rank side run by hand imports them itself)."""
    import os

    import ddpdoctor.postmortem.rundir as rundir

    inject = tmp_path / "inject"
    inject.mkdir()
    for source, name in rundir.inject_files():
        if name != "sitecustomize.py":
            os.symlink(source, inject / name)
    return inject


@pytest.mark.parametrize("mode, keys", [("set_epoch", []), ("never", ["never-called"])])
def test_evaluation_pass_on_a_persistent_workers_loader_is_not_a_training_pass(tmp_path, mode, keys):
    """The rank side alone, in a real process: a loader with persistent workers hands out one iterator
    for every pass, so the evaluation pass over it must end when the next pass starts, not count as
    training at the next epoch's first step."""
    import os

    inject = _watches_only(tmp_path)
    script = tmp_path / "rank_side.py"
    script.write_text(RANK_SIDE)
    # the worker's multiprocessing folder (a socket in it: the path must stay short), removed here
    short = tempfile.mkdtemp(prefix="w-")
    try:
        p = subprocess.run([sys.executable, str(script), str(tmp_path), mode, str(inject)], capture_output=True,
                           text=True, timeout=100, env={**os.environ, "TMPDIR": short})
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.splitlines()[-1]) == keys


WINDOWS_APART = r"""
import json, os, sys
sys.path.insert(0, sys.argv[2])  # the injected folder, as run puts it on PYTHONPATH
import _ddpdoctor_watches
run_dir, rank, period = sys.argv[1], int(sys.argv[3]), sys.argv[4]
beat = _ddpdoctor_watches.start(run_dir, {"rank": rank})
import torch
if period != "0":  # the period run wrote, read by this rank's beat before the other rank's beat read it
    with open(os.path.join(run_dir, "desync-period"), "w") as f:
        f.write(period + "\n")
beat()


def train(model, opt, x):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def job():
    torch.manual_seed(0)
    first, second = torch.nn.Linear(3, 2), torch.nn.Linear(3, 1)  # never wrapped in DDP
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (first, second)]
    same, own = torch.Generator().manual_seed(0), torch.Generator().manual_seed(rank)
    for _ in range(3):  # the first model reads the same data on every rank (stays equal), the second its own
        for m, opt, x in zip((first, second), opts, (torch.randn(4, 3, generator=same),
                                                     torch.randn(4, 3, generator=own) + rank)):
            train(m, opt, x)
    _ddpdoctor_watches._state.final("the job's end")


job()
"""


def test_an_unwrapped_model_is_named_when_one_rank_took_a_window_the_other_did_not(tmp_path):
    """The rank side in real processes, two ranks of a job with two optimizers: one read the period on its
    beat in time for a window, the other not (each reads it on its own beat: under load, or in a short job,
    they differ). Their end fingerprints still name each tensor alike, by its place and by the user's name
    taken at its optimizer's first step, so run compares them and names the second model, never wrapped in
    DDP, whose ranks read their own data. Before, rank 0 named the second optimizer's tensors from the
    window's frame and rank 1 by position: they were in no comparison and the desync went unnamed."""
    import os

    from ddpdoctor.postmortem.watches import Watches

    inject = _watches_only(tmp_path)
    script = tmp_path / "windows_apart.py"
    script.write_text(WINDOWS_APART)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPDOCTOR_")}
    procs = []
    for rank, period in ((0, "3"), (1, "0")):  # rank 0: windows at steps 3 and 6; rank 1: none
        (tmp_path / f"r{rank}").mkdir()
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path / f"r{rank}"), str(inject),
                                       str(rank), period], stderr=subprocess.PIPE, text=True, env=env))
    for p in procs:
        _, err = p.communicate(timeout=100)
        assert p.returncode == 0, err[-3000:]
    assert len(list((tmp_path / "r0").glob("desync-*-window-*.json"))) == 2
    assert not list((tmp_path / "r1").glob("desync-*-window-*.json"))
    finals = []
    for rank in (0, 1):
        [path] = (tmp_path / f"r{rank}").glob("desync-*-final-6.json")
        finals.append({**json.loads(path.read_text()), "rank": rank})
    watches = Watches(str(tmp_path), 1.0, {})
    watches._compare(("final", 6), finals, 0.0)
    assert [(f.watch, f.ranks) for f in watches.findings] == [("desync", [0, 1])], [t[0] for t in finals[1]["tensors"]]
    assert watches.findings[0].what.startswith(
        "2 parameter tensors differ across ranks (ranks 0, 1 all hold different values), first seen at the end "
        "(after 6 optimizer steps): model.weight (optimizer 1 parameter 0), model.bias (optimizer 1 parameter 1); "
        "likely reason: the model is never wrapped in DistributedDataParallel"), watches.findings[0].what
    shown = [[tuple(t[:1] + t[3:]) for t in f["tensors"]] for f in finals]  # (name, place): alike on both ranks
    assert shown[0] == shown[1] == [("model.weight", "optimizer 0 parameter 0"),
                                    ("model.bias", "optimizer 0 parameter 1"),
                                    ("model.weight", "optimizer 1 parameter 0"),
                                    ("model.bias", "optimizer 1 parameter 1")], shown
