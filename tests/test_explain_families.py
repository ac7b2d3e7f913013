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


# --- explain6 (issue 25): heldout4's and dev5's classes. Each fails on the catalogue before explain6.

BOOT = "host:7:9 [1] bootstrap.cc:150 NCCL WARN Message truncated : received 256 bytes instead of 4\n"


def test_nccl_bootstrap_truncation_is_a_family_that_a_known_release_orders():
    m = _one(BOOT)
    assert m.cause.id == "nccl-bootstrap-truncated"
    assert [c for c, _ in m.candidates][0] == "nccl-known-bug" and len(m.candidates) <= 3
    assert "NVIDIA/nccl" not in m.meaning  # no version printed: no release fact
    m = _one("NCCL version 2.19.3+cuda12.3\n" + BOOT)
    assert m.candidates[0][0] == "nccl-known-bug" and "NVIDIA/nccl#1176" in m.meaning
    assert "NVIDIA/nccl#1176" not in _one("NCCL version 2.21.5+cuda12.4\n" + BOOT).meaning
    # a collective's truncation (its transport, not the bootstrap) stays the size mismatch
    coll = "host:7:9 [1] transport/net_socket.cc:500 NCCL WARN NET/Socket : message truncated : receiving 1048576 bytes instead of 65536\n"
    assert "nccl-message-truncated" in [x.cause.id for x in explain_text(coll)]
    assert "nccl-bootstrap-truncated" not in [x.cause.id for x in explain_text(coll)]


def test_the_nccl_release_table_is_sourced_and_read_by_range():
    from ddpdoctor.causes.versions import NCCL_KNOWN_BUGS, known_nccl_bug
    import re
    for first, end, families, fact, source in NCCL_KNOWN_BUGS:
        assert first < end and families and fact and re.fullmatch(r"NVIDIA/nccl#\d+", source)
    assert "NVIDIA/nccl#1024" in known_nccl_bug(["NCCL version 2.18.1+cuda12.1"], "nccl-unhandled-cuda")
    assert known_nccl_bug(["NCCL version 2.18.6+cuda12.1"], "nccl-unhandled-cuda") == ""
    assert known_nccl_bug(["NCCL version 2.18.1+cuda12.1"], "nccl-bootstrap-truncated") == ""
    assert known_nccl_bug(["no version here"], "nccl-unhandled-cuda") == ""


def test_unhandled_cuda_error_is_a_family_ordered_by_the_release_and_the_driver():
    bare = "ncclUnhandledCudaError: Call to CUDA function failed.\n"
    m = _one(bare)
    assert m.cause.id == "nccl-unhandled-cuda" and len(m.candidates) == 3
    assert _one("NCCL version 2.18.1+cuda12.1\n" + bare).candidates[0][0] == "nccl-known-bug"
    # the driver's own message is the cause the family steps aside for
    drv = "RuntimeError: The NVIDIA driver on your system is too old (found version 11040).\n"
    assert [x.cause.id for x in explain_text(bare + drv)] == ["cuda-driver-mismatch"]


def test_a_state_dict_mismatch_is_read_by_the_keys_prefix():
    keys = ('RuntimeError: Error(s) in loading state_dict for Net:\n\tMissing key(s) in state_dict: "conv.weight", '
            '"conv.bias". \n\tUnexpected key(s) in state_dict: "{p}conv.weight", "{p}conv.bias". \n')
    assert explain_text(keys.format(p="module."))[0].cause.id == "state-dict-module-prefix"
    m = _one(keys.format(p="_orig_mod."))
    assert m.cause.id == "state-dict-mismatch" and m.candidates[0][0] == "compiled-state-dict-prefix"
    m = _one(keys.format(p="head."))
    assert m.cause.id == "state-dict-mismatch" and len(m.candidates) == 3


