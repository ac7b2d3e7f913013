"""``ddpdoctor run --dir``: ddpdoctor removes only what it created (issue 23, data loss).

Every run leaves a ``.ddpdoctor-run`` marker listing the files it made; an existing ``--dir`` is used
only when it is empty or holds that marker; anything else, and ``--dir ""``, is exit 2 before the job
starts. Each test runs the real command on real folders and compares every file's bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

CMD = [sys.executable, "-m", "ddpdoctor", "run", "--hang-timeout", "30"]

# One file of the user's for each of ddpdoctor's own name patterns (and the fixed names it writes).
USER_FILES = {
    "beat-mine": b"my heartbeat notes\n",
    "proc-mine.json": b'{"mine": true}\n',
    "proc-12.json": b'{"mine": "a pid-like name"}\n',
    "exit-mine.json": b'{"exit": "mine"}\n',
    "coll-mine": b"collected\n",
    "coll-mine.txt": b"collected too\n",
    "stacks-mine.txt": b"my stacks\n",
    "stacks-mine": b"more stacks\n",
    "verdict.mine": b"my verdict\n",
    "flight-recorder-rank-mine": b"\x00\x01binary\xff",
    ".proc-mine": b"hidden\n",
    ".exit-mine": b"hidden too\n",
}
FIXED_FILES = {  # names every run writes itself: only in a folder that is refused
    "output.raw.log": b"my own log\n",
    "verdict.txt": b"my verdict text\n",
    "verdict.json": b"{}\n",
    "stacks.txt": b"my stacks file\n",
    ".inject/sitecustomize.py": b"print('my own hook')\n",
    ".inject/notes.txt": b"mine\n",
}


def tree(folder) -> dict:
    """Every file under ``folder`` (relative path -> bytes)."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = f.read()
    return out


def plant(folder, files: dict) -> None:
    for rel, data in files.items():
        path = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def job(marker, code: int = 0) -> list:
    """A job that proves it started (writes ``marker``) and exits ``code``."""
    return [sys.executable, "-c", f"import sys; open({str(marker)!r}, 'a').write('x'); print('job ran'); sys.exit({code})"]


