"""The end of a training process: the library's exit hook is registered by every import a user writes,
and ``exit_now`` ends a finished rank without the interpreter's teardown, losing nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddpdoctor.training import exit_now
from worlds import run_world

# A world of one on a FileStore: no port. The checker is registered before ddpdoctor is imported, so
# (atexit runs last-registered first) it runs after the library's hook and sees what the hook left.
_GROUP_AT_EXIT = """
import atexit, sys
import torch.distributed as dist
atexit.register(lambda: print("group alive at exit:", dist.is_initialized(), flush=True))
{imports}
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
dist.all_reduce(__import__("torch").ones(1))
"""


def _run(code: str, *args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("imports", ["import ddpdoctor.diagnostics as dd", "from ddpdoctor import get_rank"])
def test_every_library_import_destroys_a_gloo_group_left_alive_at_exit(imports, cli_env, tmp_path):
    # The README promises this hook; it lived in a module `import ddpdoctor.diagnostics` never imported.
    env = dict(cli_env, PYTHONWARNINGS="ignore")
    done = _run(_GROUP_AT_EXIT.format(imports=imports), str(tmp_path / "store"), env=env)
    assert (done.returncode, done.stdout) == (0, "group alive at exit: False\n"), done.stderr[-2000:]


@pytest.mark.timeout(120)
def test_without_the_library_the_group_is_alive_at_exit(cli_env, tmp_path):
    # The control for the test above: the checker does see a live group when nothing destroys it.
    bare = _run(_GROUP_AT_EXIT.format(imports=""), str(tmp_path / "store"), env=dict(cli_env, PYTHONWARNINGS="ignore"))
    assert bare.stdout == "group alive at exit: True\n", bare.stderr[-2000:]


_EXIT_NOW = """
import atexit, sys
import torch.distributed as dist
import ddpdoctor
atexit.register(lambda: print("handler ran; group alive:", dist.is_initialized(), flush=True))
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
log = open(sys.argv[2], "w")          # never closed: os._exit alone would drop its buffer
log.write("epoch 1 done\\n")
binary = open(sys.argv[2] + ".bin", "wb")
binary.write(b"\\x00\\x01")
print("no newline", end="")           # still in stdout's buffer (a pipe: block-buffered)
ddpdoctor.exit_now(int(sys.argv[3]))
print("never printed")
"""


@pytest.mark.timeout(120)
def test_exit_now_keeps_the_code_runs_the_handlers_and_flushes_every_file(cli_env, tmp_path):
    code = 3
    log = tmp_path / "train.log"
    done = _run(_EXIT_NOW, str(tmp_path / "store"), str(log), str(code), env=dict(cli_env, PYTHONWARNINGS="ignore"))
    assert done.returncode == code, done.stderr[-2000:]
    assert done.stdout == "no newlinehandler ran; group alive: False\n"
    assert log.read_text() == "epoch 1 done\n"
    assert (tmp_path / "train.log.bin").read_bytes() == b"\x00\x01"


@pytest.mark.parametrize("bad", [-1, 256, "0", 1.0, True, None])
def test_exit_now_refuses_a_bad_code_and_does_nothing(bad):
    with pytest.raises(ValueError, match=r"exit_now\(code=.*\): pass an exit status from 0 to 255"):
        exit_now(bad)


# The race behind "terminate called without an active exception" at the end of a finished job,
# made likely: the last collective's work holds 500 Python tensors, which the gloo worker thread
# releases one by one (each Py_DECREF takes the GIL) after the collective completed; with a long
# switch interval the main thread keeps the GIL and reaches interpreter finalization first, and the
# worker that then asks for the GIL is ended by CPython inside a noexcept destructor: SIGABRT. On a
# 2-core machine under load this aborted 4 runs in 6 without the library.
_RACE = """
import sys, warnings, torch, torch.distributed as dist
warnings.simplefilter("ignore")
sys.setswitchinterval(100)
{imports}
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
tensors = [torch.ones(4) for _ in range(500)]
dist.all_reduce_coalesced(tensors)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_finished_gloo_job_that_imported_the_library_never_aborts_at_exit(cli_env, tmp_path):
    env = dict(cli_env, PYTHONWARNINGS="ignore")
    outcomes = []
    for run in range(5):
        done = _run(_RACE.format(imports="import ddpdoctor.diagnostics"), str(tmp_path / f"store{run}"), env=env)
        outcomes.append((done.returncode, "terminate called" in done.stderr))
    assert outcomes == [(0, False)] * 5, outcomes


def _settles(rank, world):
    import torch
    import torch.distributed as dist

    from ddpdoctor.training import teardown

    import time

    kept = dist.group.WORLD  # as DDP keeps its group: the workers outlive destroy_process_group()
    dist.all_reduce(torch.ones(8))
    # gloo starts two worker threads; each names itself once it first runs, which on a loaded machine may
    # come after the all_reduce (one thread did all of it): wait for both names, with a deadline
    deadline = time.monotonic() + 20
    workers = teardown._gloo_workers()
    while len(workers or ()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
        workers = teardown._gloo_workers()
    return len(workers), teardown.settle_gloo_workers(deadline=30.0), kept is not None


@pytest.mark.timeout(120)
def test_gloo_workers_are_found_and_seen_idle_after_the_last_collective():
    # The exit hook's wait ends because it sees each pt_gloo_runloop thread back in its idle wait.
    assert run_world(_settles, 2, timeout=90) == [(2, True, True)] * 2
