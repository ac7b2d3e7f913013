"""Output streams, encodings and exit codes (issue 23): what the command does when its output is closed,
encodes strictly or fills a disk, and what a broken site plugin or an empty ``--only`` makes of a run.

Every test runs the installed ``ddpdoctor`` command in a real process: descriptors closed by the shell
(``>&-``, ``2>&-``), real strict encodings (``PYTHONIOENCODING=utf-8:strict`` and ``ascii:strict``),
undecodable bytes in real arguments, variables, logs, a port holder's command line and a host name
(a UTS namespace), a real plugin module that calls ``sys.exit(0)`` on import, and a real 64 KiB tmpfs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

DDPDOCTOR = os.path.join(os.path.dirname(sys.executable), "ddpdoctor")
RAW_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
BAD = b"\xff\xfe"  # not UTF-8
FAST_CHECK = ["check", "--nproc", "2", "--only", "env,port"]


def _shell(cli_env, redirects: str, args: list, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """``ddpdoctor ARGS`` with the shell's redirections (``>&-`` closes standard output for real)."""
    return subprocess.run(["bash", "-c", f'exec "$0" "$@" {redirects}', DDPDOCTOR, *args], env=cli_env,
                          capture_output=True, timeout=timeout, **kw)


def _no_traceback(err: bytes) -> None:
    text = err.decode("utf-8", "replace")
    assert "Traceback" not in text and "Exception ignored" not in text and "error[internal]" not in text, text


# -- standard output and error closed -------------------------------------------------------------

@pytest.mark.timeout(300)
@pytest.mark.parametrize("args", [["list"], ["env"], ["env", "--json"], ["explain", "EADDRINUSE"],
                                  ["explain", "--json", "EADDRINUSE"], ["stacks", "2147483647"], ["--help"]],
                         ids=lambda a: " ".join(a))
def test_closed_stdout_behaves_as_dev_null(cli_env, args):
    """``>&-``: the same exit code as ``>/dev/null``, and no traceback (it was exit 1 with one)."""
    closed = _shell(cli_env, ">&-", args)
    null = _shell(cli_env, ">/dev/null", args)
    _no_traceback(closed.stderr)
    assert closed.returncode == null.returncode == (2 if args[0] == "stacks" else 0), closed.stderr  # 2: no such pid
    assert closed.stderr == null.stderr


@pytest.mark.timeout(300)
def test_check_with_stdout_closed_runs_writes_json_and_returns_its_verdict(cli_env, tmp_path):
    """``check --json r.json >&-``: the checks run, the JSON is written, the verdict's code comes back;
    also with standard error closed as well (``>&- 2>&-``)."""
    for redirects in (">&-", ">&- 2>&-"):
        target = tmp_path / "r.json"
        p = _shell(cli_env, redirects, FAST_CHECK + ["--json", str(target)])
        _no_traceback(p.stderr)
        assert p.returncode == 0, p.stderr
        doc = json.loads(target.read_text())
        assert [c["name"] for c in doc["checks"]] == ["env", "port"] and doc["exit_code"] == 0
        assert {c["status"] for c in doc["checks"]} == {"pass"}
        target.unlink()
    # a failing verdict keeps its code with standard output closed
    p = _shell(cli_env, ">&-", ["check", "--nproc", "2", "--only", "collectives", "--min-busbw", "1000000",
                                "--json", str(tmp_path / "f.json")])
    assert p.returncode == 1, p.stderr
    assert json.loads((tmp_path / "f.json").read_text())["checks"][0]["status"] == "fail"


@pytest.mark.timeout(300)
def test_closed_stderr_changes_nothing(cli_env):
    """``2>&-``: the same report and exit code (``check`` printed "exit 0" and exited 1)."""
    for args in (FAST_CHECK, ["list"], ["explain", "EADDRINUSE"], ["env"]):
        p = _shell(cli_env, "2>&-", args)
        assert p.returncode == 0, (args, p.stdout[-500:])
        if args is FAST_CHECK:
            assert re.search(rb"2 passed in [0-9.]+s; exit 0\n\Z", p.stdout), p.stdout
    p = _shell(cli_env, "2>&-", ["check", "--only", "no-such-check"])
    assert p.returncode == 2 and p.stdout == b""  # a usage error is still exit 2, said nowhere


