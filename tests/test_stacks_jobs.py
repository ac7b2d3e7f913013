"""``ddpdoctor stacks`` with no PID on a node shared by several jobs and users (issue 23): another user's
rank is never signalled unless its PID was given, and two jobs are judged apart.

Each scenario runs in a PID namespace of its own (``unshare --pid --mount-proc``, as root): a scan for
ranks sees only the scenario's processes, never the ranks of other test runs on a shared machine
(which it would otherwise signal), and the namespace's end takes every process in it along.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ddpdoctor.postmortem.rundir import inject_files
from jobscripts import line_of, mark_line, torchrun, write_script, write_train

NOBODY = 65534


def _namespace_reason() -> str:
    if os.getuid() != 0:
        return "needs root (a PID namespace, a process of another user)"
    if shutil.which("unshare") is None:
        return "needs util-linux's unshare"
    p = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30)
    return "" if p.returncode == 0 else "cannot create a PID namespace here: " + p.stderr.decode()[-200:]


_REASON = _namespace_reason()
needs_namespace = pytest.mark.skipif(bool(_REASON), reason=_REASON or "-")


def in_namespace(driver: str, *args: str, env: dict, timeout: float) -> dict:
    """Run ``driver`` (a Python script that prints one JSON line last) as PID 1's child in a new PID
    namespace; its JSON."""
    p = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, driver, *args],
                       env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


OTHER_USER = r'''
import json, os, subprocess, sys, time

run_dir, nobody = sys.argv[1], int(sys.argv[2])
env = {"PATH": "/usr/bin:/bin", "RANK": "0", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "theirs",
       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "DDPDOCTOR_RUN_DIR": run_dir}
# looks like a rank in every way the scan looks: launcher variables, a registration by run's hook, a
# SIGUSR2 handler installed; it says "signalled" for each SIGUSR2 it gets
sh = subprocess.Popen(["/bin/sh", "-c", "trap 'echo signalled' USR2; echo ready; while :; do sleep 0.05; done"],
                      env=env, cwd="/", user=nobody, group=nobody, extra_groups=[], stdout=subprocess.PIPE, text=True)
assert sh.stdout.readline() == "ready\n"
with open(os.path.join(run_dir, f"proc-{sh.pid}.json"), "w") as f:
    json.dump({"pid": sh.pid, "role": "rank", "rank": 0, "signal": "SIGUSR2",
               "stack_file": os.path.join(run_dir, f"stacks-{sh.pid}.txt")}, f)
open(os.path.join(run_dir, f"stacks-{sh.pid}.txt"), "w").close()
cmd = [sys.executable, "-m", "ddpdoctor", "stacks", "--wait", "1"]
scan = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
given = subprocess.run(cmd + [str(sh.pid)], capture_output=True, text=True, timeout=120)
time.sleep(1.0)  # the trap runs at the next turn of the loop (0.05 s)
sh.kill()
out = sh.communicate(timeout=30)[0]
print(json.dumps({"pid": sh.pid, "uid": os.stat(f"/proc/self").st_uid, "scan": [scan.returncode, scan.stdout + scan.stderr],
                  "given": [given.returncode, given.stdout + given.stderr], "signalled": out.count("signalled")}))
'''


@needs_namespace
@pytest.mark.timeout(180)
def test_stacks_never_signals_another_users_rank_unless_its_pid_is_given(cli_env, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    driver = write_script(tmp_path, "other_user.py", OTHER_USER)
    got = in_namespace(driver, str(run_dir), str(NOBODY), env=cli_env, timeout=170)
    # the scan, run as root, passes over nobody's rank: not listed, not signalled
    assert got["scan"][0] == 2 and "no rank processes found on this node" in got["scan"][1], got
    # its PID given: asked for, so read (its handler is the shell's trap: it answers, writes no stack)
    assert got["given"][0] == 1 and f"rank 0 (pid {got['pid']}): no stack" in got["given"][1], got
    assert got["signalled"] == 1, got  # exactly the one request made by PID


HEALTHY = r'''
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(4))
open(os.path.join(sys.argv[1], f"ready-{dist.get_rank()}"), "w").close()


def think():
    time.sleep(600)  # MARK:think


think()
'''

TWO_JOBS = r'''
import glob, json, os, shutil, signal, subprocess, sys, time

inject, hung_script, healthy_script, base = json.loads(sys.argv[1]), *sys.argv[2:5]
torchrun = json.loads(sys.argv[5])
jobs = []
for name, script, args in (("hung", hung_script, ["hang", "20"]), ("healthy", healthy_script, [base])):
    run_dir = os.path.join(base, name)
    os.makedirs(os.path.join(run_dir, ".inject"))
    for source, name in inject:  # the hook and the modules it loads (its stack thread's among them)
        shutil.copy(source, os.path.join(run_dir, ".inject", name))
    env = {**os.environ, "DDPDOCTOR_RUN_DIR": run_dir, "DDPDOCTOR_BEAT_S": "0.2",
           "PYTHONPATH": os.path.join(run_dir, ".inject") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    jobs.append(subprocess.Popen(torchrun + [script] + args, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True))
pids = {}
deadline = time.monotonic() + 120
out, p = "", None
while time.monotonic() < deadline:
    time.sleep(0.5)
    ranks = {n: [json.load(open(p))["pid"] for p in glob.glob(os.path.join(base, n, "proc-*.json"))]
             for n in ("hung", "healthy")}
    ranks = {n: [p for p in ps if json.load(open(os.path.join(base, n, f"proc-{p}.json"))).get("role") == "rank"]
             for n, ps in ranks.items()}
    if len(ranks["hung"]) < 2 or len(glob.glob(os.path.join(base, "ready-*"))) < 2:
        continue
    p = subprocess.run([sys.executable, "-m", "ddpdoctor", "stacks", "--wait", "5"], capture_output=True,
                       text=True, timeout=120)
    out = p.stdout + p.stderr
    pids = ranks
    # the hang has set in (rank 0 of the hung job blocked in its all_reduce, rank 1 reading): judge now
    if out.count("all_reduce, called from train") == 1 and "dataset_read" in out:
        break
for job in jobs:
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
print(json.dumps({"out": out, "pids": pids, "code": p.returncode if p else None}))
'''


@needs_namespace
@pytest.mark.timeout(300)
def test_stacks_judges_two_jobs_on_one_node_apart(cli_env, tmp_path):
    hung = write_train(tmp_path)
    healthy = write_script(tmp_path, "healthy.py", HEALTHY)
    driver = write_script(tmp_path, "two_jobs.py", TWO_JOBS)
    got = in_namespace(driver, json.dumps(inject_files()), hung, healthy, str(tmp_path), json.dumps(torchrun("")[:-1]),
                       env=cli_env, timeout=280)
    out, pids = got["out"], got["pids"]
    assert got["code"] == 0 and len(pids["hung"]) == 2 and len(pids["healthy"]) == 2, got
    lines = out.splitlines()
    assert lines[0] == "ddpdoctor stacks: 4 rank processes in 2 jobs (each judged alone)", out
    heads = [i for i, line in enumerate(lines) if line.startswith("job ")]
    assert len(heads) == 2 and all(lines[i].startswith(f"job {n} of 2: 2 rank processes (launcher pid ")
                                   for n, i in zip((1, 2), heads)), out
    sections = [lines[heads[0]:heads[1]], lines[heads[1]:]]
    hung_part = next(s for s in sections if any("dataset_read" in line for line in s))
    healthy_part = next(s for s in sections if s is not hung_part)
    assert f"  rank 0: all_reduce, called from train ({hung}:{line_of('all_reduce')})" in hung_part, out
    assert f"  rank 1: dataset_read ({hung}:{line_of('dataset')})   <- the odd one out" in hung_part, out
    # the healthy job: both ranks at the same line, nobody the odd one out, no rank number repeated in it
    assert f"  ranks 0-1: think ({healthy}:{mark_line(HEALTHY, 'think')})" in healthy_part, out
    assert not any("odd one out" in line for line in healthy_part), out
    # every rank's own dump is labelled with its job
    for n in (1, 2):
        assert sum(f"--- job {n}, rank " in line for line in lines) == 2, out
