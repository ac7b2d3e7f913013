"""Secrets and terminal escapes never reach an output (issue 23): one table of shapes, every output path.

The table is :mod:`secret_shapes`. Each test puts the shapes where the outside world puts them (a
failing job's exception and arguments, a log, variables, a port holder's command line, a rank's
arguments) and runs the real command: ``run`` (terminal verdict, ``verdict.txt``, ``verdict.json``,
``stacks.txt``, ``proc-*.json``, ``exit-*.json``), ``explain`` (text, ``--json``, ``--here``; mp.spawn's
first failure, the evidence and its notes), ``env`` (text and ``--json``), ``check --json`` and
``stacks``. No 8 characters in a row of a secret and no raw control character may come out; the job's
own output (pass-through and ``output.raw.log``, 0600) stays byte for byte. Names that only look like
credentials come through unchanged.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpdoctor.cli import cli
from ddpdoctor.system.redact import REDACTED, redact_argv, safe_data, safe_text, shorten
from secret_shapes import ESCAPE, NEGATIVES, SHAPES, argv, leaks, message, raw_controls

CMD = [sys.executable, "-m", "ddpdoctor"]
IDS = [s.name for s in SHAPES]


def _clean(text: str, where: str) -> None:
    assert leaks(text) == [], f"{where}: secrets shown: {leaks(text)}\n{text[-3000:]}"
    assert raw_controls(text) == [], f"{where}: raw control characters {raw_controls(text)}"


def _json_clean(path_or_text, where: str) -> object:
    text = path_or_text.read_text() if hasattr(path_or_text, "read_text") else path_or_text
    doc = json.loads(text)
    _clean(json.dumps(doc, ensure_ascii=False), where)  # the strings as a reader of the JSON gets them
    return doc


# -- the step itself -----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_every_shape_is_hidden_and_escaped_wherever_the_text_is_cut(shape):
    shown = safe_text(message(shape))
    assert REDACTED in shown and "\\e]0;owned\\x07\\e[2J" in shown
    _clean(shown, shape.name)
    assert safe_text(shown) == shown  # an output may apply it to lines that hold already safe parts
    _clean(" ".join(redact_argv(["python", "train.py", *shape.argv, "--lr", "3"])), "argv")
    assert redact_argv(["train.py", "--lr", "3"]) == ["train.py", "--lr", "3"]
    text = f"RuntimeError: {shape.text} and more words after it"
    for limit in range(20, len(text) + 20):  # a cut anywhere, even inside the secret, shows none of it
        assert leaks(shorten(text, limit)) == [], (limit, shorten(text, limit))
    _clean(json.dumps(safe_data({"k": [message(shape)], message(shape): 1}), ensure_ascii=False), "safe_data")


@pytest.mark.parametrize("url, shown", [
    ("redis://:pa@ss@10.0.0.1:6379/0", "redis://:<redacted>@10.0.0.1:6379/0"),
    ("https://alice:s3@cr@t@git.example.com/x.git", "https://alice:<redacted>@git.example.com/x.git"),
    ("tcp://10.0.0.1:29400 and mail alice@example.com", "tcp://10.0.0.1:29400 and mail alice@example.com"),
    ("https://host.example/path?to=a@b", "https://host.example/path?to=a@b"),
])
def test_a_password_with_a_raw_at_sign_is_hidden_whole(url, shown):
    """URL parsers read the userinfo up to the authority's last "@"; before, the part after the
    password's own "@" was shown."""
    assert safe_text(url) == shown


@pytest.mark.parametrize("line", NEGATIVES)
def test_names_that_only_look_like_credentials_stay(line):
    assert safe_text(line) == line
    assert safe_data({"line": line}) == {"line": line}


# -- ddpdoctor run: a real failing job whose exceptions and arguments carry every shape ----------

LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys
    from secret_shapes import SHAPES
    RANK = "import sys; from secret_shapes import SHAPES, message; raise RuntimeError(message(SHAPES[int(sys.argv[1])]))"
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(i), *s.argv],
                              env=dict(os.environ, RANK=str(i), WORLD_SIZE=str(len(SHAPES))))
             for i, s in enumerate(SHAPES)]
    sys.exit(max(p.wait() for p in procs))
    """)


@pytest.mark.timeout(240)
def test_run_verdict_and_run_directory_show_no_secret(cli_env, tmp_path):
    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER)
    run_dir = tmp_path / "run"
    p = subprocess.run(CMD + ["run", "--hang-timeout", "120", "--dir", str(run_dir), "--", sys.executable,
                              str(script), *argv()], env=cli_env, capture_output=True, timeout=200)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 1, err[-3000:]
    at = err.index("ddpdoctor run:")
    job, verdict = err[:at], err[at:]
    # the job's own output passes through byte for byte, and its log keeps it (user-only)
    assert leaks(job) == IDS and ESCAPE in job
    raw = run_dir / "output.raw.log"
    assert stat.S_IMODE(raw.stat().st_mode) == 0o600
    assert leaks(raw.read_text()) == IDS and ESCAPE in raw.read_text()
    # every rank's exception is in the verdict, redacted and escaped
    assert verdict.count("raised RuntimeError: upload failed \\e]0;owned\\x07\\e[2J with ") == len(SHAPES), verdict
    _clean(verdict, "terminal verdict")
    text = (run_dir / "verdict.txt").read_text()
    assert text.count("raised RuntimeError: upload failed") == len(SHAPES)
    _clean(text, "verdict.txt")
    doc = _json_clean(run_dir / "verdict.json", "verdict.json")
    assert len(doc["deaths"]) == len(SHAPES)
    _clean((run_dir / "stacks.txt").read_text(), "stacks.txt")
    procs = sorted(glob.glob(str(run_dir / "proc-*.json")))
    ranks = 0
    for path in procs:
        info = _json_clean(Path(path).read_text(), os.path.basename(path))
        assert isinstance(info["argv"], list) and REDACTED in " ".join(info["argv"]), info["argv"]
        ranks += info["role"] == "rank"
    assert ranks == len(SHAPES)
    for path in glob.glob(str(run_dir / "exit-*.json")):
        _json_clean(Path(path).read_text(), os.path.basename(path))
    # the pictures: the page quotes the command line (with its secrets) and every rank's exception
    page = (run_dir / "report.html").read_text()
    assert page.count("raised RuntimeError: upload failed") >= len(SHAPES) and REDACTED.replace("<", "&lt;").replace(
        ">", "&gt;") in page.split("</h1>")[0], page[:2000]
    _clean(page, "report.html")
    _json_clean(run_dir / "trace.json", "trace.json")


# -- explain: mp.spawn's first failure, the evidence and its notes, --json, --here -----------------

WATCHDOG = ("[rank1]:[E0204 10:31:02.118273612 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) "
            "ran for 1800328 milliseconds before timing out.")


def _log(shape) -> str:
    return "\n".join([
        f"Running tokenizer on dataset {shape.text} {ESCAPE}:   9%|8  | 280000/2969526 [29:55<4:48:08, 155.57 examples/s]",
        WATCHDOG,
        f"[rank0]: RuntimeError: failed to listen on any local network address. port: 29400, useIpv6: 0, code: -98, "
        f"name: EADDRINUSE, message: address already in use {shape.text} {ESCAPE}",
        "-- Process 1 terminated with the following error:",
        "Traceback (most recent call last):",
        '  File "/proj/train.py", line 9, in run',
        f"RuntimeError: {message(shape)}",
        *NEGATIVES,
    ]) + "\n"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_explain_shows_no_secret_in_first_failure_evidence_notes_json_and_here(shape, tmp_path):
    log = tmp_path / "job.log"
    log.write_text(_log(shape))
    out = CliRunner().invoke(cli, ["explain", "--log", str(log)])
    assert out.exit_code == 0, out.output
    text = out.stdout
    assert "first failure: process 1 of mp.spawn raised RuntimeError: upload failed \\e]0;owned" in text, text
    assert "slow-rank-timeout" in text and "In this log a rank was still at 'Running tokenizer" in text
    assert "port-in-use-in-code" in text
    _clean(text, "explain")
    out = CliRunner().invoke(cli, ["explain", "--json", "--here", "--log", str(log)])
    assert out.exit_code == 0, out.output
    doc = _json_clean(out.stdout, "explain --json --here")
    assert doc["first_failure"].startswith("process 1 of mp.spawn raised") and doc["here"]["facts"]
    out = CliRunner().invoke(cli, ["explain", "--here", "--log", str(log)])
    assert "here (" in out.stdout
    _clean(out.stdout, "explain --here")


@pytest.mark.timeout(120)
def test_explain_as_a_command_keeps_names_and_hides_every_shape(cli_env, tmp_path):
    log = tmp_path / "job.log"
    log.write_text("".join(_log(s) for s in SHAPES))
    p = subprocess.run(CMD + ["explain", "--log", str(log)], env=cli_env, capture_output=True, text=True,
                       timeout=100)
    assert p.returncode == 0, p.stderr
    _clean(p.stdout, "explain")
    assert "first failure: process 1 of mp.spawn raised" in p.stdout


# -- env: variables carrying the shapes ----------------------------------------------------------

@pytest.mark.timeout(120)
def test_env_shows_no_secret(cli_env):
    env = {**cli_env, **{f"TORCH_SHAPE_{i}": message(s) for i, s in enumerate(SHAPES)}}
    p = subprocess.run(CMD + ["env"], env=env, capture_output=True, text=True, timeout=100)
    assert p.returncode == 0, p.stderr
    assert "TORCH_SHAPE_0=" in p.stdout
    _clean(p.stdout, "env")
    p = subprocess.run(CMD + ["env", "--json"], env=env, capture_output=True, text=True, timeout=100)
    assert p.returncode == 0, p.stderr
    doc = _json_clean(p.stdout, "env --json")
    assert len([k for k in doc["variables"] if k.startswith("TORCH_SHAPE_")]) == len(SHAPES)


# -- check --json: port holders whose command lines carry the shapes -----------------------------

HOLDER = textwrap.dedent("""
    import socket, sys, time
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
    print(s.getsockname()[1], flush=True)
    sys.stdin.read()  # until the test closes it
    """)


@pytest.mark.timeout(300)
def test_check_json_shows_no_secret_of_a_port_holders_command_line(cli_env, tmp_path):
    (tmp_path / "holder.py").write_text(HOLDER)
    holders = [subprocess.Popen(["python", "holder.py", *s.argv], executable=sys.executable, cwd=tmp_path,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for s in SHAPES]
    checks = []
    try:
        ports = [int(h.stdout.readline()) for h in holders]
        for i, port in enumerate(ports):
            checks.append(subprocess.Popen(
                CMD + ["check", "--only", "port", "--master-port", str(port), "--json", str(tmp_path / f"{i}.json")],
                env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for i, (c, h) in enumerate(zip(checks, holders)):
            out, err = c.communicate(timeout=240)
            assert c.returncode == 1, out + err
            assert f"held by pid {h.pid} (python holder.py " in out and REDACTED in out, out
            _clean(out + err, f"check ({SHAPES[i].name})")
            doc = _json_clean(tmp_path / f"{i}.json", f"check --json ({SHAPES[i].name})")
            assert f"held by pid {h.pid} (python holder.py " in doc["checks"][0]["summary"]
    finally:
        for c in checks:
            if c.poll() is None:
                c.kill()
                c.communicate()
        for h in holders:
            h.stdin.close()
            h.wait(timeout=30)
            h.stdout.close()


# -- stacks: a rank whose arguments carry the shapes ---------------------------------------------

SLEEPER = textwrap.dedent("""
    import time

    def wait_for_the_data():
        time.sleep(100)

    wait_for_the_data()
    """)


@pytest.mark.timeout(180)
def test_stacks_shows_no_secret_of_a_ranks_arguments(cli_env, tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    run_dir = tmp_path / "run"
    env = {**cli_env, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "DDPDOCTOR_STACKS_METHOD": "handler"}
    job = subprocess.Popen(CMD + ["run", "--hang-timeout", "600", "--dir", str(run_dir), "--", sys.executable,
                                  str(script), *argv()], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline, pid = time.monotonic() + 120, None
        while pid is None and time.monotonic() < deadline and job.poll() is None:
            for path in glob.glob(str(run_dir / "proc-*.json")):
                try:
                    if json.loads(Path(path).read_text()).get("role") == "rank":
                        pid = int(os.path.basename(path)[5:-5])
                except ValueError:
                    pass  # being written
            time.sleep(0.1)
        assert pid is not None, "the rank did not register"
        p = subprocess.run(CMD + ["stacks", str(pid), "--wait", "20"],
                           env={**cli_env, "DDPDOCTOR_STACKS_METHOD": "handler"}, capture_output=True,
                           text=True, timeout=100)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "wait_for_the_data" in p.stdout
        _clean(p.stdout + p.stderr, "stacks")
        info = _json_clean((run_dir / f"proc-{pid}.json").read_text(), "proc json")
        assert info["argv"][1:] == redact_argv(argv()) and leaks(" ".join(argv())) == IDS
    finally:
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    text = err.decode("utf-8", "replace")
    assert "ddpdoctor run: interrupted by SIGTERM" in text, text[-2000:]
    _clean(text[text.index("ddpdoctor run:"):], "run stopped")


# -- run on a real mp.spawn job (torch, gloo): the launcher's "first failure" line -----------------

SPAWN = textwrap.dedent("""
    import sys
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from secret_shapes import ESCAPE, SHAPES

    def main(i, store):
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=i, world_size=2)
        if i == 1:
            raise RuntimeError("upload failed " + ESCAPE + " with " + " ".join(s.text for s in SHAPES))
        dist.barrier()  # fails when process 1 is gone

    if __name__ == "__main__":
        mp.spawn(main, args=(sys.argv[1],), nprocs=2)
    """)


@pytest.mark.timeout(300)
def test_run_on_a_real_mp_spawn_job_shows_no_secret(cli_env, tmp_path):
    script = tmp_path / "spawn.py"
    script.write_text(SPAWN)
    run_dir = tmp_path / "run"
    p = subprocess.run(CMD + ["run", "--hang-timeout", "120", "--dir", str(run_dir), "--", sys.executable,
                              str(script), str(tmp_path / "store"), *argv()], env=cli_env, capture_output=True,
                       timeout=280)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 1, err[-3000:]
    at = err.index("ddpdoctor run:")
    assert leaks(err[:at]) == IDS and ESCAPE in err[:at]  # the job's own output, as written
    verdict = err[at:]
    # the launcher's first failure is the cause (said once, on the verdict's first line)
    assert "cause: process 1 of mp.spawn raised RuntimeError: upload failed \\e]0;owned\\x07\\e[2J with " \
           "https://alice:<redacted>@git.example.com" in next(line for line in verdict.splitlines() if "; cause: " in line), \
        verdict
    _clean(verdict, "terminal verdict")
    _clean((run_dir / "verdict.txt").read_text(), "verdict.txt")
    _json_clean(run_dir / "verdict.json", "verdict.json")
    for path in glob.glob(str(run_dir / "proc-*.json")) + glob.glob(str(run_dir / "exit-*.json")):
        _json_clean(Path(path).read_text(), os.path.basename(path))
