"""``ddpdoctor run``'s hang detector reads collective progress from the Flight Recorder: CPU time spent
waiting in a collective (NCCL spins in a CUDA synchronisation there) is not progress; a collective
completed is; torch's own timeout dumps are not the job's I/O.

NCCL cannot run here (no GPU): its readings are fixtures built from the schema in the headers the
torch wheel ships (``torch/include/.../c10d/FlightRecorder.hpp``), checked against those headers, and
from a real NCCL dump (torch 2.11, H100). The decision itself runs against real processes: one that
spins at one place, one that writes a dump the way NCCL's watchdog does, and a real gloo job whose
rank 0 spins in Python on a collective that rank 1 never enters.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time

import pytest

from ddpdoctor.exitcodes import ExitCode
from ddpdoctor.postmortem.collective_progress import completed_since, read_state, waiting

CMD = [sys.executable, "-m", "ddpdoctor", "run"]
REAL = os.path.join(os.path.dirname(__file__), "data", "flight_recorder")


# --- NCCL fixtures from the header's schema ----------------------------------------------------------


def _headers(name: str = "FlightRecorder*.hpp") -> list:
    """The installed torch wheel's c10d headers named ``name`` (found without importing torch)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    root = os.path.join(list(spec.submodule_search_locations)[0], "include")
    return glob.glob(os.path.join(root, "torch", "csrc", "distributed", "c10d", name)) or \
        glob.glob(os.path.join(root, "**", "c10d", name), recursive=True)


def _header_constants() -> dict:
    """``DEFINE_CONSTANT(name, "value")`` of the FlightRecorder headers the installed torch wheel ships."""
    found: dict = {}
    for path in _headers():
        with open(path, encoding="utf-8", errors="replace") as f:
            found.update(re.findall(r'DEFINE_CONSTANT\((\w+),\s*"([^"]*)"\)', f.read()))
    if not found:
        pytest.skip("this torch wheel ships no FlightRecorder headers")
    return found


def _entry(seq: int, state: str, retired: bool = False, pg: int = 0) -> dict:
    """An NCCL entry as FlightRecorder.hpp writes it (the keys the reading keeps)."""
    return {"pg_id": pg, "collective_seq_id": seq, "state": state, "retired": retired, "is_p2p": False}


def _nccl(completed: int, enqueued: int, entries: list) -> dict:
    """An NCCL reading: ``pg_status`` as the watchdog keeps it, and the active entries."""
    return {"backend": "nccl", "pg_status": {"0": {"last_enqueued_collective": enqueued, "last_started_collective": -1,
                                                   "last_completed_collective": completed}}, "entries": entries}


def test_the_keys_and_states_read_are_the_headers():
    """The schema the fixtures below are built from is the installed torch's own."""
    consts = _header_constants()
    for key in ("pg_status", "entries", "pg_id", "collective_seq_id", "state", "retired", "is_p2p"):
        assert key in consts.values(), key
    assert {consts["scheduled_state"], consts["started_state"], consts["completed_state"]} == {
        "scheduled", "started", "completed"}
    hpp = _headers("FlightRecorderDetail.hpp")
    text = ""
    if hpp:
        with open(hpp[0], encoding="utf-8") as f:
            text = f.read()
    for key in ("last_enqueued_collective", "last_completed_collective"):
        assert f'"{key}"' in text, key


def test_nccl_readings_scheduled_started_completed_and_timed_out():
    # rank spinning in a CUDA sync on #7: entered (scheduled, then started), nothing completed since
    before = read_state(_nccl(6, 7, [_entry(7, "scheduled")]), "nccl")
    now = read_state(_nccl(6, 7, [_entry(7, "started")]), "nccl")
    assert now.in_flight and now.active == 1 and waiting(before, now) and not completed_since(before, now)
    # #7 completes: the entry says so before the watchdog's pg_status does; progress
    done = read_state(_nccl(6, 8, [_entry(7, "completed"), _entry(8, "scheduled")]), "nccl")
    assert done.completed[0] == 7 and completed_since(now, done) and not waiting(now, done)
    # retired but never completed (FlightRecorder.hpp: it timed out): neither completed nor in flight
    timed_out = read_state(_nccl(6, 7, [_entry(7, "scheduled", retired=True)]), "nccl")
    assert timed_out.timed_out == 1 and timed_out.completed[0] == 6 and not completed_since(before, timed_out)
    assert not timed_out.active and timed_out.in_flight  # pg_status: #7 entered, never completed
    # all done, nothing in flight: a busy CPU is the rank's own work
    idle = read_state(_nccl(7, 7, []), "nccl")
    assert not idle.in_flight and not waiting(now, idle)
    # no reading at all (older torch, recorder off): never "waiting": CPU counts as before
    assert not waiting(None, None) and not waiting(now, None)


