"""It works the first time: a one-GPU machine's default run, too few GPUs under NCCL, bench with one
rank, and the first-hour details (unused parameters, the OMP fix, paths, holder lines, RANK=abc).

GPU paths run against fakes at their seams (NVML through ``nvml.set_loader``; GPU counts and NCCL
availability passed to ``plan_worlds``); what only a GPU shows is in the `gpu`-marked tests at the end.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from ddpdoctor.check import RankContext
from ddpdoctor.result import Status
from ddpdoctor.runner.options import RunOptions
from ddpdoctor.runner.registry import select_checks

PY = sys.executable


# --- One GPU: every check still runs --------------------------------------------------------------

def test_one_gpu_plans_the_gpu_checks_on_nccl_and_the_multi_rank_checks_on_two_cpu_ranks():
    from ddpdoctor.runner.local import plan_worlds

    checks = select_checks((), ())
    gpu, cpu = plan_worlds(RunOptions(), checks, gpus=1, nccl_built=True)
    assert (gpu.nproc, gpu.backend, gpu.device) == (1, "nccl", "cuda")
    assert [c.name for c in gpu.checks] == ["env", "port", "process-group"]
    assert (cpu.nproc, cpu.backend, cpu.device) == (2, "gloo", "cpu")
    assert [c.name for c in cpu.checks] == ["collectives", "sampler", "param-sync", "bn-sync"]
    assert gpu.purpose == "env, port, process-group on the GPU"
    assert cpu.purpose == ("collectives, sampler, param-sync, bn-sync on CPU (1 GPU visible; NCCL across ranks "
                           "needs 1 more GPU)")


@pytest.mark.parametrize("opts,gpus,nccl,expect", [
    (RunOptions(), 2, True, [(2, "nccl")]),                      # one rank per GPU: all checks apply
    (RunOptions(), 0, True, [(2, "gloo")]),                      # no GPU: the CPU world
    (RunOptions(), 1, False, [(2, "gloo")]),                     # a GPU but a CPU torch build
    (RunOptions(backend="nccl"), 1, True, [(1, "nccl")]),        # asked for: what was asked
    (RunOptions(nproc=1), 1, True, [(1, "nccl")]),
    (RunOptions(only=["collectives"]), 1, True, [(2, "gloo")]),  # nothing for the GPU world: one world
])
def test_other_machines_and_explicit_options_keep_one_world(opts, gpus, nccl, expect):
    from ddpdoctor.runner.local import plan_worlds

    checks = select_checks(opts.only, opts.skip)
    assert [(w.nproc, w.backend) for w in plan_worlds(opts, checks, gpus=gpus, nccl_built=nccl)] == expect


@pytest.mark.timeout(120)
def test_a_run_in_two_worlds_reports_which_check_ran_where(clean_launcher_env, monkeypatch, tmp_path):
    """The real runner over the one-GPU plan; with no GPU here the GPU world's backend is gloo (the
    plan, the order, the headers and the JSON are what is under test; NCCL itself is the gpu tests')."""
    from dataclasses import replace

    from ddpdoctor.report.terminal import Style, TerminalProgress
    from ddpdoctor.runner import local

    real_plan = local.plan_worlds

    def one_gpu_plan(opts, checks, gpus=None, nccl_built=None):
        worlds = real_plan(opts, checks, gpus=1, nccl_built=True)
        return [replace(w, backend="gloo") for w in worlds]

    monkeypatch.setattr(local, "plan_worlds", one_gpu_plan)
    out = io.StringIO()
    names = [c.name for c in select_checks((), ())]
    outcome = local.run_checks(RunOptions(timeout=40), TerminalProgress(out, Style(), False, names))
    report = outcome.report
    assert outcome.exit_code == 0, out.getvalue()
    assert [r.name for r in report.results] == names
    assert all(r.status in (Status.PASS, Status.WARN) for r in report.results), out.getvalue()
    text = out.getvalue().splitlines()
    assert text[0].startswith("ddpdoctor 0.1.0: local world of 1 rank (gloo) on 1 node: env, port, process-group")
    second = next(i for i, line in enumerate(text) if line.startswith("ddpdoctor 0.1.0: local world of 2 ranks"))
    assert "collectives, sampler, param-sync, bn-sync on CPU" in text[second] and "needs 1 more GPU" in text[second]
    assert text[second + 1].split()[1] == "collectives"
    doc = report.to_dict()
    worlds = {c["name"]: (c["world"]["world_size"], c["world"]["device"]) for c in doc["checks"]}
    assert worlds == {"env": (1, "cuda"), "port": (1, "cuda"), "process-group": (1, "cuda"),
                      "collectives": (2, "cpu"), "sampler": (2, "cpu"), "param-sync": (2, "cpu"),
                      "bn-sync": (2, "cpu")}
    assert [w["world_size"] for w in doc["worlds"]] == [1, 2]
    json.dumps(doc)