def test_a_timeout_with_data_that_splits_unevenly_puts_uneven_inputs_first():
    wd = ("[rank2]:[E ProcessGroupNCCL.cpp:563] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=19, "
          "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800093 milliseconds before timing out.\n")
    assert explain_text(wd)[0].candidates[0][0] != "uneven-inputs"
    m = explain_text("class Stream(torch.utils.data.IterableDataset):\n" + wd)[0]
    assert m.candidates[0][0] == "uneven-inputs" and len(m.candidates) <= 3
    assert "join" in m.candidates[0][1]
    assert _one("RuntimeError: Detected at least one rank that exhausted inputs. Throwing across all ranks.\n").cause.id \
        == "uneven-inputs"


def test_gloo_recv_timeout_is_a_family_with_uneven_inputs_among_its_readings():
    gl = "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 1800000ms for recv operation to complete\n"
    m = _one(gl)
    assert m.cause.id == "gloo-recv-timeout" and [c for c, _ in m.candidates][:2] == ["slow-rank-timeout", "uneven-inputs"]


def test_lightning_with_physical_gpu_numbers_is_its_device_index_bug():
    err = ("CUDA_VISIBLE_DEVICES=2,3 python train.py\nLOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [2,3]\n"
           "  File \"/usr/lib/python3/site-packages/pytorch_lightning/trainer/trainer.py\", line 1, in fit\n"
           "RuntimeError: CUDA error: invalid device ordinal\n")
    assert explain_text(err)[0].cause.id == "lightning-device-index-bug"
    plain = err.replace("pytorch_lightning/", "mylib/")
    assert explain_text(plain)[0].cause.id != "lightning-device-index-bug"


def test_a_notebook_and_a_multi_device_model_have_their_own_causes():
    nb = ("MisconfigurationException: `Trainer(strategy='ddp')` or `Trainer(accelerator='ddp')` is not compatible "
          "with an interactive environment. Run your code as a script\n")
    assert _one(nb).cause.id == "interactive-env-ddp"
    multi = ("ValueError: DistributedDataParallel device_ids and output_device arguments only work with single-device/"
             "multiple-device GPU modules or CPU modules, but got device_ids [0], output_device 0, and module "
             "parameters {device(type='cuda', index=0), device(type='cuda', index=1)}.\n")
    assert _one(multi).cause.id == "multi-device-module-ddp"
    cpu = multi.replace("{device(type='cuda', index=0), device(type='cuda', index=1)}", "{device(type='cpu')}")
    assert "multi-device-module-ddp" not in [x.cause.id for x in explain_text(cpu)]


def test_dev5_classes_have_their_own_causes():
    fsdp = "ValueError: Must flatten tensors with uniform requires_grad when use_orig_params=False\n"
    assert _one(fsdp).cause.id == "fsdp-mixed-requires-grad"
    spawn = ("RuntimeError:\n        An attempt has been made to start a new process before the\n"
             "        current process has finished its bootstrapping phase.\n")
    assert _one(spawn).cause.id == "spawn-main-guard"
    assert _one("AttributeError: 'ResNet' object has no attribute 'module'\n").cause.id == "module-attribute-unwrapped"
    assert _one("RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!\n").cause.id \
        == "cuda-unavailable"
    port = ("ConnectionError: Tried to launch distributed communication on port `29500`, but another process is "
            "utilizing it. Please specify a different port (such as using the `--main_process_port` flag)\n")
    assert "port-in-use" in [c for c, _ in _one(port).candidates] or _one(port).cause.id == "port-in-use"


def test_autograd_inplace_is_a_family_and_buffers_off_rules_out_the_broadcast():
    err = ("RuntimeError: one of the variables needed for gradient computation has been modified by an inplace "
           "operation: [torch.cuda.FloatTensor [512]] is at version 3; expected version 2 instead.\n")
    m = _one(err)
    assert m.cause.id == "autograd-inplace" and m.candidates[0][0] == "ddp-broadcast-buffers"
    m = _one("model = DDP(model, device_ids=[rank], broadcast_buffers=False)\n" + err)
    assert m.candidates[0][0] == "inplace-op-in-model"