def _load(path: str) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)


def test_backend_decides_how_states_are_read_on_real_dumps():
    """torch 2.11's NCCL dump: the entries say #9 completed while pg_status (the watchdog's) still says
    -1; its gloo dump: every entry ``scheduled`` though all completed, as pg_status says."""
    nccl = _load(os.path.join(REAL, "torch2.11-nccl", "nccl_trace_rank_0"))
    assert nccl["pg_status"]["0"]["last_completed_collective"] == -1
    state = read_state(nccl, "nccl")
    assert state.completed[0] == 9 and not state.in_flight
    gloo = _load(os.path.join(REAL, "torch2.11-gloo", "fr_trace_rank_0"))
    assert {e["state"] for e in gloo["entries"]} == {"scheduled"}
    assert not read_state(gloo, "gloo").in_flight
    assert read_state(gloo, "nccl").timed_out > 0  # read with NCCL's rule, gloo's finished work looks timed out


# --- the decision, against real processes --------------------------------------------------------------

SPIN = "import time\nwhile True: pass\n"
SLEEP = r'''
import signal, sys, time
def dump(*_):  # what NCCL's watchdog does on a timeout: one dump to $TORCH_FR_DUMP_TEMP_FILE<rank>
    with open(sys.argv[1], "wb") as f:
        f.write(b"x" * (256 << 10))
signal.signal(signal.SIGUSR1, dump)
while True:
    time.sleep(3600)
'''


def _rank(tmp_path, code: str, *args: str, rank: int = 0):
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.DEVNULL)
    beat = run_dir / f"beat-{proc.pid}"
    beat.write_bytes(b"%012d\n" % 1)
    (run_dir / f"proc-{proc.pid}.json").write_text(json.dumps(
        {"pid": proc.pid, "role": "rank", "rank": rank, "beat_file": str(beat), "own_threads": []}))
    return proc, run_dir


def _reading(run_dir, pid: int, doc: dict) -> None:
    path = run_dir / f"frprog-{pid}.json"
    path.write_text(json.dumps(doc))


def _settle(watch, pid: int, deadline: float = 30.0) -> None:
    """Until the process's interpreter start-up (reading its modules: I/O) is over."""
    end, still = time.monotonic() + deadline, 0
    while still < 3:
        assert time.monotonic() < end, "the process's I/O never settled"
        io = watch.procs[pid].io
        time.sleep(0.1)
        watch.sample(0.1)
        still = still + 1 if watch.procs[pid].io == io else 0


def _cpu_grows(pid: int, seconds: float = 0.05, deadline: float = 30.0) -> None:
    """Until ``pid`` used ``seconds`` more CPU (a loaded machine gives a spinning process less)."""
    import psutil

    p = psutil.Process(pid)
    start, end = sum(p.cpu_times()[:2]), time.monotonic() + deadline
    while sum(p.cpu_times()[:2]) - start < seconds:
        assert time.monotonic() < end, "the spinning process got no CPU"
        time.sleep(0.05)


