"""``explain`` on torch's C++ (c10d) messages as torch prints them (issue 25, the torch-cpp emitter): a message
with a known cause names it; the rest are read by the source file c10d names (the exception's "Exception raised
from FUNC at .../c10d/FILE:LINE" line, or a "[E/W... FILE:LINE]" log line) as a family with its candidates, which
stays silent when anything more specific explains the log."""

from __future__ import annotations

import pytest

from ddpdoctor.causes.matcher import explain_text

FRAME = ("[rank0]: frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f1c2b9e5897 in "
         "/usr/local/lib/python3.10/dist-packages/torch/lib/libc10.so)")


def raised(kind: str, msg: str, func: str, where: str, call: str = "dist.init_process_group('nccl')") -> str:
    """A rank's C++ exception as it reaches the log: the Python traceback, the message, c10d's location line."""
    return "\n".join([
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/work/train.py", line 41, in <module>',
        f"[rank0]:     {call}",
        f"[rank0]: {kind}: {msg}",
        f"[rank0]: Exception raised from {func} at ../torch/csrc/distributed/c10d/{where} (most recent call first):",
        FRAME, ""])


def _ids(text: str) -> list:
    return [m.cause.id for m in explain_text(text)]


SPECIFIC = [
    ("cuda-unavailable", raised("torch.distributed.DistBackendError",
                           "ProcessGroupNCCL is only supported with GPUs, no GPUs found!",
                           "ProcessGroupNCCL", "ProcessGroupNCCL.cpp:818")),
    ("collective-noncontiguous", raised("ValueError", "Tensors must be contiguous", "check_gpu_single_tensor",
                                        "ProcessGroupNCCL.cpp:3605", "dist.all_to_all_single(out, x.t())")),
    ("collective-noncontiguous", raised("RuntimeError", "input tensor has to be contiguous", "checkSingleTensor",
                                        "ProcessGroupGloo.cpp:2612", "dist.send(x[:, 0], 1)")),
    ("reduce-op-unsupported", raised("RuntimeError", "Cannot use ReduceOp.AVG with Gloo", "toFunction",
                                     "ProcessGroupGloo.cpp:145", "dist.all_reduce(t, op=dist.ReduceOp.AVG)")),
    ("reduce-op-unsupported", raised("ValueError", "Cannot use ReduceOp.BAND with NCCL", "getNcclReduceOp",
                                     "ProcessGroupNCCL.cpp:143", "dist.all_reduce(t, op=dist.ReduceOp.BAND)")),
    ("nccl-too-old-for-op", raised("RuntimeError",
                                   "ProcessGroupNCCL only supports alltoall* for NCCL lib version >= 2.7.0",
                                   "alltoall_base", "ProcessGroupNCCL.cpp:1401", "dist.all_to_all_single(o, i)")),
    ("nccl-dtype-unsupported", raised("TypeError",
                                      "Input tensor data type is not supported for NCCL process group: ComplexFloat",
                                      "getNcclDataType", "ProcessGroupNCCL.cpp:69", "dist.all_reduce(z)")),
    ("gloo-hostname-unresolved", "[W1125 02:26:31.059311 ProcessGroupGloo.cpp:727] Warning: Unable to resolve "
                                 "hostname to a (local) address. Using the loopback address as fallback. Manually "
                                 "set the network interface to bind to with GLOO_SOCKET_IFNAME. (function "
                                 "operator())\n"),
    ("gloo-hostname-unresolved", raised("RuntimeError", "Cannot resolve worker-3 to a (local) address",
                                        "createDeviceForHostname", "ProcessGroupGloo.cpp:608")),
    ("monitored-barrier-failed", raised("RuntimeError", "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in "
                                        "30000 ms", "operator()", "ProcessGroupGloo.cpp:2867",
                                        "dist.monitored_barrier(wait_all_ranks=True)")),
    ("monitored-barrier-failed", raised("RuntimeError", "ProcessGroupWrapper: Monitored Barrier encountered error "
                                        "running collective: CollectiveFingerPrint(SequenceNumber=12, "
                                        "OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float, "
                                        "TensorDeviceTypes=TensorOptions()). Error:", "runCollectiveChecks",
                                        "ProcessGroupWrapper.cpp:565", "dist.all_reduce(t)")),
    ("filestore-timeout", raised("RuntimeError", "Timeout waiting for key: /rank_1 after 1800000 ms", "get",
                                 "FileStore.cpp:424",
                                 "dist.init_process_group('gloo', init_method='file:///data/sync')")),
    ("ddp-static-graph-late", raised("RuntimeError", "set_static_graph() should be called before training loop "
                                     "starts and after DistributedDataParallel is constructed.", "set_static_graph",
                                     "reducer.cpp:2051", "model._set_static_graph()")),
]


@pytest.mark.parametrize("cid,text", SPECIFIC, ids=[f"{c}-{i}" for i, (c, _) in enumerate(SPECIFIC)])
def test_a_c10d_message_with_a_known_cause_names_it(cid, text):
    assert _ids(text) == [cid]


