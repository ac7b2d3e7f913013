"""Real gloo jobs whose ranks diverge, each rank writing its Flight Recorder dump (tests/test_flight_recorder.py).

Every rank runs a dump thread: a Python signal handler cannot run while the main thread is blocked in a
C++ collective, a thread can. The main thread says, just before its last (hanging) call, how many
collectives its ring holds; the thread polls the recorder until that call is recorded, writes the dump
(to a temporary name, then renames it, so a reader never sees half a file) and ends the process. Every
wait has a deadline. Several scenarios share one launch, each in its own process group.

``# MARK:<name>`` comments name the lines the tests expect in the verdicts (tests look them up).
"""

from __future__ import annotations

import os
import subprocess
import sys

COMMON = r'''
import os, pickle, signal, sys, threading, time
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

DEADLINE = time.monotonic() + float(os.environ.get("FR_JOB_DEADLINE", "90"))
LAST = []


class Plain(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(name)


def recorded():
    doc = Plain(__import__("io").BytesIO(_dump_fr_trace(True, False, False))).load()
    return sum(int(s["last_enqueued_collective"]) for s in doc.get("pg_status", {}).values())


def last_call():
    """The next collective is this rank's last: it hangs there; the dump thread waits until it is recorded."""
    LAST.append(recorded() + 1)


def write(out, prefix, rank, data):
    tmp = os.path.join(out, f".tmp-{prefix}{rank}")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(out, f"{prefix}{rank}"))


def dump_thread(out, rank, dumpers):
    """Dump once this rank's last call is recorded; exit once every rank in ``dumpers`` has dumped (a rank
    that left earlier would break the others' connections before they wrote)."""
    def run():
        while time.monotonic() < DEADLINE and not (LAST and recorded() >= LAST[0]):
            time.sleep(0.05)
        write(out, "fr-", rank, _dump_fr_trace())
        write(out, "fr-json-", rank, _dump_fr_trace_json())
        wait_for_files([os.path.join(out, f"fr-json-{r}") for r in dumpers])
        os._exit(0 if time.monotonic() < DEADLINE else 3)
    threading.Thread(target=run, daemon=True).start()


def wait_for_files(paths):
    while time.monotonic() < DEADLINE and not all(os.path.exists(p) for p in paths):
        time.sleep(0.05)
'''

# mp.spawn, 4 ranks. Default group: two all_reduces, fine. Group A = [0, 1, 2]: one all_reduce, then
# rank 0 alone calls another (the `if rank == 0:` bug). Group B = [1, 2]: rank 1 all_reduce, rank 2
# broadcast at #1. Rank 3 kills itself (SIGKILL) after the others dumped: it leaves no dump.
SPAWN_GROUPS = COMMON + r'''
import torch.multiprocessing as mp


def work(rank, world, out, store):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    group_a = dist.new_group([0, 1, 2])
    group_b = dist.new_group([1, 2])
    if rank != 3:
        dump_thread(out, rank, range(3))
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(t)
    if rank == 3:
        wait_for_files([os.path.join(out, f"fr-json-{r}") for r in range(3)])
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t, group=group_a)  # MARK:a_common
    if rank == 0:
        last_call()
        dist.all_reduce(t, group=group_a)  # MARK:rank0_only
    elif rank == 1:
        last_call()
        dist.all_reduce(t, group=group_b)  # MARK:b_all_reduce
    else:
        last_call()
        dist.broadcast(t, src=1, group=group_b)  # MARK:b_broadcast
    time.sleep(max(0.0, DEADLINE - time.monotonic()))


if __name__ == "__main__":
    out = sys.argv[1]
    mp.spawn(work, args=(4, out, os.path.join(out, "store")), nprocs=4)
'''