@pytest.mark.timeout(120)
def test_users_files_in_a_reused_run_dir_survive_the_clearing_and_the_cleanup(cli_env, tmp_path):
    """A previous run's folder is reused; the user's files in it, one per pattern, survive the clearing
    before the new run and the cleanup after a successful one; the previous run's own files are gone."""
    run_dir, started = tmp_path / "run", tmp_path / "started"
    first = subprocess.run(CMD + ["--dir", str(run_dir), "--", *job(started, 3)], env=cli_env, capture_output=True,
                           text=True, timeout=60)
    assert first.returncode == 3, first.stderr
    marker = json.loads((run_dir / ".ddpdoctor-run").read_text())
    assert marker["complete"] is True and "output.raw.log" in marker["files"] and "verdict.json" in marker["files"]
    earlier = [n for n in marker["files"] if n.startswith("proc-")]
    assert earlier  # the hook registered the job: its proc-<pid>.json is listed
    plant(run_dir, USER_FILES)
    # a failing run: the folder is kept, with the user's files and this run's own
    second = subprocess.run(CMD + ["--dir", str(run_dir), "--", *job(started, 4)], env=cli_env,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 4, second.stderr
    assert "Traceback" not in second.stderr
    kept = tree(run_dir)
    assert {k: kept[k] for k in USER_FILES} == USER_FILES
    assert not any((run_dir / n).exists() for n in earlier)  # the previous run's files were cleared
    listed = json.loads((run_dir / ".ddpdoctor-run").read_text())
    assert not set(listed["files"]) & set(USER_FILES)
    assert set(listed["before"]) == set(USER_FILES)
    # a successful run: its own files go, the user's stay, byte for byte
    third = subprocess.run(CMD + ["--dir", str(run_dir), "--", *job(started, 0)], env=cli_env, capture_output=True,
                           text=True, timeout=60)
    assert third.returncode == 0, third.stderr
    assert tree(run_dir) == USER_FILES
    assert sorted(os.listdir(run_dir)) == sorted(USER_FILES)  # no folder, no marker left either
    assert started.read_text() == "xxx"


@pytest.mark.parametrize("case", ["dot", "empty-string", "foreign"])
@pytest.mark.timeout(60)
def test_a_folder_ddpdoctor_did_not_create_is_refused_before_the_job_starts(cli_env, tmp_path, case):
    """``--dir .`` (a project folder), ``--dir ""`` (an unset variable) and any non-empty folder without
    the marker: exit 2, one line naming the value and the fix, the job never started, nothing touched."""
    cwd = tmp_path / "project"
    plant(cwd, {**USER_FILES, **FIXED_FILES, "train.py": b"print('my training')\n"})
    before = tree(cwd)
    started = tmp_path / "started"
    value = {"dot": ".", "empty-string": "", "foreign": str(cwd)}[case]
    p = subprocess.run(CMD + ["--dir", value, "--", *job(started)], env=cli_env, cwd=cwd, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error[run-dir]: --dir {value if value else repr(value)} ")
    assert ("pass a new or empty directory" if value else "pass a directory path") in lines[0]
    assert not started.exists()
    assert tree(cwd) == before
    assert not (cwd / ".ddpdoctor-run").exists()


@pytest.mark.timeout(60)
def test_an_empty_folder_is_used_and_left_empty_after_success(cli_env, tmp_path):
    run_dir, started = tmp_path / "empty", tmp_path / "started"
    run_dir.mkdir()
    p = subprocess.run(CMD + ["--dir", str(run_dir), "--", *job(started)], env=cli_env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert started.exists() and run_dir.is_dir() and os.listdir(run_dir) == []


@pytest.mark.timeout(60)
def test_a_marker_that_lists_a_users_file_removes_nothing_of_the_users(cli_env, tmp_path):
    """The marker is trusted for ddpdoctor's own kinds of names only: a marker (edited, or forged) that
    lists the user's files and a path outside the folder removes neither."""
    run_dir, started = tmp_path / "run", tmp_path / "started"
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    plant(run_dir, {"notes.txt": b"mine\n", ".ddpdoctor-run": json.dumps(
        {"schema": 1, "complete": True, "files": ["notes.txt", "../outside.txt", str(outside), ".ddpdoctor-run"],
         "before": []}).encode()})
    p = subprocess.run(CMD + ["--dir", str(run_dir), "--", *job(started)], env=cli_env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert tree(run_dir) == {"notes.txt": b"mine\n"} and outside.read_text() == "keep"


SLEEPER = "import time; print('up', flush=True); time.sleep(600)"


@pytest.mark.timeout(120)
def test_a_run_killed_by_sigkill_leaves_its_files_known_to_the_next_run(cli_env, tmp_path):
    """``kill -9`` of run leaves an incomplete marker; the next run in that folder clears what the killed
    run made (its stale proc-<pid>.json would otherwise be taken for a process of the new job)."""
    run_dir = tmp_path / "run"
    run = subprocess.Popen(CMD + ["--dir", str(run_dir), "--", sys.executable, "-c", SLEEPER], env=cli_env,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert run.stdout.readline() == b"up\n"
        deadline = time.monotonic() + 30
        while not list(run_dir.glob("proc-*.json")) and time.monotonic() < deadline:
            time.sleep(0.1)
        stale = [p.name for p in run_dir.glob("proc-*.json")]
        assert stale
        run.kill()
        run.wait()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        run.stdout.close()
    pids = [int(n[5:-5]) for n in stale]
    deadline = time.monotonic() + 30  # the watchdog ends the job
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, "the job outlived ddpdoctor run"
        time.sleep(0.1)
    assert json.loads((run_dir / ".ddpdoctor-run").read_text())["complete"] is False
    started = tmp_path / "started"
    p = subprocess.run(CMD + ["--dir", str(run_dir), "--", *job(started)], env=cli_env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "ddpdoctor run: 1 process, exit 0" in p.stderr
    assert os.listdir(run_dir) == []


@pytest.mark.timeout(60)
def test_a_users_file_under_a_name_every_run_writes_is_refused_not_overwritten(cli_env, tmp_path):
    """An earlier run's folder (kept with --keep: no verdict was written) in which the user then saved a
    verdict.txt of their own: the next run would write there, so it is exit 2 and the file stays."""
    run_dir, started = tmp_path / "run", tmp_path / "started"
    first = subprocess.run(CMD + ["--keep", "--dir", str(run_dir), "--", *job(started)], env=cli_env,
                           capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert "verdict.txt" not in json.loads((run_dir / ".ddpdoctor-run").read_text())["files"]
    (run_dir / "verdict.txt").write_bytes(b"my notes on that run\n")
    before = tree(run_dir)
    p = subprocess.run(CMD + ["--dir", str(run_dir), "--", *job(started)], env=cli_env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"error[run-dir]: --dir {run_dir} holds verdict.txt, which its .ddpdoctor-run marker "
                               "does not list") and len(p.stderr.splitlines()) == 1
    assert (run_dir / "verdict.txt").read_bytes() == b"my notes on that run\n"
    assert started.read_text() == "x"  # the second job never started
    assert tree(run_dir) == before  # the refused folder is left exactly as it was, the earlier run's files too
