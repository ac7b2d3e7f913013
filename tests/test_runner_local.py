"""The local runner end to end: real forked ranks, a real control store, real gloo worlds."""

from __future__ import annotations

import socket

import faults
import pytest

from ddpdoctor.result import Status
from ddpdoctor.runner.options import RunOptions
from ddpdoctor.runner.local import run_checks


def _line_of(text: str) -> int:
    """Line number in tests/faults.py of the first line containing ``text``."""
    with open(faults.__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def _run(**kw):
    out = run_checks(RunOptions(**kw))
    assert out.report is not None
    return out, {r.name: r for r in out.report.results}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nproc", [2, 3, 4])
def test_healthy_world_passes_with_every_rank_reported(clean_launcher_env, nproc):
    out, res = _run(nproc=nproc, timeout=20, only=["env", "port", "process-group", "collectives"])
    assert out.exit_code == 0
    assert [r for r in res] == ["env", "port", "process-group", "collectives"]
    assert all(r.status == Status.PASS for r in res.values()), [r.summary for r in res.values()]
    pg = res["process-group"]
    assert sorted(o.rank for o in pg.outcomes) == list(range(nproc))
    assert {o.data["all_reduce_result"] for o in pg.outcomes} == {float(nproc)}
    assert len({o.data["pid"] for o in pg.outcomes}) == nproc
    assert pg.summary.startswith(f"{nproc} ranks on 1 node joined in")
    assert pg.details[0].split()[:3] == ["rank", "host", "pid"] and len(pg.details) == nproc + 1
    assert sorted(o.rank for o in res["env"].outcomes) == list(range(nproc))
    assert out.report.world.arrived == tuple(range(nproc))


@pytest.mark.timeout(60)
def test_raising_check_is_a_crash_of_that_rank_and_the_run_goes_on(clean_launcher_env):
    clean_launcher_env.setenv("DDPDOCTOR_PLUGINS", "faults")
    clean_launcher_env.setenv("FAULT_RANK", "2")
    out, res = _run(nproc=3, timeout=10, only=["fault-raise", "process-group", "fault-none"])
    assert out.exit_code == 1
    r = res["fault-raise"]
    assert r.status == Status.CRASH and r.ranks == (2,)
    assert "ValueError: injected failure on rank 2" in r.summary
    assert [o.status for o in r.outcomes] == [Status.PASS, Status.PASS, Status.CRASH]
    assert any("faults.py" in line for line in r.outcomes[2].details)  # the traceback is kept
    assert res["process-group"].status == Status.PASS
    assert res["fault-none"].status == Status.PASS


@pytest.mark.timeout(60)
@pytest.mark.parametrize("check,how", [("fault-exit", "exited with code 7"), ("fault-segv", "died of SIGSEGV")])
def test_dead_rank_is_named_with_its_signal_or_code(clean_launcher_env, check, how):
    clean_launcher_env.setenv("DDPDOCTOR_PLUGINS", "faults")
    clean_launcher_env.setenv("FAULT_RANK", "1")
    out, res = _run(nproc=2, timeout=10, only=[check, "fault-none"])
    assert out.exit_code == 1
    r = res[check]
    assert r.status == Status.CRASH and r.ranks == (1,)
    dead = r.outcomes[1]
    if how == "died of SIGSEGV":
        line = _line_of("os.kill(os.getpid(), signal.SIGSEGV)")
        assert r.summary == f"rank 1 died of SIGSEGV in run (tests/faults.py:{line}) during '{check}'; rank 0 finished"
        assert "SIGSEGV received by PID" in dead.data["exit"]["text"]
        assert any("Segmentation fault" in line for line in dead.details)  # faulthandler in the log
        assert any("faults.py" in line for line in dead.details)
    else:
        assert r.summary == f"rank 1 exited with code 7 during '{check}'; rank 0 finished"
        assert "os._exit or sys.exit" in r.hint
    assert res["fault-none"].status == Status.SKIP
    assert res["fault-none"].summary == f"not run: rank 1 {how} during '{check}'"


@pytest.mark.timeout(60)
def test_hung_rank_is_reported_with_its_stack_within_the_deadline(clean_launcher_env):
    clean_launcher_env.setenv("DDPDOCTOR_PLUGINS", "faults")
    clean_launcher_env.setenv("FAULT_RANK", "1")
    import time

    t0 = time.monotonic()
    out, res = _run(nproc=3, timeout=2, only=["fault-hang", "fault-none"])
    elapsed = time.monotonic() - t0
    assert elapsed < 2 + 6, elapsed
    r = res["fault-hang"]
    assert r.status == Status.TIMEOUT and r.ranks == (1,)
    line = _line_of("time.sleep(seconds)")
    assert r.summary == f"rank 1 stuck in hang_forever (tests/faults.py:{line}); ranks 0,2 finished"
    assert any("hang_forever" in line for line in r.outcomes[1].details)
    assert res["fault-none"].summary == "not run: rank 1 hung during 'fault-hang'"


@pytest.mark.timeout(60)
def test_rank_that_skips_a_collective_leaves_the_others_stuck_in_all_reduce(clean_launcher_env):
    clean_launcher_env.setenv("DDPDOCTOR_PLUGINS", "faults")
    clean_launcher_env.setenv("FAULT_RANK", "2")
    out, res = _run(nproc=4, timeout=2, only=["fault-skip-collective"])
    r = res["fault-skip-collective"]
    assert r.status == Status.TIMEOUT and r.ranks == (0, 1, 3)
    line = _line_of("dist.all_reduce(t)")
    assert r.summary == (f"ranks 0-1,3 stuck in all_reduce, called from run (tests/faults.py:{line}); "
                         "rank 2 finished")


@pytest.mark.timeout(60)
def test_port_held_by_a_real_socket_is_named_and_the_group_is_skipped(clean_launcher_env):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        out, res = _run(nproc=2, timeout=10, master_port=port)
    finally:
        holder.close()
    assert out.exit_code == 1
    p = res["port"]
    assert p.status == Status.FAIL and p.finding == "port-in-use"
    import os

    assert p.summary.startswith(f"port {port} on 127.0.0.1 is held by pid {os.getpid()} (")
    assert "--master-port " in p.hint and "MASTER_PORT=" in p.hint
    assert res["process-group"].status == Status.SKIP
    assert "rendezvous port is not usable" in res["process-group"].summary
    assert res["env"].status == Status.PASS  # checks that need no rendezvous still ran


@pytest.mark.timeout(60)
def test_user_chosen_free_port_is_used_for_the_rendezvous(clean_launcher_env):
    from ddpdoctor.system.ports import free_port

    port = free_port()
    out, res = _run(nproc=2, timeout=10, master_port=port, only=["port", "process-group"])
    assert out.exit_code == 0
    assert res["port"].summary == f"127.0.0.1:{port} is free and bound on the master"


@pytest.mark.timeout(60)
def test_supervisor_never_initializes_cuda(clean_launcher_env):
    """The supervising process counts GPUs through NVML only; any CUDA query here would raise."""
    import torch

    def forbidden(*args, **kwargs):
        raise AssertionError("CUDA was queried by the supervising process")

    for name in ("is_available", "device_count", "init", "_lazy_init", "current_device"):
        clean_launcher_env.setattr(torch.cuda, name, forbidden)
    out, res = _run(nproc=2, timeout=20, only=["env", "port", "process-group"])
    assert out.exit_code == 0, [r.summary for r in res.values()]
    assert not torch.cuda.is_initialized()