def test_the_monitored_barrier_is_a_family_that_names_how_to_tell():
    m = explain_text(SPECIFIC[9][1])[0]
    assert [c for c, _ in m.candidates] == ["peer-closed", "collective-mismatch", "slow-rank-timeout"]
    assert all(len(how) > 40 for _, how in m.candidates)


FAMILIES = [
    ("torch-reducer-error", raised("RuntimeError", "Expected sparse gradient to be defined.", "operator()",
                                   "reducer.cpp:459", "loss.backward()")),
    ("torch-store-error", raised("torch.distributed.DistNetworkError", "The server socket has failed to listen on "
                                 "any local network address. port: 29400, useIpv6: 0, code: -13, name: EACCES, "
                                 "message: permission denied", "listen", "TCPStore.cpp:501")),
    ("torch-store-error", "[E1226 15:44:25.497183572 socket.cpp:1011] [c10d] The server socket on [::]:29400 has "
                          "failed to accept a connection Too many open files.\n"),
    ("torch-nccl-pg-error", raised("torch.distributed.DistBackendError", "NCCL communicator was aborted on rank 3. "
                                   "Original reason for failure was: Process Group destroyed on rank 3",
                                   "getNcclComm", "NCCLUtils.cpp:48", "dist.barrier()")),
    ("torch-gloo-pg-error", raised("RuntimeError", "ProcessGroupGloo::allgather: invalid output tensor list at index "
                                   "0 (expected length 2, got 4)", "operator()", "ProcessGroupGloo.cpp:1507",
                                   "dist.all_gather(outs, t)")),
    ("torch-c10d-error", raised("RuntimeError", "Backend gloo does not support reduce_scatter", "reduce_scatter",
                                "Backend.hpp:199", "dist.reduce_scatter(out, ins)")),
    ("torch-c10d-warning", "[rank1]:[W1125 02:26:31.059000000 reducer.cpp:1400] Warning: find_unused_parameters=True "
                           "was specified in DDP constructor, but did not find any unused parameters in the forward "
                           "pass. (function operator())\n"),
]


@pytest.mark.parametrize("cid,text", FAMILIES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(FAMILIES)])
def test_the_rest_is_read_by_the_source_file_c10d_names(cid, text):
    found = explain_text(text)
    assert [m.cause.id for m in found] == [cid]
    if cid != "torch-c10d-warning":
        assert len(found[0].candidates) == 3 and all(len(how) > 40 for _, how in found[0].candidates)


def test_old_log_forms_are_read_too():
    # torch 1.x/2.0: "[E file.cpp:N]" without a timestamp, and the lib/c10d path of older builds.
    old = "[E ProcessGroupNCCL.cpp:828] [Rank 1] NCCL communicator was aborted on rank 1.\n"
    assert _ids(old) == ["torch-nccl-pg-error"]
    reason = old[:-1] + " Original reason for failure was: NCCL error: remote process exited or there was a network error\n"
    assert _ids(reason) == ["nccl-remote-error"]  # the reason it quotes is more specific: the family stays silent
    older = ("RuntimeError: Tensor list input to scatter/gather must match number of collective participants\n"
             "Exception raised from flatten_for_scatter_gather at /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:289 "
             "(most recent call first):\n")
    assert _ids(older) == ["torch-nccl-pg-error"]
    glog = ("E1125 02:26:31.059000 24546 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1234] [Rank 0] NCCL "
            "communicator was aborted on rank 0.\n")  # a glog build: no bracket, the path in full
    assert _ids(glog) == ["torch-nccl-pg-error"]
    warn = "[W reducer.cpp:1360] Warning: Grad strides do not match bucket view strides. (function operator())\n"
    assert _ids(warn) == ["torch-c10d-warning"]


def test_a_family_by_file_is_silent_when_a_specific_cause_explains_the_log():
    text = ("[rank1]:[E1122 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
            "for 600659 milliseconds before timing out.\n"
            "[rank1]:[E1122 10:00:00.000000000 ProcessGroupNCCL.cpp:670] [Rank 1] Some NCCL operations have failed "
            "or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
            "corrupted/incomplete data.\n"
            "[rank1]:[W1122 10:00:00.000000000 reducer.cpp:1400] Warning: find_unused_parameters=True was specified "
            "in DDP constructor, but did not find any unused parameters in the forward pass. (function operator())\n")
    assert _ids(text) == ["nccl-watchdog-timeout"]


def test_gloos_loopback_fallback_alone_is_a_family_never_a_confident_cause():
    # Every gloo job on a machine whose name does not resolve prints it, and on one machine it is harmless: a job
    # that failed for a reason the log does not name must not be told this warning is why.
    warning = ("[W1125 02:26:31.059311 ProcessGroupGloo.cpp:727] Warning: Unable to resolve hostname to a (local) "
               "address. Using the loopback address as fallback. Manually set the network interface to bind to with "
               "GLOO_SOCKET_IFNAME. (function operator())\n")
    (m,) = explain_text(warning)
    assert m.cause.id == "gloo-hostname-unresolved"
    assert [c for c, _ in m.candidates] == ["gloo-hostname-unresolved", "earlier-error"]
    assert "several machines" in m.candidates[0][1] and "one machine" in m.candidates[1][1]
    oom = warning + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    assert _ids(oom)[0].startswith("cuda-oom")  # the job's own error leads
