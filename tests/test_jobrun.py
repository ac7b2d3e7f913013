"""``ddpdoctor run``: real torchrun jobs on CPU (gloo) that hang, raise, or lose a rank to SIGKILL."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from ddpdoctor.exitcodes import ExitCode
from jobscripts import line_of, torchrun, write_train

CMD = [sys.executable, "-m", "ddpdoctor", "run"]


def ddprun(tmp_path, env, mode, *, nproc=2, hang=3.0, extra=(), steps="20", timeout=120):
    script = write_train(tmp_path)
    run_dir = tmp_path / "run"
    args = CMD + ["--hang-timeout", str(hang), "--dir", str(run_dir), *extra, "--",
                  *torchrun(script, mode, steps, nproc=nproc)]
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    return p, run_dir, script  # shown as given: not under the cwd, so the whole path


def assert_nothing_left(run_dir):
    pids = [int(os.path.basename(p)[5:-5]) for p in glob.glob(str(run_dir / "proc-*.json"))]
    assert pids
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"ranks left running: {alive}"


@pytest.mark.timeout(120)
def test_hang_names_the_rank_and_line_and_exits_124(cli_env, tmp_path):
    p, run_dir, name = ddprun(tmp_path, cli_env, "hang")
    assert p.returncode == ExitCode.HUNG, p.stderr[-3000:]
    err = p.stderr
    assert "ddpdoctor run: hung: no rank made progress for 3s" in err
    assert f"  rank 0: all_reduce, called from train ({name}:{line_of('all_reduce')})" in err
    assert f"  rank 1: dataset_read ({name}:{line_of('dataset')})   <- the odd one out" in err
    assert "stacks read with the in-process handler (faulthandler)" in err
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert {s["rank"] for s in verdict["stacks"]} == {0, 1}
    assert (run_dir / "verdict.txt").read_text().startswith("ddpdoctor run: hung")
    assert "dataset_read" in (run_dir / "stacks.txt").read_text()
    assert (run_dir / "output.log").exists()
    assert_nothing_left(run_dir)


@pytest.mark.timeout(120)
def test_rank_skipping_an_all_reduce_is_the_odd_one_out(cli_env, tmp_path):
    p, run_dir, name = ddprun(tmp_path, cli_env, "skip", nproc=3, steps="10")
    assert p.returncode == ExitCode.HUNG, p.stderr[-3000:]
    assert f"  ranks 0,2: all_reduce, called from train ({name}:{line_of('all_reduce')})" in p.stderr
    assert f"  rank 1:    barrier, called from train ({name}:{line_of('barrier')})   <- the odd one out" in p.stderr
    assert_nothing_left(run_dir)


@pytest.mark.timeout(120)
def test_rank_that_raises_is_named_with_its_line(cli_env, tmp_path):
    p, run_dir, name = ddprun(tmp_path, cli_env, "raise", hang=60)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "ddpdoctor run: the job failed (exit 1)" in p.stderr
    assert (f"first failure: rank 1 exited with code 1: RuntimeError: boom on rank 1 at train "
            f"({name}:{line_of('raise')})") in p.stderr
    assert "peer-closed: a peer rank went away (rank 0)" in p.stderr
    assert "hung" not in p.stderr
    assert_nothing_left(run_dir)


@pytest.mark.timeout(120)
def test_rank_killed_by_sigkill_is_named(cli_env, tmp_path):
    p, run_dir, _ = ddprun(tmp_path, cli_env, "sigkill", hang=60)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "first failure: rank 1 was killed by SIGKILL" in p.stderr
    assert "killed-by-signal: a rank was killed by a signal (rank 1)" in p.stderr
    assert "dmesg" in p.stderr
    assert json.loads((run_dir / "verdict.json").read_text())["first_failure"] == "rank 1 was killed by SIGKILL"
    assert_nothing_left(run_dir)


@pytest.mark.timeout(120)
def test_healthy_job_is_untouched_and_its_output_teed(cli_env, tmp_path):
    p, run_dir, _ = ddprun(tmp_path, cli_env, "train", hang=5, steps="5")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "rank 0 done 32.0" in p.stdout and "rank 1 done 32.0" in p.stdout
    assert "ddpdoctor run:" not in p.stderr
    assert "rank 0 done" in (run_dir / "output.log").read_text()


@pytest.mark.timeout(120)
def test_sigterm_is_forwarded_and_nothing_outlives_it(cli_env, tmp_path):
    script = write_train(tmp_path)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(CMD + ["--hang-timeout", "300", "--dir", str(run_dir), "--", *torchrun(script, "hang")],
                            env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(glob.glob(str(run_dir / "proc-*.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and "hung" not in err
    assert_nothing_left(run_dir)


@pytest.mark.timeout(30)
def test_command_that_cannot_start_is_a_usage_error(cli_env, tmp_path):
    p = subprocess.run(CMD + ["--dir", str(tmp_path / "r"), "--", "no-such-launcher-xyz"], env=cli_env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and p.stderr.startswith("error[cannot-start]: cannot start 'no-such-launcher-xyz'")