def test_nccl_graph_mismatch_is_a_family_with_the_release_fact():
    g = "[7] graph/rings.cc:38 NCCL WARN Error : ring 0 does not loop back to start (13 != 15).\n"
    m = _one(g)
    assert m.cause.id == "nccl-graph-mismatch" and m.candidates[0][0] == "nccl-known-bug"
    assert "NVIDIA/nccl#1020" in _one("NCCL version 2.19.3+cuda12.3\n" + g).meaning


def test_cuda_initialization_error_in_a_dataloader_worker_is_fork():
    err = "RuntimeError: CUDA error: initialization error\n"
    m = _one(err)
    assert m.cause.id == "cuda-init-error" and len(m.candidates) == 3
    w = "RuntimeError: Caught RuntimeError in DataLoader worker process 0.\n" + err
    assert [x.cause.id for x in explain_text(w)] == ["cuda-fork"]


def test_lightnings_unused_parameter_advice_is_not_read_as_the_setting_on():
    err = ("RuntimeError: It looks like your LightningModule has parameters that were not used in producing the loss "
           "returned by training_step. If this is intentional, you must enable the detection of unused parameters in "
           "DDP, either by setting the string value `strategy='ddp_find_unused_parameters_true'` or by setting the "
           "flag in the strategy with `strategy=DDPStrategy(find_unused_parameters=True)`.\n")
    assert [x.cause.id for x in explain_text(err)] == ["ddp-unused-parameters"]


def test_an_nccl_warn_or_gloo_enforce_no_entry_reads_is_a_family_not_one_cause():
    topo = "host:1:2 [0] graph/search.cc:1135 NCCL WARN Could not find a path for pattern 1, falling back to simple order\n"
    m = _one(topo)
    assert m.cause.id == "nccl-warn" and len(m.candidates) == 3
    tcp = "RuntimeError: [../third_party/gloo/gloo/transport/uv/pair.cc:333] something odd\n"
    m = _one(tcp)
    assert m.cause.id == "gloo-enforce" and m.candidates[0][0] == "peer-closed"
    size = "RuntimeError: [enforce fail at ../third_party/gloo/gloo/allreduce.cc:12] n == 4\n"
    assert _one(size).candidates[0][0] == "gloo-size-mismatch"


def test_file_descriptors_passed_between_processes_have_their_own_cause():
    assert _one("RuntimeError: received 0 items of ancdata\n").cause.id == "fd-sharing-limit"
    tb = ('  File "/usr/lib/python3.10/multiprocessing/resource_sharer.py", line 48, in __init__\n'
          "OSError: [Errno 24] Too many open files\n")
    m = _one(tb)
    assert m.cause.id == "too-many-open-files" and m.candidates[0][0] == "fd-sharing-limit"
    assert "resource_sharer" in m.meaning
    assert _one("OSError: [Errno 24] Too many open files\n").cause.id == "too-many-open-files"


def test_barriers_guessed_gpu_is_the_cause_only_when_nothing_else_is():
    warn = ("[rank1]:[W1028 04:48:19.8 ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank 1]  using GPU 1 to perform "
            "barrier as devices used by this process are currently unknown. This can potentially cause a hang if this "
            "rank to GPU mapping is incorrect.\n")
    assert _one(warn).cause.id == "barrier-device-unknown"
    dup = "[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000\n"
    assert "barrier-device-unknown" not in [x.cause.id for x in explain_text(warn + dup)]


def test_nccls_internal_error_is_a_family_and_a_topology_file_goes_first():
    err = "ncclCommInitRank failed with error: NCCL error: internal error\n"
    m = _one(err)
    assert m.cause.id == "nccl-internal-error" and len(m.candidates) == 3
    m = _one("NCCL_TOPO_FILE=/usr/local/share/aws-ofi-nccl/xml/p5.48xl-topo.xml\n" + err)
    assert m.candidates[0][0] == "nccl-topo-file-invalid"
    # an NCCL WARN that names the subsystem says more than the bare internal error
    ib = "host:1:2 [0] transport/net_ib/connect.cc:412 NCCL WARN NET/IB : Trying to use non-existent virtual device 3\n"
    assert [x.cause.id for x in explain_text(ib + err)] == ["nccl-warn-ib"]