# --- torchrun with more local ranks than GPUs under NCCL -----------------------------------------

def _fake_gpus(n):
    from types import SimpleNamespace

    from ddpdoctor.system import nvml

    class Fake:
        def nvmlInit(self):
            pass

        def nvmlSystemGetDriverVersion(self):
            return "550.54"

        def nvmlDeviceGetCount(self):
            return n

        def nvmlDeviceGetHandleByIndex(self, i):
            return i

        def nvmlDeviceGetName(self, h):
            return "NVIDIA H100 80GB HBM3"

        def nvmlDeviceGetUUID(self, h):
            return f"GPU-{h:04d}"

        def nvmlDeviceGetMemoryInfo(self, h):
            return SimpleNamespace(total=81559 * 2**20, used=0)

        def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
            return 0

        def nvmlDeviceGetMigMode(self, h):
            return (0, 0)

        def nvmlDeviceGetComputeRunningProcesses(self, h):
            return []

    nvml.set_loader(lambda: nvml.Nvml(Fake()))


@pytest.fixture
def one_fake_gpu(monkeypatch):
    from ddpdoctor.system import nvml

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _fake_gpus(1)
    yield
    nvml.set_loader(None)


def _ctx(backend, local_world_size, local_rank=0):
    return RankContext(rank=local_rank, world_size=local_world_size, local_rank=local_rank,
                       local_world_size=local_world_size, node_rank=0, backend=backend, timeout=5, store=None)


def test_env_fails_first_when_more_local_ranks_than_gpus_under_nccl(one_fake_gpu):
    from ddpdoctor.checks.env import EnvCheck

    out = EnvCheck().run(_ctx("nccl", 2, local_rank=1))
    assert out.status == Status.FAIL and out.finding == "too-few-gpus"
    assert out.summary.startswith("2 ranks on this node with NCCL, but 1 GPU visible")
    assert "--nproc-per-node 1" in out.hint and "gloo" in out.hint
    assert EnvCheck().run(_ctx("nccl", 1)).finding != "too-few-gpus"
    assert EnvCheck().run(_ctx("gloo", 2)).finding != "too-few-gpus"  # gloo ranks need no GPU


@pytest.mark.timeout(120)
def test_too_few_gpus_skips_the_process_group_instead_of_waiting_out_the_deadline(clean_launcher_env, monkeypatch):
    """Lockstep side: after env's too-few-gpus, nothing that needs the group runs (no timeout)."""
    from ddpdoctor.checks import env as env_mod
    from ddpdoctor.runner.local import run_checks

    real = env_mod.collect_environment

    def short_of_gpus(environ=None, local_world_size=1, backend=None):
        facts = real(environ, local_world_size, backend)
        return dict(facts, backend="nccl", visible_gpus=1)  # what a 2-rank NCCL job on one GPU sees

    monkeypatch.setattr(env_mod, "collect_environment", short_of_gpus)
    start = time.monotonic()
    out = run_checks(RunOptions(nproc=2, backend="gloo", timeout=60, only=["env", "process-group", "collectives"]))
    env, pg, coll = out.report.results
    assert env.status == Status.FAIL and env.finding == "too-few-gpus"
    assert pg.status == Status.SKIP and "more ranks per node than GPUs" in pg.summary
    assert coll.status == Status.SKIP and "more ranks per node than GPUs" in coll.summary
    assert out.exit_code == 1 and time.monotonic() - start < 50