# torchrun, 3 ranks, a ring of 24 entries (older entries evicted). Group H = [0, 1, 2]: 30 all_reduces,
# fine. Group S = [0, 1, 2]: rank 2 all_reduces a [2, 2] tensor where the others pass [4]: gloo accepts
# it silently (same bytes). Default group: DDP; at step 1 rank 0 calls barrier (a rank-0 checkpoint)
# while ranks 1 and 2 run backward (DDP's reducer all-reduce).
TORCHRUN_DDP = COMMON + r'''
def main(out):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group_h = dist.new_group([0, 1, 2])
    group_s = dist.new_group([0, 1, 2])
    dump_thread(out, rank, range(3))
    t = torch.ones(4)
    for _ in range(30):
        dist.all_reduce(t, group=group_h)
    dist.all_reduce(torch.ones(2, 2) if rank == 2 else torch.ones(4), group=group_s)  # MARK:shape
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    for step in range(2):
        if step == 1 and rank == 0:
            last_call()
            dist.barrier()  # MARK:barrier
        if step == 1:
            last_call()
        model(torch.ones(2, 4)).sum().backward()  # MARK:step
    time.sleep(max(0.0, DEADLINE - time.monotonic()))


try:
    main(sys.argv[1])
except RuntimeError:  # a peer ended (os._exit) once every dump was written: the dump thread sets the exit code
    time.sleep(max(0.0, DEADLINE - time.monotonic()))
'''


# mp.spawn, 3 ranks. Default group: one all_reduce; then all_gather at #2: rank 1 passes a [5] tensor and
# rank 2 a float64 one where rank 0 passes [4] float32. gloo checks both locally and raises before the
# collective is recorded; each raising rank writes its dump in its exception handler (as a hook would),
# waits for the others' dumps, and re-raises. Rank 0 waits in all_gather.
SPAWN_RAISE = COMMON + r'''
import torch.multiprocessing as mp


def work(rank, world, out, store):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    t = torch.ones(4)
    dist.all_reduce(t)  # MARK:raise_common
    gathered = [torch.zeros(4) for _ in range(world)]
    if rank == 0:
        dump_thread(out, rank, range(3))
        last_call()
        dist.all_gather(gathered, t)  # MARK:gather
        return
    try:
        mine = torch.ones(5) if rank == 1 else torch.ones(4, dtype=torch.float64)
        dist.all_gather(gathered, mine)  # MARK:bad_gather
    except Exception:
        write(out, "fr-", rank, _dump_fr_trace())
        write(out, "fr-json-", rank, _dump_fr_trace_json())
        wait_for_files([os.path.join(out, f"fr-json-{r}") for r in range(3)])
        raise


if __name__ == "__main__":
    out = sys.argv[1]
    mp.spawn(work, args=(3, out, os.path.join(out, "store")), nprocs=3)
'''


def mark_line(text: str, mark: str) -> int:
    """The 1-based line of ``# MARK:<mark>`` in a script's text."""
    for i, line in enumerate(text.splitlines(), 1):
        if line.rstrip().endswith(f"# MARK:{mark}"):
            return i
    raise KeyError(mark)


def run_spawn(tmp_path, env: dict, timeout: float = 150):
    """Run SPAWN_GROUPS; returns (script path, dump directory, CompletedProcess)."""
    script, out = tmp_path / "spawn_groups.py", tmp_path / "dumps-spawn"
    script.write_text(SPAWN_GROUPS)
    out.mkdir()
    e = {**env, "TORCH_FR_BUFFER_SIZE": "2000"}
    proc = subprocess.run([sys.executable, str(script), str(out)], env=e, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    os.remove(out / "store") if (out / "store").exists() else None
    return script, out, proc


def run_spawn_raise(tmp_path, env: dict, timeout: float = 150):
    """Run SPAWN_RAISE; returns (script path, dump directory, CompletedProcess)."""
    script, out = tmp_path / "spawn_raise.py", tmp_path / "dumps-raise"
    script.write_text(SPAWN_RAISE)
    out.mkdir()
    e = {**env, "TORCH_FR_BUFFER_SIZE": "2000"}
    proc = subprocess.run([sys.executable, str(script), str(out)], env=e, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    os.remove(out / "store") if (out / "store").exists() else None
    return script, out, proc


def run_torchrun(tmp_path, env: dict, timeout: float = 150):
    """Run TORCHRUN_DDP under torchrun (3 ranks); returns (script path, dump directory, CompletedProcess)."""
    script, out = tmp_path / "torchrun_ddp.py", tmp_path / "dumps-torchrun"
    script.write_text(TORCHRUN_DDP)
    out.mkdir()
    e = {**env, "TORCH_FR_BUFFER_SIZE": "24"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
           "--monitor-interval=0.2", str(script), str(out)]
    proc = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    return script, out, proc