# --- explain7: heldout5's classes, on the wordings users paste (torch's, accelerate's and DeepSpeed's own texts) ------

def test_a_sigkilled_dataloader_worker_is_a_family_and_the_oom_killers_line_decides_it():
    # torch/utils/data/_utils/signal_handling.py's wording, as the worker's SIGKILL is reported
    killed = "RuntimeError: DataLoader worker (pid 123140) is killed by signal: Killed."
    m = _one(killed)
    assert m.cause.id == "dataloader-worker-killed"
    assert [c for c, _ in m.candidates] == ["host-oom", "too-many-dataloader-workers", "scheduler-kill"]
    assert all(how for _, how in m.candidates)
    for decisive in ("[4711.2] Out of memory: Killed process 123140 (python) total-vm:9123456kB, anon-rss:812345kB",
                     "[4711.1] python invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0",
                     "[4711.2] Memory cgroup out of memory: Killed process 123140 (python)",
                     "slurmstepd: error: Detected 1 oom_kill event in StepId=44.0. Some of your processes may have "
                     "been killed by the cgroup out-of-memory handler."):
        assert [x.cause.id for x in explain_text(killed + "\n" + decisive)] == ["host-oom"], decisive
    # the other bare SIGKILL forms stay a family too (none names host-oom alone)
    for bare in ("subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'train.py']' died with "
                 "<Signals.SIGKILL: 9>.",
                 "torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 7) of binary: "
                 "/usr/bin/python",
                 "[launch.py:324:sigkill_handler] ['/usr/bin/python', '-u', 'train.py'] exits with return code = -9"):
        assert _one(bare).candidates[0][0] == "host-oom" and len(_one(bare).candidates) == 3, bare


def test_a_connect_timeout_to_the_store_is_a_family_and_an_address_rules_out_resolution():
    # torchrun's c10d rendezvous (torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py), as pasted
    rdzv = ("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has "
            "failed. See inner exception for details.\nRuntimeError: connect() timed out. Original timeout was 60000 ms.")
    m = _one(rdzv)
    assert m.cause.id == "store-connect-timeout"
    assert [c for c, _ in m.candidates] == ["rendezvous-unreachable", "master-host-unresolved", "master-not-started"]
    for bare in ("RuntimeError: Connection timed out", "Connection timed out"):
        assert _one(bare).cause.id == "store-connect-timeout", bare
    # TCPStore's newer wording names the host: an address leaves name resolution out, a name is said
    ip = ("torch.distributed.DistNetworkError: The client socket has timed out after 600s while trying to connect to "
          "(10.1.2.3, 29500).")
    assert [c for c, _ in _one(ip).candidates] == ["rendezvous-unreachable", "master-not-started"]
    name = "torchrun --nnodes 2 --rdzv-endpoint node-a:29400 train.py\n" + rdzv
    m = _one(name)
    assert m.candidates[0][0] == "rendezvous-unreachable" and "getent hosts node-a" in m.meaning
    # a name that does not resolve at all is said by the resolver: that decides it
    gai = rdzv + "\n[W socket.cpp:601] [c10d] The IPv6 network addresses of (node-a, 29400) cannot be retrieved (gai error: -2 - Name or service not known)."
    assert [x.cause.id for x in explain_text(gai)] == ["master-host-unresolved"]