@pytest.mark.timeout(90)
def test_cpu_spent_waiting_in_a_collective_is_not_progress(tmp_path):
    from ddpdoctor.postmortem.jobrun import _Watch

    proc, run_dir = _rank(tmp_path, SPIN)
    try:
        watch = _Watch(str(run_dir), progress_s=0.5)
        watch.discover()
        _settle(watch, proc.pid)
        _reading(run_dir, proc.pid, _nccl(6, 7, [_entry(7, "started")]))
        watch.sample(0.2)  # the first reading
        for _ in range(2):  # spinning inside #7, main thread in one place: not progress, look after look
            _cpu_grows(proc.pid)
            assert watch.sample(0.2) is False
        _reading(run_dir, proc.pid, _nccl(7, 8, [_entry(7, "completed"), _entry(8, "started")]))
        assert watch.sample(0.2) is True  # #7 completed: progress, even with no CPU counted
        _cpu_grows(proc.pid)
        assert watch.sample(0.2) is False  # spinning in #8 now
        beat = run_dir / f"beat-{proc.pid}"
        beat.write_bytes(b"%012d\n" % 2)
        assert watch.sample(0.2) is True  # its main thread moved: its own work (saving, evaluating), not hung
        _reading(run_dir, proc.pid, _nccl(8, 8, []))
        _cpu_grows(proc.pid)
        assert watch.sample(0.2) is True  # no collective in flight: the CPU is its own work
        _reading(run_dir, proc.pid, _nccl(8, 9, [_entry(9, "started")]))
        os.utime(run_dir / f"frprog-{proc.pid}.json", (time.time() - 60, time.time() - 60))
        _cpu_grows(proc.pid)
        assert watch.sample(0.2) is True  # a stale reading (the hook fell silent) is not trusted: CPU counts
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(90)
def test_torchs_own_timeout_dump_is_not_the_jobs_io(tmp_path):
    """A dump written into ``TORCH_FR_DUMP_TEMP_FILE<rank>`` (NCCL's watchdog, with
    ``TORCH_NCCL_DUMP_ON_TIMEOUT``) leaves a hung rank hung; the same bytes into another file are work."""
    from ddpdoctor.postmortem.jobrun import TORCH_DUMP, _Watch

    prefix = str(tmp_path / "run" / TORCH_DUMP)
    (tmp_path / "run").mkdir()
    proc, run_dir = _rank(tmp_path, SLEEP, prefix + "0")
    other, _ = _rank(tmp_path, SLEEP, str(tmp_path / "run" / "checkpoint.bin"), rank=1)
    try:
        watch = _Watch(str(run_dir), torch_dump=prefix, progress_s=0.5)
        time.sleep(0.5)  # both are at their sleep (their start-up reads are done)
        watch.discover()
        _settle(watch, proc.pid)
        _settle(watch, other.pid)
        proc.send_signal(signal.SIGUSR1)  # rank 0: torch's dump
        _written(prefix + "0")
        assert watch.sample(0.2) is False
        other.send_signal(signal.SIGUSR1)  # rank 1: the same bytes, its own file
        _written(str(tmp_path / "run" / "checkpoint.bin"))
        assert watch.sample(0.2) is True
    finally:
        for p in (proc, other):
            p.kill()
            p.wait()


def _written(path: str, size: int = 256 << 10, deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while not (os.path.exists(path) and os.path.getsize(path) == size):
        assert time.monotonic() < end, path
        time.sleep(0.02)
    time.sleep(0.1)  # the file is closed


# --- a real job: a rank spinning in Python on a collective its peer never enters ----------------------

SPIN_JOB = r'''
import datetime, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank, world, store, marker):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=90))
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 0:
        w = dist.all_reduce(t, async_op=True)
        open(marker, "w").write(repr(time.time()))
        while not w.is_completed(): pass  # MARK:spin
    else:
        time.sleep(300)  # MARK:away


if __name__ == "__main__":
    mp.spawn(work, args=(2, sys.argv[1], sys.argv[2]), nprocs=2)
'''


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.timeout(200)
def test_a_rank_spinning_in_a_collective_is_hung_at_the_hang_timeout(cli_env, tmp_path):
    """Rank 0 busy-waits (CPU at 100%, main thread on one line) on an all_reduce rank 1 never enters:
    what NCCL does in a CUDA synchronisation. Before, its CPU time was progress and no hang was found
    until gloo's own timeout (90 s); now the verdict comes at --hang-timeout."""
    script = tmp_path / "spin.py"
    script.write_text(SPIN_JOB)
    marker = tmp_path / "spinning"
    hang = 3
    p = subprocess.run(CMD + ["--hang-timeout", str(hang), "--dir", str(tmp_path / "run"), "--", sys.executable,
                              str(script), str(tmp_path / "store"), str(marker)],
                       env={**cli_env, "XDG_STATE_HOME": str(tmp_path / "state")}, capture_output=True, text=True,
                       timeout=190)
    ended = time.time()
    assert p.returncode == ExitCode.HUNG, p.stderr[-3000:]
    assert f"ddpdoctor run: hung: no rank made progress for {hang}s" in p.stderr
    took = ended - float(marker.read_text())
    # the hang clock's hang s, the stacks and dumps read (3 s), the job stopped: well under gloo's 90 s
    assert took < hang + 30, (took, p.stderr[-3000:])
    verdict = p.stderr[p.stderr.index(f"hung: no rank made progress for {hang}s\n"):]
    assert "rank 0 entered, rank 1 never did" in verdict, verdict
