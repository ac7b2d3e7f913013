"""Hostile input (issue 16): what users and their jobs throw at ddpdoctor.

Property-based (Hypothesis): explain on random and adversarial text (never raises, never slow, the
streaming pass answers as a plain line-by-line pass would), every numeric option with any string
(exit 2 or a valid value, never exit 3), redaction (a generated secret never appears in any output).
Real processes: special files and endless streams for explain, closed and full stdout, --json paths,
and signals in `ddpdoctor check` (SIGTERM during start-up, first and second Ctrl-C at random moments).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import stat
import subprocess
import sys
import time

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ddpdoctor.causes.catalogue import CAUSES
from ddpdoctor.causes.matcher import LINE_CAP, LogScanner, explain_text, ranks_of_lines, scan_text
from ddpdoctor.check import WorldInfo
from ddpdoctor.cli import Number, cli
from ddpdoctor.errors import UsageError
from ddpdoctor.postmortem.explain import render_matches
from ddpdoctor.report.document import RunReport, write_json_file
from ddpdoctor.report.terminal import Style, render_result
from ddpdoctor.result import CheckResult, Outcome, Status
from ddpdoctor.system.redact import REDACTED, escape_controls, redact_env, safe_text

CMD = [sys.executable, "-m", "ddpdoctor"]
PATTERNS = [(c.id, p) for c in CAUSES for p in c.patterns]
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fragments(pattern: str) -> list:
    """Pieces of a pattern's own text, the raw material of inputs that make a regex backtrack."""
    plain = re.sub(r"\\[dswDSWb]", "1", pattern)
    plain = re.sub(r"[\\^$()?*+|{}\[\]]", " ", plain)
    words = [w for w in plain.split() if w]
    return sorted({plain, *words, *(" ".join(words[:i]) for i in range(1, len(words)))})


ADVERSARIAL = sorted({f for _, p in PATTERNS for f in _fragments(p)} |
                     {" ", "1", "a", "SIG", "[PG ", "[", "\t", "rank : 1\n", "\r", "=", "connect ", "\x1b[2J"})