# --- bench with one rank --------------------------------------------------------------------------

@pytest.mark.timeout(200)
def test_bench_with_one_rank_says_why_in_one_line(cli_env):
    p = subprocess.run([PY, "-m", "ddpdoctor", "bench", "--nproc", "1"], env=cli_env, capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        "error[bench-one-rank]: --nproc 1: the bandwidth table times transfers between ranks, and one rank "
        "has none; use --nproc 2 or more (with one GPU: --backend gloo --nproc 2, on CPU)"]


# --- The OMP_NUM_THREADS warning never recommends the current value -------------------------------

def _facts(**kw):
    base = {"launcher_problems": [], "launcher_conflicts": [], "shm_bytes": None, "omp_num_threads": None,
            "cpus_usable": 2, "cpus_logical": 2, "local_world_size": 1, "variables": {}, "gpus": [],
            "interfaces": {}, "hostname_addresses": [], "nodes": 1}
    return {**base, **kw}


@pytest.mark.parametrize("omp,lws,cores,fix", [
    ("4", 2, 4, "export OMP_NUM_THREADS=2"),
    ("1", 4, 2, "run at most 2 ranks per node (e.g. torchrun --nproc-per-node 2), or run where each rank has a core"),
    ("2", 4, 4, "export OMP_NUM_THREADS=1"),
])
def test_omp_warning_fix_is_never_the_current_setting(omp, lws, cores, fix):
    from ddpdoctor.checks.env import assess

    items = assess(_facts(omp_num_threads=omp, local_world_size=lws, cpus_usable=cores)).items
    (status, finding, message, hint), = [i for i in items if i[1] == "omp-oversubscribed"]
    assert status == Status.WARN and hint == fix
    assert f"OMP_NUM_THREADS={omp}" not in hint
    assert not [i for i in assess(_facts(omp_num_threads="1", local_world_size=2, cpus_usable=2)).items]


# --- Paths as the user gave them ------------------------------------------------------------------

def test_stack_paths_are_relative_to_the_cwd_when_under_it_else_as_given(tmp_path, monkeypatch):
    from ddpdoctor.system.stackframes import where_hung

    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "work" / "buggy.py"
    stack = f"""Current thread 0x00007e (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "{mine}", line 7 in step
"""
    assert where_hung(stack) == "all_reduce, called from step (work/buggy.py:7)"
    assert where_hung(stack.replace(str(mine), "/elsewhere/proj/train.py")) == \
        "all_reduce, called from step (/elsewhere/proj/train.py:7)"
    assert where_hung(stack.replace(str(mine), "rel/train.py")) == "all_reduce, called from step (rel/train.py:7)"


