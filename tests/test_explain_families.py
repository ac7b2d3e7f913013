"""``explain`` on generic messages (issue 25): families of causes with how to tell them apart, the log's
evidence putting one first, signals and timeouts read with their evidence, versions read as facts, and
ddpdoctor's own errors named at the caller's line (a real 2-rank gloo world raises one)."""

from __future__ import annotations

import json

import torch

from ddpdoctor.causes.matcher import explain_text
from ddpdoctor.causes.versions import version_facts, versions_in
from ddpdoctor.postmortem.explain import render_matches
from worlds import run_world

SYSTEM = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1269, unhandled system error, NCCL version 2.14.3"


def _one(text: str):
    found = explain_text(text)
    assert len(found) == 1, [m.cause.id for m in found]
    return found[0]


def test_a_bare_generic_message_is_a_family_not_a_guess():
    m = _one(SYSTEM)
    assert m.cause.id == "nccl-system-error"
    ids = [cid for cid, _ in m.candidates]
    assert ids == ["nccl-wrong-interface", "container-network", "shm-too-small"]
    assert all(how for _, how in m.candidates)
    lines = render_matches([m], "the message")
    assert "    one of 3 causes, the likeliest first; to tell them apart:" in lines
    assert any(line.startswith("      3. shm-too-small: ") for line in lines)
    doc = m.to_dict()
    assert [c["id"] for c in doc["candidates"]] == ids and json.dumps(doc)


def test_the_logs_evidence_puts_a_candidate_first():
    shm = "host:1:2 [0] include/shm.h:48 NCCL WARN Error: failed to extend /dev/shm/nccl-x to 9637892 bytes\n"
    m = _one("host:1:2 [0] NCCL INFO shm_open failed\n" + SYSTEM)
    assert m.candidates[0][0] == "shm-too-small" and "points at shm-too-small" in m.meaning
    docker = "Bootstrap : Using eth0:172.17.0.3<0>\n"
    assert _one(docker + SYSTEM).candidates[0][0] == "container-network"
    assert [x.cause.id for x in explain_text(shm + SYSTEM)] == ["shm-too-small"]  # a specific line decides alone


def test_remote_error_read_by_its_last_error():
    ib = ("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
          "Last error:\nNET/IB : Got completion from peer 10.1.2.3<4> with error 12, opcode 0, len 0, vendor err 129\n")
    found = {m.cause.id: m for m in explain_text(ib)}
    assert "nccl-ib-network" in found  # the specific line names it alone
    sock = ("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
            "Last error:\nsocketProgress: Connection reset by peer\n")
    m = _one(sock)
    assert m.cause.id == "nccl-remote-error" and m.candidates[0][0] == "nccl-wrong-interface"
    assert _one("remote process exited or there was a network error").candidates[0][0] == "peer-closed"


WATCHDOG = ("[E ProcessGroupNCCL.cpp:485] [Rank 6] Watchdog caught collective operation timeout: "
            "WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802246 milliseconds before timing out.\n")


def test_a_timeout_with_one_ranks_long_work_names_it_and_both_fixes():
    bar = " 35%|#####     | 73811210851/208140108456 [30:01<57:14, 39115047.81B/s]\n"
    m = _one(bar + WATCHDOG)
    assert m.cause.id == "slow-rank-timeout"
    assert "30 min 01 s" in m.meaning and "raise the timeout" in m.fix and "before the distributed part" in m.fix


def test_a_training_bar_far_longer_than_the_timeout_is_not_that_evidence():
    bar = "Epoch 0:   6%|##  | 32040/500150 [6:28:43<94:39:17,  1.37it/s, loss=2.6]\n"
    m = _one(bar + WATCHDOG)
    assert m.cause.id == "nccl-watchdog-timeout"
    assert [c for c, _ in m.candidates] == ["slow-rank-timeout", "collective-mismatch", "peer-closed"]


def test_signals_read_as_causes():
    assert [m.cause.id for m in explain_text("Exits with return code = -7")] == ["shm-too-small"]
    m = _one("torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 1) of binary: python")
    assert m.cause.id == "killed-by-signal" and m.candidates[0][0] == "host-oom"


