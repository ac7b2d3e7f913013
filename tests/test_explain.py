"""``ddpdoctor explain`` on messages produced by really triggering each error, and on recorded texts.

Errors that need GPUs or NCCL are recorded strings copied from PyTorch's or NCCL's source (cited
next to each); everything that can happen on CPU is produced here, in a subprocess or a torchrun job.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ddpdoctor.causes.catalogue import CAUSES
from ddpdoctor.causes.evidence import DERIVED
from ddpdoctor.causes.matcher import explain_text, first_failure
from ddpdoctor.postmortem.explain import render_matches
from jobscripts import free_port, run_job, write_train

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
CMD = [sys.executable, "-m", "ddpdoctor"]

SNIPPETS = {
    "no-pg": "import torch, torch.distributed as dist\ndist.all_reduce(torch.ones(1))\n",
    "port-in-use": (
        "import socket, datetime, torch.distributed as dist\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); port = s.getsockname()[1]\n"
        "dist.TCPStore('127.0.0.1', port, 1, True, timeout=datetime.timedelta(seconds=2))\n"),
    "connect-timeout": (
        "import datetime, torch.distributed as dist\n"
        "dist.TCPStore('127.0.0.1', {port}, 2, False, timeout=datetime.timedelta(seconds=1))\n"),
}


def ids(text):
    return [m.cause.id for m in explain_text(text)]


def _snippet(name, cli_env):
    code = SNIPPETS[name].replace("{port}", str(free_port()))
    p = subprocess.run([sys.executable, "-c", code], env=cli_env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    return p.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name,cause", [
    ("no-pg", "no-default-process-group"),
    ("port-in-use", "port-in-use"),
    ("connect-timeout", "store-connect-timeout"),  # explain7: a family; the address puts the unreachable store first
])
def test_real_single_process_errors(cli_env, name, cause):
    found = explain_text(_snippet(name, cli_env))
    assert [m.cause.id for m in found] == [cause]
    if cause == "store-connect-timeout":  # TCPStore names 127.0.0.1: an address, so no name resolution in play
        assert [c for c, _ in found[0].candidates] == ["rendezvous-unreachable", "master-not-started"]


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode,extra_env,cause,ranks", [
    ("unused", {}, "ddp-unused-parameters", {0, 1}),
    ("mismatch", {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, "collective-mismatch", {0, 1}),
    ("syncbn", {}, "syncbn-cpu", {0, 1}),
    ("model-mismatch", {}, "ddp-model-mismatch", None),
])
def test_real_torchrun_errors_name_cause_and_ranks(cli_env, tmp_path, mode, extra_env, cause, ranks):
    p = run_job(write_train(tmp_path), mode, cli_env, extra_env=extra_env)
    assert p.returncode != 0
    found = {m.cause.id: m for m in explain_text(p.stdout)}
    assert cause in found, p.stdout[-3000:]
    assert "DDP expects same model" in p.stdout or mode != "model-mismatch"
    if ranks is not None:
        assert found[cause].ranks == ranks
    assert first_failure(p.stdout).startswith("rank ")


# Recorded texts (GPU/NCCL only). Sources are cited; the text around each message is the shape
# torchrun prints it in.
RECORDED = {
    # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, WorkNCCL::checkTimeout
    "nccl-watchdog-timeout": (
        "[rank1]:[E1122 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=600000) "
        "ran for 600084 milliseconds before timing out."),
    # torch/csrc/distributed/c10d/NCCLUtils.hpp C10D_NCCL_CHECK + NCCL src/misc/shmutils.cc
    "shm-too-small": (
        "[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:275, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\n"
        "[rank0]: ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
        "device error. \n[rank0]: Last error:\n"
        "[rank0]: Error while creating shared memory segment /dev/shm/nccl-vzIpS6 (size 9637888)"),
    # the same check with a Last error that names no known cause (NCCL src/misc/shmutils.cc CUDACHECK)
    "nccl-system-error": (
        "[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:275, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\n"
        "[rank0]: ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
        "device error. \n[rank0]: Last error:\n[rank0]: Cuda failure 'invalid argument'"),
    # NCCL src/init.cc: WARN("Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx", ...)
    "duplicate-gpu": (
        "[rank1]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1970, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.19.3\n"
        "[rank1]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
        "[rank1]: Last error:\n[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000"),
    # c10/cuda/CUDACachingAllocator.cpp (the OutOfMemoryError message)
    "cuda-oom-gpu0": "\n".join(
        f"[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process "
        "has 3.12 GiB memory in use." for r in range(4)),
    # torch/csrc/distributed/c10d/ProcessGroupGloo.cpp ("Gloo connectFullMesh failed with " + what) and
    # gloo/transport/tcp/pair.cc ("connect " + peer + " failed"), on a node whose hostname is 127.0.1.1
    "gloo-connect-full-mesh": (
        "[default1]:RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/"
        "pair.cc:144] no error\n[default3]:RuntimeError: Gloo connectFullMesh failed with "
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect [127.0.1.1]:45771: Connection refused"),
}


@pytest.mark.timeout(10)
@pytest.mark.parametrize("cause", sorted(RECORDED))
def test_recorded_gpu_texts(cause):
    matches = explain_text(RECORDED[cause])
    assert [m.cause.id for m in matches] == [cause]
    m = matches[0]
    if cause == "cuda-oom-gpu0":
        assert m.ranks == {0, 1, 2, 3} and "map_location" in m.fix
    if cause == "gloo-connect-full-mesh":
        assert m.ranks == {1, 3} and "loopback" in m.meaning and "GLOO_SOCKET_IFNAME" in m.fix
    if cause == "nccl-watchdog-timeout":
        assert m.ranks == {1} and "Flight Recorder" in m.cause.confirm


@pytest.mark.timeout(10)
def test_recorded_torchrun_log_names_the_killed_rank():
    with open(os.path.join(DATA, "torchrun-sigkill-2ranks.log")) as f:
        text = f.read()
    found = {m.cause.id: m for m in explain_text(text)}
    assert found["killed-by-signal"].ranks == {1}  # rank 0's SIGTERM from torchrun is not a cause
    assert "SIGKILL" in found["killed-by-signal"].meaning and "oom" in found["killed-by-signal"].fix.lower()
    assert found["peer-closed"].ranks == {0}
    assert first_failure(text) == "rank 1 was killed by SIGKILL"


@pytest.mark.timeout(10)
def test_recorded_teardown_abort_names_the_aborted_rank_not_the_one_torchrun_stopped():
    # The README example under torchrun (torch 2.13, gloo), recorded here: rank 0 aborted at exit after
    # the job's work finished; torchrun then sent rank 1 SIGTERM. Neither is a training failure, and
    # rank 1 is no cause at all.
    with open(os.path.join(DATA, "torchrun-teardown-abort-2ranks.log")) as f:
        text = f.read()
    found = {m.cause.id: m for m in explain_text(text)}
    assert list(found) == ["teardown-abort"]  # not killed-by-signal: the SIGTERM was torchrun's own
    m = found["teardown-abort"]
    assert m.ranks == {0} and m.evidence == "terminate called without an active exception"
    assert m.meaning.startswith("The job's work finished; rank 0 aborted during interpreter teardown: a torch/gloo "
                                "exit bug, not a training failure.")
    assert m.meaning.endswith("torchrun then stopped rank 1 with SIGTERM: a consequence, not a cause.")
    assert "ddpdoctor.exit_now()" in m.fix
    assert not m.candidates  # the SIGABRT and no traceback before the line decide the family
    # A rank's own prefixed line names the rank without torchrun's summary; the line alone (no exit code, nothing
    # before it) does not decide which of the three aborts it was: a family, the exit race first.
    prefixed = explain_text("[rank3]:terminate called without an active exception\n")
    assert [(x.cause.id, x.ranks) for x in prefixed] == [("teardown-abort", {3})]
    assert [c for c, _ in prefixed[0].candidates] == ["teardown-abort", "earlier-error", "native-thread-abort"]
    assert prefixed[0].meaning.startswith("The process (rank 3) aborted in std::terminate")


@pytest.mark.timeout(10)
def test_every_cause_is_complete_and_unknown_text_says_so():
    assert len({c.id for c in CAUSES}) == len(CAUSES)
    for c in CAUSES:
        assert c.id == c.id.lower() and " " not in c.id and c.meaning and c.confirm and c.fix
        assert bool(c.patterns) != (c.id in DERIVED), c.id  # derived causes come from the evidence pass only
    assert explain_text("Segmentation fault in my own code") == []
    out = "\n".join(render_matches([], "the message"))
    assert "no known cause" in out and "ddpdoctor check" in out


@pytest.mark.timeout(60)
def test_cli_reads_text_log_and_stdin(cli_env):
    p = subprocess.run(CMD + ["explain", RECORDED["duplicate-gpu"]], env=cli_env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "- duplicate-gpu: Duplicate GPU detected: ranks sharing a GPU, one of three causes (rank 1)" in p.stdout
    p = subprocess.run(CMD + ["explain", "--log", os.path.join(DATA, "torchrun-sigkill-2ranks.log")],
                       env=cli_env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("first failure: rank 1 was killed by SIGKILL")
    p = subprocess.run(CMD + ["explain", "-"], input="all fine here\n", env=cli_env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "no known cause" in p.stdout
    p = subprocess.run(CMD + ["explain", "x", "--log", os.path.join(DATA, "torchrun-sigkill-2ranks.log")],
                       env=cli_env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error[explain-input]:") and len(p.stderr.splitlines()) == 1
