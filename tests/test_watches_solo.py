"""``ddpdoctor run``'s ``solo-wait`` watch (issue 24, watch 5), on real gloo jobs run unchanged under ``run``.

Rank 0 "saves a checkpoint" alone (a busy loop in ``save_checkpoint``) while rank 1 waits for it in a
collective, under ``init_process_group(timeout=8 s)``. A save of most of the timeout is named while the
job runs, before the timeout would end it (rank 1 waiting, its line, "4 s of 8 s", rank 0 in
``save_checkpoint`` at its line, both fixes); the job goes on, exits 0, and its summary and
``verdict.json`` keep the warning. Rank 0 busy alone is not a hang (``--hang-timeout`` is shorter than the
save). The clean twin is the same job's first save: short (0.3 s, before a barrier of its own line), and
nothing names it (one job for both: each costs the suite ~14 s).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jobscripts import free_port, mark_line, write_script

CMD = [sys.executable, "-m", "ddpdoctor"]

# mp.spawn, 2 gloo ranks, timeout 8 s. Rank 0 saves twice: argv[2] seconds (before a barrier), then argv[3]
# seconds (before an all_reduce); rank 1 waits for it each time.
SOLO = r'''
import datetime, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def save_checkpoint(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end: sum(range(2000))  # MARK:solo_busy


def worker(rank, port, first, second):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=8))  # MARK:solo_init
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 0:
        save_checkpoint(first)
    dist.barrier()  # MARK:solo_first
    if rank == 0:
        save_checkpoint(second)
    dist.all_reduce(t)  # MARK:solo_second
    assert t.item() == 4.0
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])), nprocs=2)
'''


def _run(cli_env, tmp_path, first, second):
    script = write_script(tmp_path, "solo.py", SOLO)
    run_dir = tmp_path / "run"
    env = {**cli_env, "XDG_STATE_HOME": str(tmp_path / "state")}
    # --hang-timeout 5: shorter than the save, while rank 1 waits all along: rank 0 busy alone is no hang
    p = subprocess.run(CMD + ["run", "--hang-timeout", "5", "--dir", str(run_dir), "--", sys.executable, script,
                              str(free_port()), str(first), str(second)],
                       env=env, capture_output=True, text=True, timeout=300)
    return p, run_dir, script


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.timeout(400)
def test_rank_saving_alone_for_most_of_the_timeout_is_named_before_it_ends_the_job(cli_env, tmp_path):
    """A short save (0.3 s, before the barrier) names nothing; the long one (6 s of the 8 s timeout, before
    the all_reduce) is named once, while rank 0 still saves, and the job goes on to exit 0."""
    p, run_dir, script = _run(cli_env, tmp_path, 0.3, 6.0)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "hung" not in p.stderr, p.stderr[-3000:]
    named = [line for line in p.stderr.splitlines() if line.startswith("ddpdoctor run: [solo-wait] ")]
    assert len(named) == 1, p.stderr[-3000:]
    wait = f"worker ({script}:{mark_line(SOLO, 'solo_second')})"
    init = f"worker ({script}:{mark_line(SOLO, 'solo_init')})"
    busy = f"save_checkpoint ({script}:{mark_line(SOLO, 'solo_busy')})"
    line = named[0]
    assert line.startswith("ddpdoctor run: [solo-wait] rank 1: rank 1 waited "), line
    waited = float(line.split(" waited ")[1].split(" s of ")[0])
    assert 4.0 <= waited < 8.0, line  # half the timeout, seen within a beat or two
    assert (f" s of 8 s (the process group's timeout: timeout= passed to init_process_group at {init}) in "
            f"all_reduce at {wait} for rank 0, which was still in {busy}, outside any collective: a wait that "
            "reaches 8 s ends the job; fix: raise timeout= in init_process_group (now 8 s) above the longest solo "
            "work, or move that work out from between the collectives") in line, line
    assert line.endswith("or make it collective (every rank takes part)"), line
    assert f"({script}:{mark_line(SOLO, 'solo_first')})" not in p.stderr  # the short save's wait: silent
    # named while the job ran: before the summary, which keeps it
    summary = [s for s in p.stderr.splitlines() if s.startswith("ddpdoctor run: 2 ranks, exit 0 in ")]
    assert len(summary) == 1, p.stderr[-3000:]
    assert p.stderr.index(line) < p.stderr.index(summary[0])
    assert "no hang, no rank died; 1 silent bug found: [solo-wait] rank 1: " in summary[0]
    v = json.loads((run_dir / "verdict.json").read_text())
    assert v["kind"] == "ok" and v["exit_code"] == 0
    assert [(f["watch"], f["ranks"], f["where"]) for f in v["findings"]] == [("solo-wait", [1], wait)]
    assert busy in v["findings"][0]["what"]


TIMEOUTS = r"""
import datetime, json, os, sys
sys.path.insert(0, sys.argv[2])  # the injected folder, as run puts it on PYTHONPATH
import _ddpdoctor_watches
_ddpdoctor_watches.start(sys.argv[1], {"rank": 0})  # before torch: installed when `import torch` ends
import torch.distributed as dist
seen = []
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # MARK:default_init
seen.append([_ddpdoctor_watches._state.solo.timeout, _ddpdoctor_watches._state.solo.timeout_from])
dist.destroy_process_group()
dist.init_process_group("gloo", None, datetime.timedelta(seconds=5), 1, 0, dist.HashStore())  # MARK:positional_init
seen.append([_ddpdoctor_watches._state.solo.timeout, _ddpdoctor_watches._state.solo.timeout_from])
dist.destroy_process_group()
os.environ["DDPDOCTOR_WATCH_SOLO_WAIT"] = "0"
seen.append(_ddpdoctor_watches._Rank(sys.argv[1], {}).solo is None)
print(json.dumps(seen))
"""


def test_the_timeout_is_the_one_init_process_group_was_given_else_the_backends_default(tmp_path):
    """The rank side alone, in a real process: ``timeout=`` given by position is read; none given is
    gloo's default (30 min), named as such; ``DDPDOCTOR_WATCH_SOLO_WAIT=0`` turns the watch off."""
    import os

    import ddpdoctor.postmortem.rundir as rundir

    inject = tmp_path / "inject"
    inject.mkdir()
    for source, name in rundir.inject_files():
        if name != "sitecustomize.py":
            os.symlink(source, inject / name)
    script = write_script(tmp_path, "timeouts.py", TIMEOUTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPDOCTOR_")}
    p = subprocess.run([sys.executable, script, str(tmp_path), str(inject)], capture_output=True, text=True,
                       timeout=100, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    default, positional, off = json.loads(p.stdout.splitlines()[-1])
    assert default == [1800.0, f"gloo's default, init_process_group at <module> "
                                f"({script}:{mark_line(TIMEOUTS, 'default_init')})"]
    assert positional == [5.0, f"timeout= passed to init_process_group at <module> "
                               f"({script}:{mark_line(TIMEOUTS, 'positional_init')})"]
    assert off is True


def test_run_side_groups_the_waiting_ranks_names_each_line_once_and_nothing_when_all_wait(tmp_path):
    """run's side alone, on the files the hook writes (their format as in ``_ddpdoctor_watches``): three
    ranks, two waiting at one line for a third; then every rank waiting (a hang: the hang detector's, not
    this watch's); a second wait at a named line is not named again."""
    import types

    from ddpdoctor.postmortem.watches import Watches

    def write(name, data):
        (tmp_path / name).write_text(json.dumps(data))

    procs = [types.SimpleNamespace(pid=100 + r, rank=r, alive=True) for r in range(3)]
    w = Watches(str(tmp_path), 60.0, {"DDPDOCTOR_BEAT_S": "0.5"})
    wait = {"state": "waiting", "what": "barrier", "waited": 450.0, "timeout": 1800.0,
            "timeout_from": "gloo's default", "where": "train (t.py:9)"}
    for r in (1, 2):
        write(f"solo-{100 + r}.json", {**wait, "pid": 100 + r, "rank": r})
    assert w.poll(0.0, procs) == []  # a quarter: only a question for every rank
    token = (tmp_path / "solo-ask").read_text().strip()
    write("solo-where-100.json", {"pid": 100, "rank": 0, "token": token, "where": "save (t.py:4)", "waiting": False,
                                  "what": ""})
    for r in (1, 2):
        write(f"solo-{100 + r}.json", {**wait, "state": "long", "waited": 900.0, "pid": 100 + r, "rank": r})
    lines = w.poll(0.3, procs)
    assert lines == ["[solo-wait] ranks 1, 2: ranks 1, 2 waited 15 min of 30 min (the process group's timeout: "
                     "gloo's default) in barrier at train (t.py:9) for rank 0, which was still in save (t.py:4), "
                     "outside any collective: a wait that reaches 30 min ends the job; fix: raise timeout= in "
                     "init_process_group (now 30 min) above the longest solo work, or move that work out from "
                     "between the collectives (after the last one, or into a background thread) or make it "
                     "collective (every rank takes part)"]
    assert w.poll(5.0, procs) == []  # named once
    # every rank waits at another line: nobody works alone
    for r in range(3):
        write(f"solo-{100 + r}.json", {**wait, "state": "long", "where": "train (t.py:12)", "pid": 100 + r, "rank": r})
    assert w.poll(10.0, procs) == [] and w.poll(20.0, procs) == []
    assert [f.where for f in w.findings] == ["train (t.py:9)"]
