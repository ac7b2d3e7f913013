"""``ddpdoctor explain --here``: causes confirmed or ruled out with this machine's facts.

Scenario fakes replace the one seam (:class:`ddpdoctor.causes.here.Probe`); the last tests use the
real machine: its interfaces, /dev/shm, the installed torch, and a gloo error produced for real.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from jobscripts import free_port

from ddpdoctor.causes.here import Probe, check_here, gather_facts, render_here
from ddpdoctor.causes.matcher import explain_text

CMD = [sys.executable, "-m", "ddpdoctor"]
CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "explain_corpus", "cases")


class FakeProbe(Probe):
    def __init__(self, interfaces=("lo", "eth0"), gpus=None, caps=(), shm=(65536, 65000, "1777", True), torch=None):
        self._ifs, self._gpus, self._caps, self._shm = list(interfaces), gpus, list(caps), shm
        self._torch = torch if torch is not None else {"version": "2.5.1+cu124", "cuda": "12.4",
                                                       "arch_list": ["sm_80", "sm_86", "sm_90"],
                                                       "nccl_available": True, "nccl_version": "2.21.5"}

    def hostname(self):
        return "fakehost"

    def interfaces(self):
        return self._ifs

    def gpus(self):
        return (None, [], []) if self._gpus is None else (self._gpus, ["GPU"] * self._gpus, self._caps)

    def shm(self):
        return self._shm

    def torch_info(self, attrs=()):
        info = dict(self._torch)
        info["attrs"] = {a: a in info.get("has", ()) for a in attrs}
        return info


def verdicts(text, probe):
    matches = explain_text(text)
    return {(c.cause, c.verdict) for c in check_here(matches, text, gather_facts(probe, text))}


GLOO_IF = ("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:84] ifa != nullptr. "
           "Unable to find address for: {}")
ORDINAL = "+ torchrun --nproc_per_node=8 train.py\n[rank5]: RuntimeError: CUDA error: invalid device ordinal"
DUP = ("+ torchrun --nproc_per_node=2 train.py\n[rank1]: Last error:\n[rank1]: Duplicate GPU detected : rank 1 and "
       "rank 0 both on CUDA device 1000")
SHM = "[rank0]: Error while creating shared memory segment /dev/shm/nccl-x1 (size 7340384)"
PERM = ('  File "/usr/lib/python3.10/multiprocessing/synchronize.py", line 57, in __init__\n'
        "PermissionError: [Errno 13] Permission denied")
ARCH = ("NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch installation.\n"
        "RuntimeError: CUDA error: no kernel image is available for execution on the device")


@pytest.mark.timeout(30)
def test_interface_named_in_the_log_is_checked_against_this_host():
    assert verdicts(GLOO_IF.format("ens5f0"), FakeProbe()) == {("socket-ifname-missing", "confirmed")}
    assert verdicts(GLOO_IF.format("eth0"), FakeProbe()) == {("socket-ifname-missing", "ruled out")}
    nccl = "host:1:1 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth\n" \
           "ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor AF_INET6(10)"
    assert verdicts(nccl, FakeProbe()) == {("socket-ifname-missing", "ruled out")}  # NCCL matches prefixes


@pytest.mark.timeout(30)
def test_gpu_count_decides_between_too_many_ranks_and_missing_set_device():
    assert verdicts(ORDINAL, FakeProbe(gpus=4)) == {("more-ranks-than-gpus", "confirmed")}
    assert verdicts(ORDINAL, FakeProbe(gpus=8)) == {("more-ranks-than-gpus", "ruled out")}
    assert verdicts(ORDINAL, FakeProbe(gpus=None)) == {("more-ranks-than-gpus", "unknown")}
    assert verdicts(DUP, FakeProbe(gpus=1)) == {("more-ranks-than-gpus", "confirmed")}
    assert verdicts(DUP, FakeProbe(gpus=2)) == {("more-ranks-than-gpus", "ruled out")}


@pytest.mark.timeout(30)
def test_dev_shm_size_and_permission():
    assert verdicts(SHM, FakeProbe(shm=(64, 0, "1777", True))) == {("shm-too-small", "confirmed")}
    assert verdicts(SHM, FakeProbe(shm=(32768, 32000, "1777", True))) == {("shm-too-small", "ruled out")}
    assert verdicts(PERM, FakeProbe(shm=(64, 60, "755", False))) == {("shm-permission", "confirmed")}
    assert verdicts(PERM, FakeProbe()) == {("shm-permission", "ruled out")}
    assert verdicts(PERM, FakeProbe(shm=(None, None, None, None))) == {("shm-permission", "confirmed")}


@pytest.mark.timeout(30)
def test_gpu_architecture_against_the_installed_build():
    assert verdicts(ARCH, FakeProbe(gpus=1, caps=["sm_120"])) == {("cuda-arch-unsupported", "confirmed")}
    assert verdicts(ARCH, FakeProbe(gpus=1, caps=["sm_90"])) == {("cuda-arch-unsupported", "ruled out")}
    assert verdicts(ARCH, FakeProbe(gpus=None)) == {("cuda-arch-unsupported", "unknown")}
    assert verdicts(ARCH, FakeProbe(gpus=2, caps=["sm_90", None])) == {("cuda-arch-unsupported", "ruled out")}


@pytest.mark.timeout(30)
def test_installed_torch_nccl_and_api():
    no_nccl = {"version": "2.6.0+cpu", "cuda": None, "arch_list": [], "nccl_available": False}
    text = "RuntimeError: Distributed package doesn't have NCCL built in"
    assert verdicts(text, FakeProbe(torch=no_nccl)) == {("nccl-not-built", "confirmed")}
    assert verdicts(text, FakeProbe()) == {("nccl-not-built", "ruled out")}
    api = "AttributeError: module 'torch.distributed' has no attribute 'device_mesh'"
    assert verdicts(api, FakeProbe(torch=dict(no_nccl, has=("device_mesh",)))) == {("torch-api-mismatch", "ruled out")}
    assert verdicts(api, FakeProbe(torch=no_nccl)) == {("torch-api-mismatch", "confirmed")}
    sym = f"ImportError: {sys.prefix}/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommRegister"
    assert verdicts(sym, FakeProbe()) == {("nccl-library-mismatch", "ruled out")}


@pytest.mark.timeout(30)
def test_render_says_where_it_checked_and_what_cannot_be_checked():
    probe = FakeProbe(gpus=2)
    text = "RuntimeError: No backend type associated with device type cpu"
    facts = gather_facts(probe, text)
    lines = render_here(facts, check_here(explain_text(text), text, facts))
    assert lines[0].startswith("here (fakehost; valid only if the job ran on this machine)")
    assert "GPUs: 2" in lines[1] and "/dev/shm: 65536 MB" in lines[1]
    assert lines[-1] == "  none of the causes above can be checked from here"


# --- the real machine ------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_real_probe_reads_this_machine():
    facts = gather_facts(Probe(), "")  # imports torch (its import warnings silenced) before we do
    import torch
    import torch.distributed as dist

    assert facts.hostname == socket.gethostname()
    assert "lo" in facts.interfaces and sorted(n for _, n in socket.if_nameindex()) == facts.interfaces
    st = os.statvfs("/dev/shm")
    assert facts.shm_total_mb == st.f_blocks * st.f_frsize // (1024 * 1024)
    assert facts.shm_writable == os.access("/dev/shm", os.W_OK | os.X_OK)
    assert facts.torch_version == torch.__version__
    assert facts.nccl_available == dist.is_nccl_available()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_real_gloo_error_for_a_missing_interface_is_confirmed_here(cli_env, tmp_path):
    missing = "ddpdx" + str(os.getpid() % 1000)
    assert missing not in [n for _, n in socket.if_nameindex()]
    env = dict(cli_env, GLOO_SOCKET_IFNAME=missing, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               RANK="0", WORLD_SIZE="1")
    code = "import datetime, torch.distributed as d; d.init_process_group('gloo', timeout=datetime.timedelta(seconds=10))"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=90)
    assert p.returncode != 0 and f"Unable to find address for: {missing}" in p.stderr
    log = tmp_path / "job.log"
    log.write_text(p.stderr)
    out = subprocess.run(CMD + ["explain", "--here", "--log", str(log)], env=cli_env, capture_output=True,
                         text=True, timeout=90)
    assert out.returncode == 0
    assert "- socket-ifname-missing:" in out.stdout
    assert f"socket-ifname-missing: confirmed: no interface {missing} here; this host has: " in out.stdout
    doc = json.loads(subprocess.run(CMD + ["explain", "--here", "--json", "--log", str(log)], env=cli_env,
                                    capture_output=True, text=True, timeout=90).stdout)
    assert doc["here"]["checks"] == [{"cause": "socket-ifname-missing", "verdict": "confirmed",
                                      "text": f"no interface {missing} here; this host has: "
                                              + ", ".join(doc["here"]["facts"]["interfaces"])}]
    assert "lo" in doc["here"]["facts"]["interfaces"]


@pytest.mark.timeout(120)
def test_real_machine_rules_out_a_corpus_cause(cli_env):
    """The corpus's DGX Spark case names eth0; on a host that has a different name for it, it is confirmed."""
    log = os.path.join(CASES, "039-gloo-ifname-missing-dgx-spark.log")
    out = subprocess.run(CMD + ["explain", "--here", "--log", log], env=cli_env, capture_output=True, text=True,
                         timeout=90)
    assert out.returncode == 0
    have_eth0 = any(n.startswith("eth0") for _, n in socket.if_nameindex())
    verdict = "ruled out" if have_eth0 else "confirmed"
    assert f"socket-ifname-missing: {verdict}: " in out.stdout


