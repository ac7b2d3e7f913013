"""``ddpdoctor run``'s output: the job's output never waits on ddpdoctor's copy of it (a full disk), and a
closed standard output or error changes neither whether the job runs nor the code returned (issue 23)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

CMD = [sys.executable, "-m", "ddpdoctor", "run"]

# ~3 MB of output in 100-byte lines, 2 s of quiet, a line on stderr, then the exit code asked for.
LOUD = r'''
import sys, time
line = b"y" * 99 + b"\n"
out = sys.stdout.buffer
for _ in range(30000):
    out.write(line)
out.flush()
time.sleep(2)  # long enough for the hook's heartbeats (every 0.5 s), which the full disk refuses too
sys.stderr.write("loud job done\n")
sys.exit(int(sys.argv[1]))
'''
LOUD_BYTES = 30000 * 100


@pytest.fixture
def nearly_full_disk(tmp_path):
    """A 512 KiB tmpfs with 128 KiB left: room for the run's small files and its hook (about 75 KiB), not
    for 3 MB of output."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(mnt)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {p.stderr.strip()}")
    try:
        with open(mnt / "filler", "wb") as f:
            f.write(b"\0" * (384 << 10))
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("code", [0, 7])
@pytest.mark.timeout(120)
def test_a_full_disk_never_blocks_the_job(cli_env, tmp_path, nearly_full_disk, code):
    """The state folder on a nearly full disk: all 3 MB pass through, the job finishes (it is not called
    hung), its code is returned, one line says what was not saved, no traceback."""
    script = tmp_path / "loud.py"
    script.write_text(LOUD)
    env = {**cli_env, "XDG_STATE_HOME": str(nearly_full_disk)}
    p = subprocess.run(CMD + ["--hang-timeout", "5", "--", sys.executable, str(script), str(code)], env=env,
                       capture_output=True, timeout=90)
    err = p.stderr.decode()
    assert p.returncode == code, err[-3000:]
    assert len(p.stdout) == LOUD_BYTES and p.stdout == (b"y" * 99 + b"\n") * 30000
    assert "loud job done" in err
    unsaved = [line for line in err.splitlines() if "is incomplete" in line]
    assert len(unsaved) == 1, err[-3000:]
    assert unsaved[0].startswith("ddpdoctor run: output.raw.log is incomplete: ")
    assert "No space left on device" in unsaved[0] and "2.9 MiB of the job's output" in unsaved[0]
    assert "Traceback" not in err and "hung" not in err
    if code == 0:
        assert err.splitlines()[-1].startswith("ddpdoctor run: 1 process, exit 0 in ")
        assert os.listdir(nearly_full_disk / "ddpdoctor" / "runs") == []
    else:
        assert "ddpdoctor run: the job failed (exit 7)" in err


@pytest.mark.timeout(60)
def test_a_disk_too_full_for_the_run_dir_is_one_line_before_the_job_starts(cli_env, tmp_path, nearly_full_disk):
    with open(nearly_full_disk / "filler", "ab") as f:
        try:
            f.write(b"\0" * (512 << 10))
        except OSError:
            pass
    started = tmp_path / "started"
    env = {**cli_env, "XDG_STATE_HOME": str(nearly_full_disk)}
    p = subprocess.run(CMD + ["--", sys.executable, "-c", f"open({str(started)!r}, 'w')"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error[run-dir]: cannot create the run directory "), p.stderr
    assert "No space left on device" in lines[0] and not started.exists()
    runs = nearly_full_disk / "ddpdoctor" / "runs"
    assert not runs.exists() or os.listdir(runs) == []  # the half-made folder is not left behind


JOB = r'''
import os, sys
print("to stdout")
print("to stderr", file=sys.stderr)
open(sys.argv[1], "w").write("ran")
sys.exit(5)
'''


@pytest.mark.parametrize("closed", ["stdout", "stderr", "both"])
@pytest.mark.timeout(60)
def test_a_closed_stream_changes_neither_the_job_nor_its_code(cli_env, tmp_path, closed):
    """``run ... >&-`` / ``2>&-``: the job still starts and its exit code is returned; what it printed is in
    the raw log; the stream that is open still gets the job's output and the verdict."""
    script, started, run_dir = tmp_path / "job.py", tmp_path / "started", tmp_path / "run"
    script.write_text(JOB)
    redirect = {"stdout": ">&-", "stderr": "2>&-", "both": ">&- 2>&-"}[closed]
    out, err = tmp_path / "out", tmp_path / "err"
    shell = (f'exec "$@" {redirect}' + ("" if closed != "stdout" else f" 2>{err}")
             + ("" if closed != "stderr" else f" >{out}"))
    p = subprocess.run(["sh", "-c", shell, "sh", *CMD, "--dir", str(run_dir), "--", sys.executable, str(script),
                        str(started)], env=cli_env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 5, (p.stdout, p.stderr, err.read_text() if err.exists() else "")
    assert started.read_text() == "ran"
    log = (run_dir / "output.raw.log").read_text()
    assert "to stdout" in log and "to stderr" in log
    if closed == "stdout":
        text = err.read_text()
        assert "to stderr" in text and "ddpdoctor run: the job failed (exit 5)" in text and "Traceback" not in text
    if closed == "stderr":
        assert out.read_text() == "to stdout\n"


@pytest.mark.timeout(60)
def test_a_stalled_log_never_holds_the_output_back(tmp_path, monkeypatch):
    """The raw log on a file system that stops taking writes (a FIFO nobody reads: the log's writer blocks
    for good): every byte still reaches the terminal, and the copy says it fell behind."""
    import io
    import threading

    from ddpdoctor.postmortem import output

    monkeypatch.setattr(output, "LOG_BACKLOG", 1 << 20)
    log = tmp_path / "output.raw.log"
    os.mkfifo(log)
    reader = os.open(log, os.O_RDONLY | os.O_NONBLOCK)  # opened, never read
    filler = os.open(log, os.O_WRONLY | os.O_NONBLOCK)
    try:
        # The FIFO is full before the copy starts, so the log's first write blocks for good. Left to fill
        # from the copy, a writer thread scheduled late (a loaded CI host) would see the backlog already
        # dropped and never block, and this test would check nothing about a stalled writer.
        try:
            while True:
                os.write(filler, b"x" * 65536)
        except BlockingIOError:
            pass
        copy = output.OutputCopy(str(log))
        r, w = os.pipe()
        sink = io.BytesIO()
        data = bytes(range(256)) * (4 << 12)  # 4 MiB
        with os.fdopen(r, "rb", buffering=0) as job_out:
            copy.start(job_out, sink)
            # the log's writer takes a first chunk and blocks writing it, before the rest comes: scheduled late
            # (a loaded host), it would find the backlog already dropped and write nothing at all
            _write_all(w, data[:100])
            deadline = time.monotonic() + 20
            while not (copy.bytes >= 100 and copy.chunks.qsize() == 0) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert copy.chunks.qsize() == 0 and copy.saved == 0, "the log's writer never took the first chunk"
            writer = threading.Thread(target=_write_all, args=(w, data[100:]))
            writer.start()
            writer.join(timeout=30)
            assert not writer.is_alive(), "the job's writes were held back by the log"
            os.close(w)
            assert copy.close(wait=2.0) is False  # the log never caught up: said, not waited for
        assert sink.getvalue() == data
        line = copy.unsaved()
        assert line.startswith("ddpdoctor run: output.raw.log is incomplete: ") and "fell more than 1 MiB behind" in line
    finally:
        os.close(filler)
        os.close(reader)  # the blocked writer gets EPIPE and ends


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