def test_tensors_on_two_devices_is_a_family_read_by_the_devices_and_the_frames():
    # ATen's check, as torch prints it and as users quote it (without "Expected", without the space)
    for text in ("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:1 "
                 "and cuda:0!",
                 "all tensors to be on the same device,but found at least two devices,cuda:1 and cuda:0"):
        m = _one(text)
        assert m.cause.id == "tensors-on-different-devices", text
        assert [c for c, _ in m.candidates] == ["module-device-mismatch", "input-on-wrong-device",
                                                "checkpoint-map-location"]
    cpu = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
    assert _one(cpu).candidates[0][0] == "input-on-wrong-device"
    old = "RuntimeError: Expected object of device type cuda but got device type cpu for argument #1 'self' in call to _th_addmm"
    assert _one(old).candidates[0][0] == "input-on-wrong-device"
    step = ('  File "/opt/venv/lib/python3.10/site-packages/torch/optim/adam.py", line 157, in step\n'
            "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cuda:0!")
    assert _one(step).candidates[0][0] == "checkpoint-map-location"


def test_a_bare_env_keyerror_with_the_frame_that_read_it_is_no_launcher_env():
    # the KeyError's message alone on its line (its name lost in the paste), then the frame reading os.environ
    text = ("'LOCAL_RANK'\n\nDuring handling of the above exception, another exception occurred:\n\n"
            '  File "/src/utils/dist_util.py", line 22, in setup_dist\n'
            '    th.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n')
    m = _one(text)
    assert m.cause.id == "no-launcher-env" and "os.environ[\"LOCAL_RANK\"]" in m.meaning
    # the quoted name alone, or with a frame reading another variable, names nothing
    assert explain_text("'LOCAL_RANK'\n") == []
    assert explain_text("'LOCAL_RANK'\n    rank = int(os.environ['RANK'])\n") == []


def test_the_fragments_users_quote_name_their_causes():
    # DeepSpeed's launcher ("exits with return code = -7") as quoted: -7 is SIGBUS, /dev/shm
    assert [m.cause.id for m in explain_text("训练退出 return code=-7")] == ["shm-too-small"]
    # the DataLoader's bus error message, quoted in part
    for text in ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
                 "memory (shm).",
                 "This might be caused by insufficient shared memory (shm).",
                 "got a bus error, insufficient shared mem (shm) it says"):
        assert [m.cause.id for m in explain_text(text)] == ["shm-too-small"], text
    # accelerate's wordings of a quantized model placed off the rank's GPU (8-bit then "8-bit or 4-bit"), and its
    # device_map='auto' check (src/accelerate/accelerator.py)
    for text in ("ValueError: You can't train a model that has been loaded in 8-bit precision on a different device "
                 "than the one you're training on.",
                 "ValueError: You can't train a model that has been loaded in 8-bit or 4-bit precision on a different "
                 "device than the one you're training on. Make sure you loaded the model on the correct device using "
                 "for example `device_map={'':torch.cuda.current_device()}`",
                 "ValueError: You can't train a model that has been loaded in 8-bit precision on multiple devices in "
                 "any distributed mode.",
                 "ValueError: You can't train a model that has been loaded with `device_map='auto'` in any distributed "
                 "mode. Please rerun your script specifying `--num_processes=1`"):
        assert [m.cause.id for m in explain_text(text)] == ["quantized-device-map"], text


def test_an_nccl_1x_release_puts_the_outdated_release_first_in_the_unhandled_cuda_family():
    log = ("# NCCL Tests compiled with NCCL 1.0\n# Using devices\n"
           "NCCL failure all_reduce.cu:95 'unhandled cuda error'\n")
    m = _one(log)
    assert m.cause.id == "nccl-unhandled-cuda"
    assert [c for c, _ in m.candidates] == ["nccl-release-outdated", "cuda-driver-mismatch", "gpu-bad-state"]
    assert "NVIDIA/nccl#91" in m.meaning
    # a current release leaves the family as it was
    new = _one("NCCL version 2.21.5+cuda12.4\ntorch.distributed.DistBackendError: NCCL error: unhandled cuda error")
    assert [c for c, _ in new.candidates] == ["cuda-driver-mismatch", "nccl-known-bug", "gpu-bad-state"]