# --- Port holder on one line ----------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_port_holder_command_line_is_one_line(tmp_path):
    from ddpdoctor.system.ports import port_holder

    ready = tmp_path / "port"
    code = textwrap.dedent(f"""
        import socket, time
        s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
        open({str(ready)!r}, "w").write(str(s.getsockname()[1]))
        time.sleep(60)
        """)
    proc = subprocess.Popen([PY, "-c", code, "two\nlines\tand\x1b[31m"], start_new_session=True)
    try:
        deadline = time.monotonic() + 40
        while not (ready.exists() and ready.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        holder = port_holder(int(ready.read_text()))
        assert holder is not None and holder.startswith(f"pid {proc.pid} (")
        assert not any(ord(c) < 32 or ord(c) == 127 for c in holder), repr(holder)
        assert "import socket, time" in holder  # the newlines became spaces
    finally:
        proc.kill()
        proc.wait()


# --- A bad RANK is a usage error whatever else is set ---------------------------------------------

@pytest.mark.parametrize("env", [{"RANK": "abc"}, {"RANK": "abc", "WORLD_SIZE": "2"}, {"WORLD_SIZE": "two"},
                                 {"RANK": "-1", "LOCAL_RANK": "0"}])
def test_bad_rank_alone_is_caught(env):
    from ddpdoctor.training.launcher import LauncherError, detect

    with pytest.raises(LauncherError):
        detect(env, argv=[], strict=True)


# --- Real GPUs (skipped with the reason where there is none) --------------------------------------

def _skip_unless_gpus(n):
    from gpu_support import needs_gpus

    if needs_gpus(n):
        pytest.skip(needs_gpus(n))


def _gpu_python(code, cli_env, timeout=240):
    from gpu_support import gpu_env

    return subprocess.run([PY, "-c", textwrap.dedent(code)], env=gpu_env(cli_env), capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_gpu_default_check_runs_every_check(cli_env, tmp_path):
    from gpu_support import cuda_gpus, gpu_env

    _skip_unless_gpus(1)
    path = tmp_path / "r.json"
    p = subprocess.run([PY, "-m", "ddpdoctor", "check", "--json", str(path), "--timeout", "90"],
                       env=gpu_env(cli_env), capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(path.read_text())
    assert [c["status"] for c in doc["checks"]].count("skip") == 0, p.stdout
    if cuda_gpus() == 1:
        assert {c["world"]["device"] for c in doc["checks"]} == {"cuda", "cpu"}
        assert "NCCL across ranks needs 1 more GPU" in p.stdout


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_gpu_nvml_fields_are_read(cli_env):
    _skip_unless_gpus(1)
    p = _gpu_python("""
        from ddpdoctor.system import nvml
        g = nvml.load().gpus(with_processes=True)[0]
        assert g.error is None, g.error
        assert g.name and g.uuid.startswith(("GPU-", "MIG-")) and g.memory_total_mb > 0, g
        assert nvml.load().driver_version()
        print("ok", g.name)
        """, cli_env)
    assert p.returncode == 0 and p.stdout.startswith("ok"), p.stdout + p.stderr


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_gpu_load_checkpoint_lands_on_the_ranks_own_device_and_fingerprints_match(cli_env, tmp_path):
    _skip_unless_gpus(1)
    p = _gpu_python(f"""
        import os, torch, ddpdoctor as dd
        from ddpdoctor.diagnostics.desync import fingerprint
        path = {str(tmp_path / "ckpt.pt")!r}
        t = torch.arange(1000, dtype=torch.float32, device="cuda:0")
        torch.save({{"w": t}}, path)
        assert dd.load_checkpoint(path)["w"].device.type == "cpu"
        got = dd.load_checkpoint(path, map_location="rank")["w"]
        assert got.device == torch.device("cuda", 0), got.device
        assert fingerprint(t) == fingerprint(t.cpu())
        u = t.clone(); u[7] += 1
        assert fingerprint(u) != fingerprint(t)
        print("ok")
        """, cli_env)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_gpu_two_ranks_on_one_gpu_are_named(cli_env):
    """Duplicate-GPU detection: two ranks that both take GPU 0 (LOCAL_RANK=0 on each)."""
    from gpu_support import gpu_env

    _skip_unless_gpus(1)
    port = _free_port()
    procs = []
    for r in range(2):
        env = dict(gpu_env(cli_env), RANK=str(r), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="0")
        procs.append(subprocess.Popen([PY, "-m", "ddpdoctor", "check", "--backend", "nccl", "--timeout", "60",
                                       "--only", "process-group"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outs
    assert "share one GPU" in outs[0][0] or "duplicate" in outs[0][0].lower(), outs[0]


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_gpu_each_rank_gets_its_own_device(cli_env, tmp_path):
    from gpu_support import gpu_env

    _skip_unless_gpus(2)
    path = tmp_path / "r.json"
    p = subprocess.run([PY, "-m", "ddpdoctor", "check", "--backend", "nccl", "--nproc", "2", "--only",
                        "process-group", "--json", str(path), "-v"], env=gpu_env(cli_env), capture_output=True,
                       text=True, timeout=280)
    assert p.returncode == 0, p.stdout + p.stderr
    (pg,) = json.loads(path.read_text())["checks"]
    uuids = [o["data"].get("gpu_uuid") for o in pg["outcomes"]]
    assert len(set(uuids)) == 2 and None not in uuids, uuids