@pytest.mark.timeout(600)
def test_bench_and_locate_with_stdout_closed_write_their_json(cli_env, tmp_path):
    for args in (["bench", "--nproc", "2", "--ops", "all_reduce", "--max-bytes", "1K", "--iters", "1",
                  "--warmup", "0"], ["locate", "--nproc", "2", "--iters", "1", "--size", "1K"]):
        target = tmp_path / f"{args[0]}.json"
        p = _shell(cli_env, ">&-", args + ["--json", str(target)], timeout=300)
        _no_traceback(p.stderr)
        assert p.returncode == 0, p.stderr
        doc = json.loads(target.read_text())
        assert doc["exit_code"] == 0
        if args[0] == "locate":  # one node takes one round, said in the singular (it said "1 rounds")
            summary = next(c["summary"] for c in doc["checks"] if c["name"] == "locate")
            assert "1 node, 1 round in " in summary, summary


@pytest.mark.timeout(300)
def test_stdout_closed_by_its_reader_mid_run_ends_quietly(cli_env):
    """``check | head -1``: the header goes through, the reader leaves while the ranks run; the rest of
    the report meets a closed pipe: exit 141 and nothing on standard error."""
    p = subprocess.Popen([DDPDOCTOR, "check", "--nproc", "2", "--only", "env,port,process-group,collectives"],
                         env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = p.stdout.readline()
        p.stdout.close()
        err = p.stderr.read()
        code = p.wait(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stderr.close()
    assert first.startswith(b"ddpdoctor ")
    assert code == 141 and err == b"", err


# -- strict encodings and undecodable bytes from outside -------------------------------------------

ENCODINGS = ["utf-8:strict", "ascii:strict"]


def _strict(cli_env, encoding: str) -> dict:
    return dict(cli_env, PYTHONIOENCODING=encoding)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_undecodable_argument_variable_and_log_are_shown_escaped(cli_env, tmp_path, encoding):
    """Bytes that are not UTF-8 in ``explain``'s text, a variable ``env`` shows and a log: exit 0 and
    the bytes shown as ``\\xff\\xfe`` (they ended the command with exit 3)."""
    env = _strict(cli_env, encoding)
    p = subprocess.run([DDPDOCTOR.encode(), b"explain", b"EADDRINUSE " + BAD], env=env, capture_output=True,
                       timeout=120)
    assert p.returncode == 0 and b"EADDRINUSE \\xff\\xfe" in p.stdout, p.stderr
    p = subprocess.run([DDPDOCTOR.encode(), b"explain", b"--json", b"EADDRINUSE " + BAD], env=env,
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "EADDRINUSE \\xff\\xfe" in json.loads(p.stdout)["causes"][0]["evidence"]
    env_b = {k.encode(): v.encode() for k, v in env.items()}
    env_b[b"NCCL_DEBUG"] = b"IN" + BAD + b"FO"
    p = subprocess.run([DDPDOCTOR, "env"], env=env_b, capture_output=True, timeout=120)
    assert p.returncode == 0 and b"NCCL_DEBUG=IN\\xff\\xfeFO" in p.stdout, p.stderr
    p = subprocess.run([DDPDOCTOR, "env", "--json"], env=env_b, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.decode("utf-8", "strict"))["variables"]["NCCL_DEBUG"] == "IN\\xff\\xfeFO"
    log = tmp_path / "job.log"
    log.write_bytes(b"[rank1]: RuntimeError: EADDRINUSE " + BAD + " \u2192 \x1b[2J".encode() + b"\n")
    p = subprocess.run([DDPDOCTOR, "explain", "--log", str(log)], env=env, capture_output=True, timeout=120)
    assert p.returncode == 0 and b"port-in-use" in p.stdout and b"EADDRINUSE \\xff\\xfe" in p.stdout, p.stderr
    assert not RAW_CONTROLS.search(p.stdout.decode("utf-8", "strict"))
    _no_traceback(p.stderr)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_port_holders_undecodable_arguments_are_shown_escaped(cli_env, tmp_path, encoding):
    """The process that holds the port has non-UTF-8 bytes and an escape sequence in its arguments."""
    script = tmp_path / "hold.py"
    script.write_text("import socket, sys, time\n"
                      "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
                      "print(s.getsockname()[1], flush=True); time.sleep(120)\n")
    holder = subprocess.Popen([b"--x" + BAD + b"\x1b[2J", str(script).encode()], executable=sys.executable,
                              stdout=subprocess.PIPE)  # the bad bytes in argv[0]: shown first
    try:
        port = int(holder.stdout.readline())
        p = subprocess.run([DDPDOCTOR, "check", "--nproc", "2", "--only", "port", "--master-port", str(port)],
                           env=_strict(cli_env, encoding), capture_output=True, timeout=120)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    _no_traceback(p.stderr)
    assert p.returncode == 1 and f"is held by pid {holder.pid}".encode() in p.stdout, p.stdout + p.stderr
    assert b"--x\\xff\\xfe" in p.stdout and not RAW_CONTROLS.search(p.stdout.decode("utf-8", "strict"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_undecodable_host_name(cli_env, encoding):
    """A host name that is not UTF-8 (set in a new UTS namespace, root only): ``env`` shows it escaped
    and the ``env`` check resolves it as the bytes it is (it crashed: Python's IDNA codec raised)."""
    setup = ("import os, socket, sys; socket.sethostname(b'ho\\xffst'); os.execv(sys.argv[1], sys.argv[1:])")
    probe = subprocess.run(["unshare", "--uts", sys.executable, "-c", setup, "/bin/true"], capture_output=True,
                           timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"cannot set a host name in a new UTS namespace: {probe.stderr.decode(errors='replace')}")
    env = _strict(cli_env, encoding)
    p = subprocess.run(["unshare", "--uts", sys.executable, "-c", setup, DDPDOCTOR, "env"], env=env,
                       capture_output=True, timeout=120)
    assert p.returncode == 0 and b"host: ho\\xffst" in p.stdout, p.stderr
    p = subprocess.run(["unshare", "--uts", sys.executable, "-c", setup, DDPDOCTOR, "check", "--nproc", "2",
                        "--only", "env", "-v"], env=env, capture_output=True, timeout=120)
    _no_traceback(p.stderr)
    assert p.returncode == 0 and b"host: ho\\xffst" in p.stdout, p.stdout[-2000:]


# -- numbers too long for int() in a log -----------------------------------------------------------

BIG = "9" * 5000
HUGE_NUMBER_LINES = {
    "rank prefix": f"[rank{BIG}]: RuntimeError: EADDRINUSE",
    "NCCL rank": f"[PG 0 Rank {BIG}] Watchdog caught collective operation timeout",
    "summary rank": f"Root Cause (first observed failure):\n[0]:\n  rank      : {BIG} (local_rank: 0)\n"
                    "  exitcode  : 1 (pid: 5)\n=====",
    "summary exit code": "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 0)\n"
                         f"  exitcode  : -{BIG} (pid: 5)\n=====",
    "mp.spawn process": f"-- Process {BIG} terminated with the following error:\nTraceback (most recent call "
                        "last):\nRuntimeError: EADDRINUSE",
    "mp.spawn exit code": f"torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit "
                          f"code {BIG}",
    "mp.spawn signal": f"torch.multiprocessing.spawn.ProcessExitedException: process {BIG} terminated with "
                       f"signal {BIG}",
    "nproc": f"torchrun --nproc-per-node={BIG} train.py\nEADDRINUSE",
    "timeout ms": f"[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
                  f"Timeout(ms)={BIG}) ran for 600000 milliseconds before timing out",
    "member": f"GLOBAL_RANK: {BIG}, MEMBER: 1/{BIG}\nEADDRINUSE",
    "store barrier": f"world_size={BIG}, worker_count={BIG}\nEADDRINUSE",
    "progress bar": f"Running tokenizer [{BIG}:{BIG}:59<00:00]\nWatchdog caught collective operation timeout",
    "signal number": f"exits with return code = -{BIG}\nSignal {BIG} (SIGKILL) received by PID 12",
}


@pytest.mark.timeout(300)
def test_numbers_too_long_for_int_are_no_rank_and_no_crash(cli_env, tmp_path):
    """Every number explain reads with int() on a log line, 5,000 digits long: exit 0 with and without
    --json and --here (each ended explain with exit 3: int() refuses more than 4300 digits). Each line
    alone through the command line in this process, then all of them through the installed command."""
    from click.testing import CliRunner

    from ddpdoctor.cli import cli

    log = tmp_path / "big.log"
    for name, text in HUGE_NUMBER_LINES.items():
        log.write_text(text + "\n")
        for extra in ([], ["--json"], ["--here"]):
            result = CliRunner().invoke(cli, ["explain", "--log", str(log), *extra])
            assert result.exit_code == 0, (name, extra, result.output[-500:])
            if extra == ["--json"]:
                for cause in json.loads(result.output)["causes"]:
                    assert all(len(str(r)) < 10 for r in cause["ranks"]), (name, cause["ranks"])
    log.write_text("\n".join(HUGE_NUMBER_LINES.values()) + "\n")
    for extra in ([], ["--json"], ["--here"]):
        p = subprocess.run([DDPDOCTOR, "explain", "--log", str(log), *extra], env=cli_env, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, (extra, p.stderr)
        _no_traceback(p.stderr.encode())


# -- plugins that do not load ---------------------------------------------------------------------

PLUGINS = {
    "exits_plugin": ("import sys\nsys.exit(0)\n", r"called sys\.exit\(0\) \(\S*exits_plugin\.py:2\) while it was imported"),
    "raises_plugin": ("raise RuntimeError('site database unreachable')\n",
                      r"raised RuntimeError: site database unreachable \(\S*raises_plugin\.py:1\)"),
    "empty_plugin": ("X = 1\n", "has no CHECKS list of Check classes"),
}


@pytest.mark.timeout(300)
def test_a_plugin_that_does_not_load_is_a_crash_result(cli_env, tmp_path):
    """A site plugin that calls ``sys.exit(0)`` while it is imported made ``check`` print nothing, write no
    JSON and exit 0. Each plugin that does not load is now a CRASH result named ``plugin:MODULE``, beside
    the checks that ran, in the report and the JSON; exit 1; ``--only`` does not leave it out."""
    for module, (source, _) in PLUGINS.items():
        (tmp_path / f"{module}.py").write_text(source)
    env = dict(cli_env, PYTHONPATH=f"{tmp_path}{os.pathsep}{cli_env['PYTHONPATH']}",
               DDPDOCTOR_PLUGINS="exits_plugin")
    target = tmp_path / "r.json"
    p = subprocess.run([DDPDOCTOR, *FAST_CHECK, "--json", str(target)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "[CRASH] plugin:exits_plugin" in p.stdout and re.search(PLUGINS["exits_plugin"][1], p.stdout), p.stdout
    assert re.search(r"2 passed, 1 crashed in [0-9.]+s; exit 1\n\Z", p.stdout), p.stdout
    doc = json.loads(target.read_text())
    assert doc["exit_code"] == 1
    assert [(c["name"], c["status"]) for c in doc["checks"]] == [("env", "pass"), ("port", "pass"),
                                                                  ("plugin:exits_plugin", "crash")]
    assert doc["checks"][2]["finding"] == "plugin-not-loaded"
    env["DDPDOCTOR_PLUGINS"] = ",".join(PLUGINS)
    p = subprocess.run([DDPDOCTOR, "check", "--nproc", "2", "--only", "port"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1 and "1 passed, 3 crashed" in p.stdout, p.stdout + p.stderr
    for module, (_, why) in PLUGINS.items():
        assert f"[CRASH] plugin:{module}" in p.stdout and re.search(why, p.stdout), p.stdout
    p = subprocess.run([DDPDOCTOR, "list"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and all(f"plugin:{m} " in p.stdout for m in PLUGINS), p.stdout
    # the checks of a plugin that did not load are unknown names, and the message says why
    p = subprocess.run([DDPDOCTOR, "check", "--only", "site-db"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "plugin:exits_plugin" in p.stderr and len(p.stderr.splitlines()) == 1
    # bench runs no site check: a plugin that did not load is no row of its table and no result
    p = subprocess.run([DDPDOCTOR, "bench", "--nproc", "2", "--ops", "all_reduce", "--max-bytes", "1K", "--iters",
                        "1", "--warmup", "0"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "plugin:" not in p.stdout and "[ok]    collectives-bench" in p.stdout, p.stdout


# -- --json on a full disk --------------------------------------------------------------------------

@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs, filled up (root only: skipped with the reason elsewhere); unmounted afterwards."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True,
                       text=True, timeout=60)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {p.stderr.strip()}")
    try:
        fd = os.open(mnt / "fill", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:  # ENOSPC: full
            pass
        finally:
            os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True, timeout=60)


@pytest.mark.timeout(300)
def test_json_on_a_full_disk_is_exit_74_not_2(cli_env, full_disk):
    """Every check passed, the report printed, the JSON did not fit: exit 74 (output failed), one line
    saying so (it was exit 2, "usage error, nothing ran"). A failing verdict keeps its code 1."""
    target = full_disk / "r.json"
    p = subprocess.run([DDPDOCTOR, *FAST_CHECK, "--json", str(target)], env=cli_env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 74, p.stderr
    assert "2 passed" in p.stdout
    assert p.stdout.rstrip().endswith("; exit 74"), p.stdout  # the footer says the real code (it said exit 0)
    assert p.stderr.startswith(f"error[json-write]: cannot write {target}: No space left on device")
    assert len(p.stderr.splitlines()) == 1
    assert sorted(os.listdir(full_disk)) == ["fill"]  # no half-written file or temporary left
    p = subprocess.run([DDPDOCTOR, "check", "--nproc", "2", "--only", "collectives", "--min-busbw", "1000000",
                        "--json", str(target)], env=cli_env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.startswith("error[json-write]"), p.stderr
    p = subprocess.run([DDPDOCTOR, "bench", "--nproc", "2", "--ops", "all_reduce", "--max-bytes", "1K", "--iters",
                        "1", "--warmup", "0", "--json", str(full_disk / "b.json")], env=cli_env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 74 and p.stderr.startswith("error[json-write]"), p.stderr
    assert p.stdout.rstrip().endswith("; exit 74"), p.stdout


# -- --only and names ---------------------------------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("args", [["check", "--only", ""], ["check", "--only", ","], ["bench", "--ops", ""]],
                         ids=["only-empty", "only-comma", "ops-empty"])
def test_an_empty_selection_is_a_usage_error_not_everything(cli_env, args):
    """``--only ""`` (an unset variable) ran every check; it names none: exit 2 before any work."""
    t0 = time.monotonic()
    p = subprocess.run([DDPDOCTOR, *args], env=cli_env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "", p.stdout
    assert p.stderr.startswith("error[no-") and "names no" in p.stderr and len(p.stderr.splitlines()) == 1
    assert time.monotonic() - t0 < 60


@pytest.mark.timeout(120)
def test_an_unknown_check_name_is_echoed_escaped(cli_env):
    p = subprocess.run([DDPDOCTOR.encode(), b"check", b"--only", b"env\x1b]0;owned\x07\x1b[2J" + BAD],
                       env=_strict(cli_env, "utf-8:strict"), capture_output=True, timeout=120)
    err = p.stderr.decode("utf-8", "strict")
    assert p.returncode == 2 and err.startswith("error[unknown-check]: no check named 'env\\e]0;owned\\x07\\e[2J"
                                                "\\xff\\xfe'"), err
    assert not RAW_CONTROLS.search(err.rstrip("\n")) and len(err.splitlines()) == 1

