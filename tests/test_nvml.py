"""NVML through a fake at the one seam (ddpdoctor.nvml.set_loader): no library, NotSupported, a lost GPU."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from ddpdoctor.system import nvml
from ddpdoctor.result import Status


class NVMLError(Exception):
    pass


class FakePynvml:
    """A scenario-driven stand-in for the pynvml module."""

    def __init__(self, gpus, driver="550.54", init_error=None):
        self._gpus = gpus
        self._driver = driver
        self._init_error = init_error

    def nvmlInit(self):
        if self._init_error:
            raise NVMLError(self._init_error)

    def nvmlSystemGetDriverVersion(self):
        return self._driver

    def nvmlDeviceGetCount(self):
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        g = self._gpus[i]
        if g.get("lost"):
            raise NVMLError("GPU is lost")
        return i

    def _field(self, i, name):
        value = self._gpus[i].get(name, "unsupported")
        if value == "unsupported":
            raise NVMLError("Not Supported")
        return value() if callable(value) else value

    def nvmlDeviceGetName(self, h):
        return self._field(h, "name")

    def nvmlDeviceGetUUID(self, h):
        return self._field(h, "uuid")

    def nvmlDeviceGetMemoryInfo(self, h):
        total, used = self._field(h, "memory")
        return SimpleNamespace(total=total * 2**20, used=used * 2**20)

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return self._field(h, "ecc")

    def nvmlDeviceGetMigMode(self, h):
        return (self._field(h, "mig"), 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=mb * 2**20) for pid, mb in self._field(h, "procs")]


GOOD = {"name": b"NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaa", "memory": (81559, 1024), "ecc": 0, "mig": 0,
        "procs": []}


@pytest.fixture
def fake_nvml():
    def install(module):
        nvml.set_loader(lambda: nvml.Nvml(module))
        return nvml.load()

    yield install
    nvml.set_loader(None)


def test_missing_library_means_zero_gpus_and_a_reason(fake_nvml):
    nvml.set_loader(lambda: nvml.Nvml(None, unavailable_reason="pynvml not importable (No module named 'pynvml')"))
    view = nvml.load()
    assert not view.available and view.device_count() == 0 and view.gpus() == []
    assert "pynvml not importable" in view.unavailable_reason
    nvml.set_loader(None)


def test_driver_not_loaded_degrades_to_no_gpus(fake_nvml):
    view = fake_nvml(FakePynvml([GOOD], init_error="Driver Not Loaded"))
    assert view.device_count() == 0 and view.unavailable_reason == "Driver Not Loaded"
    assert view.driver_version() is None


def test_not_supported_fields_are_none_and_a_lost_gpu_keeps_the_others(fake_nvml):
    partial = {"name": "Tesla T4", "uuid": "GPU-bbbb", "memory": (15360, 0)}  # no ECC, MIG, processes
    view = fake_nvml(FakePynvml([GOOD, {"lost": True}, partial]))
    gpus = view.gpus(with_processes=True)
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].memory_total_mb == 81559 and gpus[0].ecc_uncorrected == 0
    assert gpus[1].error == "GPU is lost" and gpus[1].name is None
    assert gpus[2].ecc_uncorrected is None and gpus[2].mig_enabled is None and gpus[2].processes == ()
    assert gpus[2].memory_used_mb == 0


def test_env_report_shows_n_a_and_warns_on_lost_gpu_and_ecc(fake_nvml):
    from ddpdoctor.checks.env import assess, collect_environment, describe_environment

    bad_ecc = dict(GOOD, uuid="GPU-cccc", ecc=3)
    fake_nvml(FakePynvml([GOOD, {"lost": True}, {"name": "T4", "uuid": "GPU-dddd", "memory": (15360, 0)}, bad_ecc]))
    facts = collect_environment(environ={})
    lines = describe_environment(facts)
    assert "NVIDIA driver 550.54, 4 GPU(s)" in lines
    assert "  GPU 1: unreadable (GPU is lost)" in lines
    assert "  GPU 2: T4, 0/15360 MiB, ECC uncorrected n/a, MIG n/a, GPU-dddd" in lines
    found = {(s, f) for s, f, _, _ in assess(facts).items}
    assert (Status.WARN, "gpu-unreadable") in found and (Status.WARN, "gpu-ecc-errors") in found


def test_visible_gpus_follows_cuda_visible_devices(fake_nvml):
    from ddpdoctor.system.nvml import visible_gpus

    view = fake_nvml(FakePynvml([GOOD, GOOD, GOOD, GOOD]))
    assert visible_gpus(view, {}) == 4
    assert visible_gpus(view, {"CUDA_VISIBLE_DEVICES": "1,3"}) == 2
    assert visible_gpus(view, {"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert visible_gpus(view, {"CUDA_VISIBLE_DEVICES": "-1"}) == 0


@pytest.mark.timeout(60)
def test_rank_holding_memory_on_a_foreign_gpu_is_warned_by_rank_gpu_and_megabytes(fake_nvml, clean_launcher_env):
    """The real pipeline (forked ranks, gloo) with NVML faked: each worker sees itself on GPU 1."""
    from ddpdoctor.runner.options import RunOptions
    from ddpdoctor.runner.local import run_checks

    me = dict(GOOD, uuid="GPU-eeee", procs=lambda: [(os.getpid(), 512)])
    fake_nvml(FakePynvml([GOOD, me]))
    out = run_checks(RunOptions(nproc=2, backend="gloo", timeout=20, only=["process-group"]))
    pg = out.report.results[0]
    assert pg.status == Status.WARN and pg.finding == "foreign-gpu-memory"
    assert pg.summary == "rank 0 holds 512 MiB on GPU 1, which is not its own (GPU n/a) (+1 more)"
    assert "map_location='cpu'" in pg.hint
    assert out.exit_code == 0


@pytest.mark.timeout(60)
def test_nccl_without_gpus_is_a_usage_error(fake_nvml):
    from ddpdoctor.errors import UsageError
    from ddpdoctor.runner.options import RunOptions
    from ddpdoctor.runner.local import resolve_world

    with pytest.raises(UsageError, match="--backend nccl needs GPUs, NVML found 0"):
        resolve_world(RunOptions(backend="nccl"), gpus=0, nccl_built=True)
    with pytest.raises(UsageError, match="--nproc 4 with --backend nccl needs 4 GPUs, found 2"):
        resolve_world(RunOptions(backend="nccl", nproc=4), gpus=2, nccl_built=True)
    assert resolve_world(RunOptions(), gpus=2, nccl_built=True) == (2, "nccl")
    assert resolve_world(RunOptions(), gpus=2, nccl_built=False) == (2, "gloo")
    assert resolve_world(RunOptions(), gpus=0, nccl_built=True) == (2, "gloo")


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_real_nccl_world_passes(cli_env):
    import subprocess
    import sys

    from gpu_support import cuda_gpus, gpu_env, needs_gpus

    if needs_gpus(2):
        pytest.skip(needs_gpus(2))
    p = subprocess.run([sys.executable, "-m", "ddpdoctor", "check", "--backend", "nccl", "--timeout", "60"],
                       env=gpu_env(cli_env), capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"local world of {cuda_gpus()} ranks (nccl)" in p.stdout