def test_versions_are_read_as_facts():
    lines = ["NCCL version 2.7.8+cuda11.0", "RuntimeError: Input tensor data type is not supported for NCCL "
             "process group: BFloat16"]
    assert versions_in(lines) == {"nccl": (2, 7, 8)}
    m = _one("\n".join(lines))
    assert m.cause.id == "nccl-bf16-unsupported" and "older than 2.10.3" in m.meaning
    facts = version_facts(["torch==2.1.0", "NCCL version 2.14.3+cuda11.7"])
    assert facts == ["torch 2.1.0's wheels bring NCCL 2.18.1, but the log shows NCCL 2.14.3: another NCCL is "
                     "loaded (a container's, LD_LIBRARY_PATH, a second nvidia-nccl wheel)."]


def _desync(rank: int, world_size: int) -> None:
    from ddpdoctor import assert_in_sync

    torch.manual_seed(rank)  # each rank initialises its own weights: out of sync
    model = torch.nn.Linear(3, 2)
    assert_in_sync(model)


def test_ddpdoctors_own_error_is_named_at_the_callers_line():
    results = run_world(_desync, 2, expect_errors=True, timeout=120)
    text = results[0][1]
    assert "DesyncError" in text
    m = _one(text)
    assert m.cause.id == "ddpdoctor-desync"
    assert "Raised by your call at _desync (" in m.meaning and "test_explain_families.py:" in m.meaning
    assert "ddpdoctor/" not in m.meaning.split("Raised by your call at")[1]


def test_an_nccl_warn_without_an_entry_is_read_by_its_source_file():
    ib = "host:1:2 [0] transport/net_ib/connect.cc:412 NCCL WARN NET/IB : Trying to use non-existent virtual device 3\n"
    m = _one(ib)
    assert m.cause.id == "nccl-warn-ib" and m.candidates[0][0] == "nccl-ib-network"
    topo = "host:1:2 [0] graph/search.cc:1135 NCCL WARN Could not find a path for pattern 1, falling back to simple order\n"
    assert _one(topo).cause.id == "nccl-warn"
    # beside a cause that explains the failure, the family by file steps aside
    both = topo + "torch.distributed.DistBackendError: NCCL error: invalid usage\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 10\n"
    assert [x.cause.id for x in explain_text(both)] == ["duplicate-gpu"]
    gloo = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.2]:1234\n"
    assert "gloo-enforce" not in [x.cause.id for x in explain_text(gloo)]  # a specific entry (peer-closed) has it


def test_an_exception_torch_distributed_raised_itself_names_the_module_and_your_call():
    tb = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 12, in main\n    model = FSDP(model)\n'
          '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/fsdp/fully_sharded_data_parallel.py", '
          'line 481, in __init__\n    raise ValueError("Expects all parameters to be on the same device")\n'
          "ValueError: Expects all parameters to be on the same device\n")
    m = _one(tb)
    assert m.cause.id == "torch-distributed-error"
    assert m.evidence == "ValueError: Expects all parameters to be on the same device"
    assert "Raised in torch.distributed.fsdp.fully_sharded_data_parallel. Your call: main (/home/u/train.py:12)." \
        in m.meaning
    # an exception of the user's own code is not torch's
    own = 'Traceback (most recent call last):\n  File "/home/u/train.py", line 3, in <module>\n    f()\nValueError: bad\n'
    assert explain_text(own) == []


def test_an_out_of_memory_on_a_ranks_own_gpu_is_a_family_and_gpu_0s_keeps_its_entry():
    # torch 2.x's wording on GPU 3, and the 1.x wording: before, neither named anything.
    for text in ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total capacity "
                 "of 79.15 GiB of which 10.56 MiB is free. Including non-PyTorch memory, this process has 79.13 GiB "
                 "memory in use.",
                 "RuntimeError: CUDA out of memory. Tried to allocate 64.00 MiB (GPU 2; 10.76 GiB total capacity; "
                 "9.60 GiB already allocated; 13.44 MiB free; 9.82 GiB reserved in total by PyTorch)"):
        m = _one(text)
        assert m.cause.id == "cuda-oom"
        assert [c for c, _ in m.candidates] == ["cuda-oom", "ranks-share-gpu", "gpu-held-by-other"]
        assert "this process has" in m.candidates[0][1] and "nvidia-smi" in m.candidates[1][1]
    assert _one("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.69 GiB total capacity)"
                ).cause.id == "cuda-oom-gpu0"