# -- explain: never raises, never slow, same answer as a line-by-line pass -----------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("cause,pattern", PATTERNS, ids=[f"{c}:{i}" for i, (c, _) in enumerate(PATTERNS)])
def test_catalogue_patterns_do_not_backtrack(cause, pattern):
    """Each pattern on 50 KB lines built from its own fragments: a backtracking pattern takes a minute
    here (the old killed-by-signal pattern took 6 s at 20 KB); a linear one takes milliseconds."""
    rx = re.compile(pattern)
    for frag in _fragments(pattern) + ["SIG", "[PG ", " ", "1"]:
        for text in (frag * (50_000 // len(frag)), (frag + " ") * (50_000 // (len(frag) + 1))):
            t0 = time.perf_counter()
            rx.search(text)
            assert time.perf_counter() - t0 < 1.0, f"{cause}: {pattern!r} backtracks on {frag!r} * N"


adversarial_text = st.lists(
    st.tuples(st.sampled_from(ADVERSARIAL), st.integers(1, 20_000)), min_size=1, max_size=8,
).map(lambda parts: "".join(f * n for f, n in parts)[:1_000_000])  # up to 1 MB, often one long line
any_text = st.one_of(st.text(max_size=3000), adversarial_text,
                     st.binary(max_size=3000).map(lambda b: b.decode("utf-8", "replace")))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=any_text, cut=st.integers(1, 5000))
def test_explain_never_raises_and_is_fast(text, cut):
    cut = max(cut, len(text) // 100)  # pieces of any size, at most ~100 of them
    t0 = time.perf_counter()
    whole = scan_text(text)
    assert time.perf_counter() - t0 < 3.0  # a loose bound; benchmarks/bench_explain.py holds the targets
    scanner = LogScanner()
    for i in range(0, len(text), cut):
        scanner.feed(text[i:i + cut])
    pieces = scanner.finish()
    assert [(m.cause.id, m.ranks, m.count, m.evidence) for m in whole.matches] == \
           [(m.cause.id, m.ranks, m.count, m.evidence) for m in pieces.matches]
    assert whole.first_failure == pieces.first_failure
    for line in render_matches(whole.matches, "x", whole.first_failure):
        assert not re.search("[\x00-\x1f\x7f-\x9f]", line)


def _reference(text: str) -> list:
    """The plain algorithm: every line through every pattern, in table order."""
    lines = text.splitlines()
    table = [(c, c.compiled()) for c in CAUSES]
    found: dict = {}
    for line, rank in zip(lines, ranks_of_lines(lines)):
        if len(line) > LINE_CAP:
            continue
        for cause, regexes in table:
            hits = [rx.search(line) for rx in regexes]
            hit = next((m for m in hits if m), None)
            if hit is not None:
                if cause.id == "killed-by-signal" and any(s in hit.group(0) for s in ("SIGTERM", "SIGINT", "SIGHUP",
                                                                                     "-15 (", "-2 (", "-1 (")):
                    continue
                entry = found.setdefault(cause.id, [0, set()])
                entry[0] += 1
                if rank is not None:
                    entry[1].add(rank)
                break
    return sorted((k, v[0], sorted(v[1])) for k, v in found.items())


LOG_LINES = [
    "[rank1]: RuntimeError: EADDRINUSE", "[default0]:[W socket] Address already in use", "Connection refused",
    "[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5) ran for 600000 milliseconds",
    "[Rank 3] Connection reset by peer", "[PG 0 Rank 2] unhandled system error", "  rank      : 1 (local_rank: 1)",
    "  exitcode  : -9 (pid: 5)", "=====", "Signal 9 (SIGKILL) received by PID 12", "died with <Signals.SIGSEGV: 11>",
    "[rank2]: Duplicate GPU detected : rank 2 and rank 0 both on CUDA device 0", "step 5 loss 0.1", "",
    "gloo/transport/tcp/pair.cc:144] connect [127.0.1.1]:1: Connection refused", "CUDA out of memory. GPU 0 ",
    "Default process group has not been initialized", "[rank3]: Expected to have finished reduction in the prior",
]


@FAST
@given(st.lists(st.sampled_from(LOG_LINES), max_size=30), st.integers(1, 400))
def test_streaming_pass_answers_as_a_line_by_line_pass(lines, piece):
    text = "\n".join(lines)
    scanner = LogScanner()
    for i in range(0, len(text), piece):
        scanner.feed(text[i:i + piece])
    got = sorted((m.cause.id, m.count, sorted(m.ranks)) for m in scanner.finish().matches)
    assert got == _reference(text)


def test_long_lines_are_cut_head_and_tail_and_said():
    head = "EADDRINUSE " + "x" * (10 << 20) + "\n"
    result = scan_text(head)
    assert [m.cause.id for m in result.matches] == ["port-in-use"] and result.cut_lines == 1
    middle = "x" * (1 << 20) + " Duplicate GPU detected " + "x" * (1 << 20) + "\nok\n"
    result = scan_text(middle)
    assert result.matches == [] and result.cut_lines == 1
    assert [m.cause.id for m in explain_text("y" * 100 + " EADDRINUSE")] == ["port-in-use"]


@pytest.mark.timeout(60)
def test_explain_cli_long_line_special_files_and_streams(cli_env, tmp_path):
    log = tmp_path / "one-line.log"
    log.write_text("x" * (3 << 20) + " EADDRINUSE\n")
    p = subprocess.run(CMD + ["explain", "--log", str(log)], env=cli_env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "port-in-use" in p.stdout
    assert "note: 1 line longer than 8 KB was cut: matched on the first and last 4 KB" in p.stdout
    # /dev/zero: an endless device; read within the budget, said, exit 0
    p = subprocess.run(CMD + ["explain", "--log", "/dev/zero", "--max-wait", "20"], env=cli_env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "read only the first 256 MiB of /dev/zero" in p.stdout, p.stderr
    # a FIFO whose writer never writes and never closes: stopped by --max-wait
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"exec sleep 60 > {fifo}"])
    try:
        t0 = time.monotonic()
        p = subprocess.run(CMD + ["explain", "--log", str(fifo), "--max-wait", "1"], env=cli_env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and "stopped reading" in p.stdout and "after 1 s" in p.stdout, p.stderr
        assert time.monotonic() - t0 < 30
    finally:
        writer.kill()
        writer.wait()


@pytest.mark.timeout(60)
def test_explain_user_errors_are_exit_2_and_output_is_escaped(cli_env, tmp_path):
    for args in (["explain", "--log", str(tmp_path / "nope")], ["explain", "--log", str(tmp_path)]):
        p = subprocess.run(CMD + args, env=cli_env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and p.stderr.startswith("error[log-unreadable]") and len(p.stderr.splitlines()) == 1
    # stdin closed (not merely empty): exit 2, one line
    p = subprocess.run(" ".join(CMD) + " explain - <&-", shell=True, env=cli_env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error[stdin-closed]") and "Traceback" not in p.stderr
    log = tmp_path / "ansi.log"
    log.write_bytes(b"[rank1]: \x1b]0;owned\x07\x1b[2J EADDRINUSE \xe2\x80\xae etcd://root:hunter2@etcd:2379\r\n")
    p = subprocess.run(CMD + ["explain", "--log", str(log)], env=cli_env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "port-in-use" in p.stdout
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", p.stdout) and "\\e[2J" in p.stdout
    assert "hunter2" not in p.stdout and f"root:{REDACTED}@etcd" in p.stdout


# -- numeric options: one type, exit 2 or a valid value ----------------------------------------

def _numeric_params():
    out = []
    for name, command in cli.commands.items():
        for param in command.params:
            if isinstance(param.type, Number):
                out.append((name, param))
    return out


NUMERIC = _numeric_params()
NUMBERISH = st.one_of(
    st.text(max_size=12), st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers().map(str),
    st.sampled_from(["nan", "NaN", "inf", "-inf", "+inf", "1e999", "-0", "0", "-1", "0x10", " 5 ", "1_000", "7.",
                     "1e-320", "65536", "16M", "1.5G", "0.5K", "999999999999999999999G"]),
)


def test_every_numeric_option_uses_the_shared_type():
    names = {(c, p.name) for c, p in NUMERIC}
    for expected in [("check", "timeout"), ("check", "min_busbw"), ("check", "nproc"), ("check", "master_port"),
                     ("bench", "min_bytes"), ("bench", "iters"), ("bench", "timeout"), ("stacks", "wait"),
                     ("stacks", "pids"), ("run", "hang_timeout"), ("explain", "max_wait")]:
        assert expected in names
    for command in cli.commands.values():  # no plain int/float left anywhere
        for param in command.params:
            assert not isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType)), param.name


@settings(max_examples=150, deadline=None)
@given(which=st.sampled_from(range(len(NUMERIC))), text=NUMBERISH)
def test_numeric_options_parse_to_finite_in_range_or_usage_error(which, text):
    command_name, param = NUMERIC[which]
    try:
        value = param.type.convert(text, param, None)
    except click.BadParameter as exc:
        message = exc.format_message()
        assert "accepted:" in message and len(message.splitlines()) == 1
        return
    assert isinstance(value, int) if param.type.kind is not float else isinstance(value, float)
    assert math.isfinite(value)
    t = param.type
    assert t.low is None or (value > t.low if t.low_open else value >= t.low)
    assert t.high is None or value <= t.high


@settings(max_examples=25, deadline=None)
@given(option=st.sampled_from(["explain --max-wait", "stacks --wait"]), text=NUMBERISH)
def test_any_string_on_the_command_line_is_a_valid_run_or_exit_2_never_3(option, text):
    """Through the whole CLI (click's CliRunner), with commands whose valid runs finish at once."""
    if option == "explain --max-wait":
        args = ["explain", "--max-wait", text, "EADDRINUSE"]  # valid: explains the word, exit 0
    else:
        args = ["stacks", "--wait", text, "2147483647"]  # valid: no such PID, exit 2 after parsing
    result = CliRunner().invoke(cli, args)
    assert result.exit_code in (0, 2) and "Traceback" not in result.output, result.output
    if result.exit_code == 2:
        assert "error[" in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args,bad", [
    (["check", "--timeout", "nan"], "'nan' is not a finite number; accepted: a number > 0 and <= 86400 (seconds)"),
    (["check", "--timeout", "inf"], "'inf' is not a finite number"),
    (["check", "--min-busbw", "nan"], "'nan' is not a finite number"),
    (["check", "--nproc", "0"], "'0' is out of range; accepted: an integer from 1 to 1024"),
    (["run", "--hang-timeout", "0", "--", "true"], "'0' is out of range"),
    (["run", "--hang-timeout", "-1", "--", "true"], "'-1' is out of range"),
    (["run", "--hang-timeout", "nan", "--", "true"], "'nan' is not a finite number"),
    (["stacks", "--", "-1"], "'-1' is out of range; accepted: an integer from 1 to 2147483647"),
    (["bench", "--max-bytes", "1e3"], "'1e3' is not a size in bytes"),
])
def test_bad_numbers_are_one_line_exit_2_before_any_work(cli_env, args, bad):
    p = subprocess.run(CMD + args, env=cli_env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error[usage]: ") and bad in p.stderr and len(p.stderr.splitlines()) == 1


# -- stdout closed or full, --json paths ------------------------------------------------------

@pytest.mark.timeout(60)
def test_closed_or_full_stdout_ends_quietly_with_documented_codes(cli_env):
    p = subprocess.Popen(CMD + ["explain", "EADDRINUSE"], env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the first write (like `| head -0`)
    with p.stderr:
        err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and err == ""
    with open("/dev/full", "w") as full:
        p = subprocess.run(CMD + ["explain", "EADDRINUSE"], env=cli_env, stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=60)
    assert p.returncode == 74 and p.stderr == ""


@pytest.mark.timeout(60)
def test_json_paths_refused_before_work(cli_env, tmp_path):
    target = tmp_path / "target.json"
    target.write_text("keep")
    link = tmp_path / "report.json"
    link.symlink_to(target)
    for path, words in ((link, "is a symbolic link"), (tmp_path / "missing" / "r.json", "does not exist"),
                        (tmp_path, "is a directory")):
        t0 = time.monotonic()
        p = subprocess.run(CMD + ["check", "--json", str(path)], env=cli_env, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2 and p.stderr.startswith("error[") and words in p.stderr, p.stderr
        assert len(p.stderr.splitlines()) == 1
        assert p.stdout == ""  # nothing ran
        assert time.monotonic() - t0 < 30
    assert target.read_text() == "keep"


def test_write_json_replaces_atomically_and_never_through_links(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    os.chmod(path, 0o640)
    inode = path.stat().st_ino
    write_json_file(str(path), {"a": 1, "url": "etcd://u:s3cr3t@h"})
    assert json.loads(path.read_text()) == {"a": 1, "url": f"etcd://u:{REDACTED}@h"}
    assert path.stat().st_ino != inode and stat.S_IMODE(path.stat().st_mode) == 0o640
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "l.json"
    link.symlink_to(victim)
    with pytest.raises(UsageError):
        write_json_file(str(link), {"a": 1})
    assert victim.read_text() == "precious" and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.json", "r.json", "victim"]  # no temporary left


# -- redaction and control characters ----------------------------------------------------------

# A token holds a digit: without one, hypothesis (which draws strings from the code's own constants) can pick a word
# that the report prints itself ("candidates", a JSON key), which is no leak.
SECRET = st.text(alphabet="abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=10,
                 max_size=40).filter(lambda s: any(c.isdigit() for c in s))
FORMS = ["etcd://user:{s}@host:2379", "https://{s}@github.com/org/repo.git", "Authorization: Bearer {s}",
         "authorization={s}", "HF_TOKEN={s}", "WANDB_API_KEY: {s}", '"db_password": "{s}"', "MY_SECRET='{s}'",
         "AWS_SECRET_ACCESS_KEY={s}", "x-api-key: {s}", "PASSWORD={s}", "redis://:{s}@cache:6379/0"]
AROUND = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(secret=SECRET, form=st.sampled_from(FORMS), before=AROUND, after=AROUND)
def test_a_secret_never_appears_in_any_output(secret, form, before, after, tmp_path_factory):
    assume(secret not in before + after)
    quoted = f"{before} {form.format(s=secret)}"
    line = f"[rank1]: {quoted} EADDRINUSE {after}".replace("\n", " ").replace("\r", " ")
    assume(re.search("[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]", line) is None)
    # explain: text and JSON
    result = scan_text(line + "\n")
    rendered = "\n".join(render_matches(result.matches, "log", result.first_failure))
    assert secret not in rendered and secret not in json.dumps([m.to_dict() for m in result.matches])
    # env: a variable whose value holds the secret, and a variable named like one
    env = redact_env({"TORCHELASTIC_RDZV_ENDPOINT": quoted, "TORCH_HUB_TOKEN": secret})
    assert secret not in json.dumps(env)
    # the report: terminal lines and the JSON file
    outcome = Outcome(0, Status.FAIL, quoted, hint=quoted, details=(quoted,))
    res = CheckResult("env", Status.FAIL, quoted, hint=quoted, details=(quoted,), outcomes=(outcome,))
    assert secret not in "\n".join(render_result(res, Style(fancy=True), 8, verbose=True))
    assert secret not in "\n".join(render_result(res, Style(fancy=False), 8, verbose=True))
    # a random secret may spell a word the report itself prints ("interrupte" in the key "interrupted"):
    # not a leak, so such a draw is set aside by comparing with the same report holding no text of the user's
    plain = CheckResult("env", Status.FAIL, "", hint="", details=("",), outcomes=(Outcome(0, Status.FAIL, ""),))
    assume(secret not in json.dumps(RunReport(WorldInfo(world_size=1, backend="gloo"), (plain,)).to_dict()))
    path = tmp_path_factory.mktemp("json") / "r.json"
    write_json_file(str(path), RunReport(WorldInfo(world_size=1, backend="gloo"), (res,)).to_dict())
    assert secret not in path.read_text()


@settings(max_examples=60, deadline=None)
@given(st.text())
def test_escaped_text_has_no_control_characters(text):
    out = escape_controls(text)
    assert not re.search("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]", out)
    assert safe_text(text).count("\n") == 0
    if not re.search("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]", text):
        assert out == text


# -- signals in `ddpdoctor check` ------------------------------------------------------------

def _start_check(cli_env, tmp_path):
    env = dict(cli_env, TMPDIR=str(tmp_path), PYTHONWARNINGS="ignore")
    return subprocess.Popen(CMD + ["check", "--nproc", "2", "--only", "env,port,process-group"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(p):
    try:
        out, err = p.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    return p.returncode, out, err


def _wait_for_handlers(pid: int, timeout: float = 60.0) -> None:
    """Wait until ``pid`` catches SIGINT and SIGTERM (``SigCgt`` in /proc/<pid>/status)."""
    want = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status") as f:
                caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
        except (OSError, StopIteration):
            return  # ended already: the run's own result says what happened
        if caught & want == want:
            return
        time.sleep(0.001)
    raise AssertionError(f"pid {pid} installed no SIGINT/SIGTERM handler in {timeout:g}s")


@pytest.mark.timeout(300)
def test_signals_at_random_moments_stop_cleanly(cli_env, tmp_path):
    """Three real runs side by side: SIGTERM during start-up, one Ctrl-C and two Ctrl-Cs at random moments.

    The first signal ends the run with a report (exit 130) whatever the moment; a second one exits at once;
    never a traceback or atexit noise; no process and no temporary folder left behind.
    """
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    dirs = [tmp_path / name for name in ("term", "int", "twice")]
    for d in dirs:
        d.mkdir()
    procs = [_start_check(cli_env, d) for d in dirs]
    # "Any moment" starts when ddpdoctor's first line has run: before that the interpreter itself is
    # starting, and a signal there takes its default action in every Python program (exit -15).
    for p in procs:
        _wait_for_handlers(p.pid)
    plan = [(procs[0], [rnd.uniform(0.0, 1.0)], signal.SIGTERM),
            (procs[1], [rnd.uniform(0.0, 6.0)], signal.SIGINT),
            (procs[2], [rnd.uniform(0.0, 6.0), rnd.uniform(0.0, 0.5)], signal.SIGINT)]
    t0 = time.monotonic()
    events = sorted((sum(delays[:i + 1]), p, sig) for p, delays, sig in plan for i in range(len(delays)))
    for at, p, sig in events:
        time.sleep(max(0.0, at - (time.monotonic() - t0)))
        if p.poll() is None:
            p.send_signal(sig)
    results = [_finish(p) for p in procs]
    for (code, out, err), d, (_, delays, sig) in zip(results, dirs, plan):
        where = f"seed {seed}, {sig.name} after {delays}: exit {code}\n{out}\n{err}"
        assert "Traceback" not in err and "Exception ignored" not in err, where
        if len(delays) == 1 and code != 0:  # 0: the run ended before the signal came
            assert code == 130, where
            # the report's footer, or (a signal during start-up, before any check began) one line on stderr
            assert f"interrupted by {sig.name}" in out + err, where
        if len(delays) == 2:  # 130, or killed by the second SIGINT in the last moments of shutdown
            assert code in (0, 130, -signal.SIGINT), where
        assert list(d.iterdir()) == [], where  # the run's temporary folder is gone