class _FakePynvml:
    """Just enough of pynvml for compute capability (a lost GPU and NotSupported included)."""

    def __init__(self, caps, init_error=None):
        self._caps, self._init_error = caps, init_error

    def nvmlInit(self):
        if self._init_error:
            raise RuntimeError(self._init_error)

    def nvmlDeviceGetCount(self):
        return len(self._caps)

    def nvmlDeviceGetHandleByIndex(self, i):
        if self._caps[i] == "lost":
            raise RuntimeError("GPU is lost")
        return i

    def nvmlDeviceGetName(self, h):
        return f"GPU{h}"

    def nvmlDeviceGetCudaComputeCapability(self, h):
        if self._caps[h] is None:
            raise RuntimeError("Not Supported")
        return self._caps[h]

    def __getattr__(self, name):  # every other NVML query: NotSupported
        def unsupported(*args):
            raise RuntimeError("Not Supported")
        return unsupported


@pytest.mark.timeout(30)
def test_compute_capability_comes_from_nvml_per_gpu():
    from ddpdoctor.system import nvml

    try:
        nvml.set_loader(lambda: nvml.Nvml(_FakePynvml([(9, 0), (3, 7), "lost", None])))
        view = nvml.load()
        assert [view.compute_capability(i) for i in range(4)] == [(9, 0), (3, 7), None, None]
        count, _, caps = Probe().gpus()
        assert count == 4 and caps == ["sm_90", "sm_37", None, None]
        nvml.set_loader(lambda: nvml.Nvml(_FakePynvml([(9, 0)], init_error="Driver Not Loaded")))
        assert Probe().gpus() == (None, [], [])
    finally:
        nvml.set_loader(None)


def test_nccl_versions_here_are_read_against_the_table_and_the_log():
    bf16 = "NCCL version 2.7.8+cuda11.0\nRuntimeError: Input tensor data type is not supported for NCCL process group: BFloat16"
    old = {"version": "1.8.1+cu111", "cuda": "11.1", "arch_list": ["sm_80"], "nccl_available": True, "nccl_version": "2.7.8"}
    assert verdicts(bf16, FakeProbe(torch=old)) == {("nccl-bf16-unsupported", "confirmed")}
    assert verdicts(bf16, FakeProbe()) == {("nccl-bf16-unsupported", "ruled out")}  # 2.21.5 here
    mism = "NCCL version 2.18.1+cuda12.1\nhost:1:2 [0] init.cc:1 NCCL WARN Mismatched NCCL version detected : rank 0 version 21801 rank 1 version 22105"
    assert verdicts(mism, FakeProbe()) == {("nccl-version-mismatch", "confirmed")}
