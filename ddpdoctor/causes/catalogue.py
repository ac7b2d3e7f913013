"""The catalogue of known causes: data (id, patterns, meaning, how to confirm, the fix), one entry per cause.

Read by ``ddpdoctor explain`` and by the runner. Entries are matched against the real message texts of
PyTorch, gloo and NCCL; the first entry in table order that matches a line wins, so the most specific
entries come first.

Patterns must not backtrack (explain reads logs of any size, one line at a time, lines cut to a few
KB): no ``.*`` after a prefix that can repeat on one line unless anchored at its first occurrence
(``^(?:(?!PREFIX).)*PREFIX.*...``), no unbounded class that can restart at every position
(a "[^]]*" inside brackets that can repeat: exclude the opening bracket too), bounded gaps (``.{0,200}?``).
tests/test_hostile.py times every pattern on adversarial lines built from its own fragments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CAUSES", "Cause"]

@dataclass(frozen=True)
class Cause:
    """One known cause.

    Args:
        id: stable kebab-case id.
        title: a short name.
        patterns: regexes searched in each line of the log.
        meaning: what the message means (and what it usually is not).
        confirm: the ddpdoctor command (or variable) that confirms it.
        fix: the imperative fix.
        from_ranks: match only lines that came from a rank's own process (a ``[rankN]:`` prefix, an
            ``mp.spawn`` report), i.e. from the training program rather than its launcher.
        candidates: for a generic message that several causes print alike (a family): the causes it may
            be, commonest first, each as ``(cause id, how to tell it from the others)``; ``explain`` reorders
            them when the log holds evidence and names the family, not a single cause.
        undecided: what the message means while the log does not decide the family (``meaning`` is then the
            reading the evidence settled on); empty: ``meaning`` serves both.
    """

    id: str
    title: str
    patterns: tuple
    meaning: str
    confirm: str
    fix: str
    from_ranks: bool = False
    candidates: tuple = ()
    undecided: str = ""

    def compiled(self) -> list:
        return [re.compile(p) for p in self.patterns]



CAUSES: tuple = (
    # --- Real training programs (issue 14): mp.spawn tutorials, torch.distributed.launch, DDP on CPU.
    # Kept together and first: port-in-use-in-code must win over port-in-use on the same line (it matches
    # only the program's own lines: a rank's, e.g. inside mp.spawn's report; the launcher's stay port-in-use).
    # ``{name}`` in meaning/fix is filled from the pattern's named group of the same name.
    Cause("port-in-use-in-code", "address already in use (the port the program chose)",
          (r"failed to listen on any local network address\. port: (?P<port>\d+),.*EADDRINUSE",
           r"failed to bind to \S*?:(?P<port>\d+) \(errno: 98"),
          "The rendezvous port {port} (the log shows the port the program actually used) is held by another "
          "process: a previous run that did not exit, a second job, or another user. Programs written after "
          "the mp.spawn tutorials set it in code (os.environ['MASTER_PORT'] = '{port}', or "
          "init_method='tcp://...:{port}'), so an exported MASTER_PORT does not change it.",
          "ddpdoctor check --only port --master-port {port} (names the process holding it)",
          "if the program sets port {port} in code, change it there, or read it from the environment "
          "(os.environ.setdefault('MASTER_PORT', ...)) and pass a free one; or stop the process holding {port}",
          from_ranks=True),
    Cause("ddp-syncbn-cpu", "SyncBatchNorm in a CPU model given to DDP",
          (r"SyncBatchNorm layers only work with GPU modules",),
          "DistributedDataParallel was given a model with SyncBatchNorm layers (usually from "
          "nn.SyncBatchNorm.convert_sync_batchnorm) whose parameters are on the CPU; SyncBatchNorm "
          "synchronizes statistics only for GPU modules, so DDP's constructor refuses (every rank raises).",
          "ddpdoctor check --only bn-sync (how far plain BatchNorm statistics drift across ranks on CPU)",
          "on CPU (gloo) skip convert_sync_batchnorm and keep plain BatchNorm (ddpdoctor.sync_bn_stats(model) "
          "aligns running statistics when needed); on GPUs move the model first: model.to(local_rank), then "
          "DistributedDataParallel(model, device_ids=[local_rank])"),
    Cause("gloo-size-mismatch", "ranks passed different tensor sizes to one collective",
          (r"ProcessGroupGloo::allgather: invalid tensor size",
           r"allgather: invalid tensor size",
           r"Received data size doesn't match expected size"),
          "The ranks called the same collective (all_gather, all_reduce, broadcast) with tensors of different "
          "sizes, usually an uneven last batch (the dataset does not divide by world size x batch size) or "
          "per-rank variable-length results. gloo checks sizes: a local mismatch raises, a mismatch between "
          "ranks aborts the receiving rank (SIGABRT), which is where it was noticed, not where the size differs.",
          "TORCH_DISTRIBUTED_DEBUG=DETAIL (checks each collective's shapes across ranks and names them); "
          "ddpdoctor check --only sampler",
          "give every rank the same shapes: drop_last=True on the DataLoader or DistributedSampler, pad to the "
          "largest size, or gather variable-length tensors with ddpdoctor.gather(tensor) (dim 0 may differ)"),
    # --- end of issue 14's block
    # --- issue 25: messages mined from the emitters (tests/data/emitters) and real logs from issue threads
    # (tests/data/explain_realworld). Usage errors of DDP/FSDP/accelerate and Python errors under spawn.
    Cause("library-version-mismatch", "a DDP subclass from a library older than this torch",
          (r"object has no attribute '_use_replicated_tensor_module'",),
          "A library's DistributedDataParallel subclass (mmcv's MMDistributedDataParallel and its kin) "
          "overrides DDP internals of the torch it was written for; torch 1.13 and newer call an attribute "
          "the old subclass never sets.",
          "pip list | grep -i -e mmcv -e mmengine -e torch (the library's release notes give the torch it supports)",
          "install the library release made for this torch (mmcv-full 1.7+ for torch 1.13), or the torch it "
          "was built for; patching the library's _run_ddp_forward to use self.module is the stopgap"),
    Cause("ddp-module-attribute", "an attribute of the model reached through the DDP wrapper",
          (r"'(?:\w*DistributedDataParallel|FullyShardedDataParallel|DataParallel)' object has no attribute '"
           r"(?!_|num_iterations'|reducer'|require_\w+_sync')(?P<attr>\w+)'",),
          "DistributedDataParallel (and DataParallel, FSDP) wrap the model: its own attributes and methods "
          "('{attr}') live on model.module, not on the wrapper. Code written for one GPU reaches them on the "
          "wrapper once the model is wrapped.",
          "the traceback's last line of your code names the attribute; print(type(model)) there",
          "reach it through the wrapper: model.module.{attr} (or keep a reference to the bare model before "
          "wrapping: raw = model; model = DDP(raw, ...); raw.{attr}); for saving, use model.module.state_dict()"),
    Cause("ddp-no-trainable-params", "DDP around a module with nothing to train",
          (r"DistributedDataParallel is not needed when a module doesn't have any parameter that requires a gradient",
           r"tensors\.size\(\) > 0 INTERNAL ASSERT FAILED at \S*reducer\.cpp"),
          "DistributedDataParallel was given a module none of whose parameters require a gradient (a frozen "
          "feature extractor, a loss network, a config that trains nothing in this stage). Torch 1.7+ refuses "
          "it in the constructor; older versions failed with an internal assert in the reducer.",
          "sum(p.requires_grad for p in module.parameters()) == 0 for the module passed to DDP",
          "do not wrap frozen modules: move them with .to(device) only (accelerate: keep them out of "
          "accelerator.prepare), and check that the stage's config leaves some parameters trainable"),
    Cause("ddp-static-graph", "static_graph=True with a graph that changes between iterations",
          (r"not compatible with static_graph set to True",),
          "DDP(static_graph=True) (or _set_static_graph()) records in the first iterations which parameters "
          "get gradients and how often; a later iteration used a different set (a parameter unused then used, "
          "a branch taken on some steps, forward called twice before backward).",
          "the first iterations' control flow: which modules run depends on the step or the batch",
          "drop static_graph=True / _set_static_graph() (use find_unused_parameters=True if parameters go "
          "unused), or make every iteration use the same parameters"),
    Cause("fsdp-mixed-dtype", "one FSDP unit holds parameters of different dtypes",
          (r"FlatParameter`? requires uniform dtype but got",
           r"Must flatten tensors with uniform dtype but got"),
          "FSDP flattens the parameters of each wrapped unit into one tensor, which needs one dtype; this unit "
          "mixes them (LoRA/PEFT adapters in float32 on a bfloat16 or float16 base, a module left in float32).",
          "print({p.dtype for p in unit.parameters()}) for the unit FSDP wraps",
          "cast the model to one dtype before wrapping (model.to(torch.bfloat16)) and let MixedPrecision "
          "handle compute, or pass use_orig_params=True (torch 2.1+; accelerate: fsdp_use_orig_params: true), "
          "or wrap the adapters as their own units"),
    Cause("state-dict-module-prefix", "a checkpoint saved with (or without) DDP's 'module.' prefix",
          (r'Unexpected key\(s\) in state_dict: "module\.',
           r'Missing key\(s\) in state_dict: "module\.',
           r'unexpected key "module\.'),
          "A state_dict saved from the DDP/DataParallel wrapper has every key prefixed with 'module.'; loaded "
          "into a bare model (or the other way round) every key is missing on one side and unexpected on the other.",
          "the first keys of the checkpoint: list(torch.load(path, map_location='cpu'))[:3]",
          "save model.module.state_dict() from the wrapper; to load an old checkpoint, strip the prefix: "
          "torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(sd, 'module.')"),
    Cause("quantized-device-map", "a quantized (8/4-bit) model placed across GPUs under data parallel",
          # explain7: accelerate's wordings over its releases (8-bit, then "8-bit or 4-bit"; "multiple devices", then
          # "a different device than the one you're training on"), and its device_map='auto' check
          (r"You can't train a model that has been loaded in (?:8-bit|4-bit|8-bit or 4-bit) precision on "
           r"(?:a different device|multiple devices)",
           r"You can't train a model that has been loaded with `?device_map='auto'`? in any distributed mode"),
          "The model was loaded with device_map='auto' (spread over every GPU) and then trained with one "
          "process per GPU (DDP, accelerate launch): each rank's copy must sit on that rank's GPU. A quantized "
          "model cannot be moved after loading, so the data-parallel wrapper refuses it.",
          "the from_pretrained call: device_map='auto' with load_in_8bit/4bit under a multi-process launch",
          "load each rank's copy on its own GPU: device_map={'': torch.cuda.current_device()} (accelerate: "
          "{'': accelerator.process_index}); or run one process with device_map='auto' (model parallel, no DDP)"),
    Cause("module-device-mismatch", "the wrapped model is not (only) on the device DDP or DataParallel was given",
          (r"module must have its parameters and buffers on device cuda:(?P<want>\d{1,4}) \(device_ids\[0\]\) but "
           r"found one of them on device: cuda:(?P<got>\d{1,4})",),
          "DataParallel or DistributedDataParallel was given device_ids[0] = cuda:{want} but a parameter or buffer "
          "of the model is on cuda:{got}. Two causes print it: the model is spread over several GPUs "
          "(from_pretrained(device_map='auto'), often with 8-bit or 4-bit loading) and cannot be replicated; or "
          "the model was moved to one fixed GPU (.cuda() or .to('cuda') before set_device: GPU 0) while the "
          "wrapper was given the rank's own.",
          "print({p.device for p in model.parameters()}) before wrapping; the from_pretrained call's device_map",
          "the fix of the candidate the devices point at (see the candidates)",
          candidates=(
              ("quantized-device-map", "the parameters are on several GPUs (device_ids[0] is cuda:0, one is on "
                                       "another): the model was loaded with device_map='auto'; load each rank's "
                                       "copy on its own GPU: device_map={'': local_rank}"),
              ("model-on-wrong-gpu", "the parameters are all on one other GPU (device_ids[0] is the rank's, they are "
                                     "on cuda:0): call torch.cuda.set_device(local_rank) first and move the model "
                                     "with .to(local_rank) before wrapping"))),
    # explain7: ATen's device check, the commonest device error under DDP; quoted with or without "Expected"
    Cause("tensors-on-different-devices", "one operation got tensors on two devices: one of three causes",
          (r"tensors to be on the same device,\s{0,3}but found at least two devices",
           r"Expected object of device type \w{1,12} but got device type \w{1,12}",
           r"to have the same device as tensor for argument #\d{1,3} '\w{1,40}'; but device \d{1,4} does not equal"),
          "An operation was given tensors on two devices (the message names them: two GPUs, or a GPU and the "
          "CPU). Under data parallel each rank's model, batch and every tensor it makes must be on that rank's "
          "GPU. Three things put one elsewhere: the model itself spread over GPUs (device_map='auto', a "
          "model-parallel device list), a tensor the code made or moved to another device (.cuda() or "
          "device='cuda' without set_device is GPU 0; a batch left on the CPU), or a checkpoint's optimizer state "
          "loaded onto the GPU it was saved from.",
          "print({p.device for p in model.parameters()}) and the batch's .device in each rank; the traceback's last "
          "frame of your code (forward, the loss, optimizer.step)",
          "the fix of the candidate the devices and the traceback point at (see the candidates)",
          candidates=(
              ("module-device-mismatch", "two GPUs, and the model's own parameters are on both (from_pretrained("
                                         "device_map='auto'), a device list such as [0,1], layers placed by hand) "
                                         "while data parallel gives each rank one GPU: put each rank's whole model "
                                         "on its own GPU (device_map={'': local_rank}, .to(local_rank))"),
              ("input-on-wrong-device", "the model is on one device and an input, a label or a tensor made in "
                                        "forward is on another (cuda:0 from .cuda() or device='cuda' without "
                                        "torch.cuda.set_device(local_rank), or the CPU): move it with "
                                        ".to(x.device) / .to(local_rank), and call set_device first"),
              ("checkpoint-map-location", "it fails in optimizer.step() or after resuming: torch.load put the "
                                          "saved tensors on the GPU they were saved from; load with "
                                          "map_location=f'cuda:{local_rank}' (or 'cpu')"))),
    Cause("cuda-devices-busy", "CUDA devices busy or unavailable: one of three causes",
          (r"CUDA-capable device\(s\) is/are busy or unavailable",
           r"all CUDA-capable devices are busy or unavailable"),
          "CUDA could not create a context on the GPU. The message is the same for several causes: the GPUs "
          "are in Exclusive_Process compute mode (common on shared clusters) and a second process of this job "
          "touched one (the ranks never called torch.cuda.set_device(local_rank), so all opened GPU 0, or the "
          "parent held it); the NVIDIA driver is broken or older than the CUDA the wheel was built with; or "
          "another job, or a stale process of an earlier run, holds the GPU.",
          "nvidia-smi --query-gpu=compute_mode --format=csv (Exclusive_Process?); nvidia-smi while it runs "
          "(which processes hold each GPU); python -c 'import torch; print(torch.version.cuda)' against the "
          "CUDA version nvidia-smi prints",
          "the fix of the candidate the checks point at (see the candidates)",
          candidates=(
              ("gpu-exclusive-mode", "compute mode Exclusive_Process (nvidia-smi -q | grep -i compute) and this "
                                     "job's own ranks on one GPU: call torch.cuda.set_device(local_rank) first "
                                     "thing in each rank, and no CUDA in the parent before spawning"),
              ("cuda-driver-mismatch", "it fails in a single process too, with nothing else on the GPU, and the "
                                       "driver's CUDA (nvidia-smi) is older than torch.version.cuda or the driver "
                                       "was just installed or updated: install the matching driver (or a wheel "
                                       "for the driver's CUDA), then reboot"),
              ("gpu-held-by-other-process", "nvidia-smi lists another job's (or an earlier run's stale) process on "
                                            "the GPU before this job starts: wait for it, stop it, or pick a free "
                                            "GPU with CUDA_VISIBLE_DEVICES"))),
    Cause("spawn-pickle", "spawn cannot pickle what it sends to the new process",
          (r"Can't pickle local object '",
           r"Can't pickle <(?:function|lambda)",
           r"Can't get local object '"),
          "torch.multiprocessing.spawn, DataLoader workers under the spawn start method (the default on "
          "Windows and macOS) and mp.set_start_method('spawn') send the target and its arguments to the new "
          "process by pickling (Lightning's ddp_spawn pickles the whole model and its callbacks); a function "
          "defined inside another function, a lambda or a closure cannot be pickled, nor can locks, generators, "
          "open files or views such as dict_keys held by the model, the dataset or a callback.",
          "the object named in the message: a nested function, a lambda, or the attribute holding the object",
          "define the function at module level (or use functools.partial of one), make the object picklable "
          "(list(d.keys()) for dict_keys; no locks, generators or open files as attributes), keep the entry point "
          "under if __name__ == '__main__':, or launch with torchrun (Lightning: strategy='ddp', not ddp_spawn) "
          "or the fork start method on Linux"),
    Cause("pickle-error", "an object could not be pickled: sent to a new process, or saved or copied",
          (r"cannot pickle '[\w.]{1,100}' object",
           r"can't pickle [\w.]{1,100} objects"),
          "Python could not pickle an object (a lock, a generator, dict_keys, an open file, a CUDA stream). In "
          "distributed training two things pickle: starting processes with spawn (mp.spawn, Lightning's ddp_spawn, "
          "DataLoader workers on Windows and macOS) sends the model, the dataset and their attributes to each new "
          "process; torch.save of a whole object and copy.deepcopy (an EMA copy, a callback) pickle it too.",
          "the traceback: multiprocessing's reduction.py (ForkingPickler) or spawn.py means a new process; "
          "torch/serialization.py or copy.py means a save or a copy",
          "the fix of the candidate the traceback points at (see the candidates)",
          candidates=(
              ("spawn-pickle", "the traceback goes through multiprocessing (reduction.py's ForkingPickler, "
                               "popen_spawn, spawn.py) or the job uses ddp_spawn / DataLoader workers under spawn: "
                               "make the object picklable or launch with torchrun (strategy='ddp')"),
              ("checkpoint-pickle", "the traceback goes through torch/serialization.py (torch.save) or copy.py "
                                    "(deepcopy of the model for EMA, a callback): save the state_dict, not the "
                                    "object, or drop the attribute that holds it"))),
    Cause("nvls-fabric-manager", "NVLink SHARP (NVLS) setup failed: the fabric manager",
          (r"transport/nvls\.cc:\d+ NCCL WARN Cuda failure",),
          "NCCL's NVLink SHARP transport (H100/H200/H800 with NVSwitch) could not create its multicast "
          "memory. Almost always the NVIDIA fabric manager was stopped and restarted (or updated) without "
          "resetting the GPUs, or its version does not match the driver.",
          "nvidia-smi -q | grep -A2 -i fabric (State/Status); systemctl status nvidia-fabricmanager; the "
          "fabric manager and driver versions must be equal",
          "reset the GPUs after restarting the fabric manager (or reboot the node), per the Fabric Manager "
          "User Guide; NCCL_NVLS_ENABLE=0 works around it meanwhile"),
    Cause("ib-memlock", "the locked-memory limit is too low for InfiniBand",
          (r"NCCL WARN Call to ibv_(?:reg_mr\w*|create_cq|create_qp) failed with error Cannot allocate memory",
           r"ibv_create_cq\(\) failed: Cannot allocate memory"),
          "InfiniBand registers (pins) memory; the process's locked-memory limit (ulimit -l, often 64 KB in "
          "containers and under some schedulers) is too low, so registration fails with ENOMEM.",
          "ulimit -l in the job's own environment (inside mpirun/srun/the container), not in a login shell",
          "raise it to unlimited: /etc/security/limits.conf (memlock), docker run --ulimit memlock=-1, "
          "Slurm PropagateResourceLimits; then start a new session"),
    Cause("nccl-bf16-unsupported", "bfloat16 collectives with an NCCL too old for them",
          (r"Input tensor data type is not supported for NCCL process group: BFloat16",
           r"Unconvertible NCCL type BFloat16"),
          "NCCL added bfloat16 in 2.10.3 (July 2021), and PyTorch passes bf16 to NCCL only when it was built "
          "with 2.10+. An older NCCL (or a torch built against one) refuses bfloat16 tensors.",
          "python -c 'import torch; print(torch.__version__, torch.cuda.nccl.version())'; the log's "
          "'NCCL version' line",
          "install a PyTorch built with NCCL 2.10.3 or newer (1.10+ wheels), or reduce in float32"),
    Cause("nccl-version-mismatch", "the ranks run different NCCL versions",
          (r"Mismatched NCCL version detected",),
          "NCCL compared versions at start-up and the ranks differ: nodes with different images, wheels or a "
          "system NCCL on some nodes' LD_LIBRARY_PATH.",
          "python -c 'import torch; print(torch.cuda.nccl.version())' on every node; the 'NCCL version' line "
          "each rank prints with NCCL_DEBUG=INFO",
          "install the same torch/NCCL on every node (one image, one wheel), and drop a stray libnccl from "
          "LD_LIBRARY_PATH"),
    # --- explain6 (issue 25, after heldout4 was seen): classes behind its misses. Kept together; each family
    # says how to tell its candidates apart, and evidence.py / versions.py decide or reorder them.
    Cause("nccl-bootstrap-truncated", "NCCL's bootstrap received a message of the wrong size",
          (r"bootstrap\.cc:\d{1,9} NCCL WARN (?:NET/Socket : )?[Mm]essage truncated",),
          "NCCL's bootstrap (the socket ring the ranks use at communicator creation to exchange addresses and "
          "connection handles, before any collective) received a message of another size than it expected. "
          "These are NCCL's own fixed-size messages, not your tensors: a size mismatch here is NCCL itself (a "
          "release with a bootstrap bug, such as 2.19.3), ranks running different NCCL versions, or a foreign "
          "connection to the bootstrap port.",
          "the 'NCCL version' line each rank prints with NCCL_DEBUG=INFO (the same on every rank? a release with "
          "a known bootstrap bug?); python -c 'import torch; print(torch.cuda.nccl.version())' on every node",
          "the fix of the candidate the versions point at (see the candidates)",
          candidates=(
              ("nccl-known-bug", "intermittent, at start-up, with the same NCCL everywhere: a bootstrap bug of that "
                                 "release (2.19.3: NVIDIA/nccl#1176, fixed by moving to 2.18.6); install another "
                                 "NCCL release (a torch wheel or container with another NCCL, or LD_PRELOAD one)"),
              ("nccl-version-mismatch", "the ranks' 'NCCL version' lines differ (nodes with different images or "
                                        "wheels): install the same NCCL everywhere"),
              ("port-in-use", "another program connects to the ranks' bootstrap ports (a port scanner, a second job "
                              "on the same ports): NCCL_DEBUG=INFO's 'Bootstrap : Using' address; keep the job's "
                              "ports private"))),
    Cause("nccl-unhandled-cuda", "NCCL's CUDA call failed (unhandled cuda error): one of three causes",
          (r"ncclUnhandledCudaError", r"unhandled cuda error"),
          "A CUDA call made inside NCCL failed and NCCL returned ncclUnhandledCudaError. The message is the same "
          "for several causes: the driver does not fit the CUDA the wheel (or NCCL) was built for; a bug of the "
          "NCCL release in use (2.18 before 2.18.6 had one: NVIDIA/nccl#1024); or the GPU or the GPUs' "
          "peer-to-peer path is in a bad state. With NCCL_DEBUG=INFO, NCCL prints the failing call and the CUDA "
          "error ('Cuda failure N ...') just above.",
          "rerun with NCCL_DEBUG=INFO: the 'Cuda failure' WARN names the CUDA error; nvidia-smi (driver) against "
          "python -c 'import torch; print(torch.version.cuda, torch.cuda.nccl.version())'",
          "the fix of the candidate the CUDA error and the versions point at (see the candidates)",
          candidates=(
              ("cuda-driver-mismatch", "'driver version is insufficient', 'initialization error', or nvidia-smi's "
                                       "CUDA older than torch.version.cuda: update the driver or install a wheel "
                                       "for the driver's CUDA"),
              ("nccl-known-bug", "the log's NCCL version is a release with a known bug (2.18.x before 2.18.6: "
                                 "NVIDIA/nccl#1024): install a torch or NCCL with a fixed release (pip install "
                                 "nvidia-nccl-cu12 of a newer release, or a newer torch)"),
              ("gpu-bad-state", "'illegal memory access', 'unspecified launch failure', Xid errors in dmesg, or it "
                                "passes with NCCL_P2P_DISABLE=1 (a broken peer-to-peer path, common on consumer "
                                "GPUs and some VMs): reset the GPU, or keep NCCL_P2P_DISABLE=1"))),
    Cause("state-dict-mismatch", "a checkpoint's keys do not fit the model: one of three causes",
          (r"Missing key\(s\) in state_dict", r"Unexpected key\(s\) in state_dict"),
          "load_state_dict found keys the model does not have, or lacks keys it has. The message is the same "
          "for several causes: the checkpoint was saved from the DDP or DataParallel wrapper (every key starts "
          "with 'module.'), saved from a torch.compile'd model (keys start with '_orig_mod.'), or it belongs to "
          "another architecture or configuration.",
          "the first keys on each side: list(torch.load(path, map_location='cpu'))[:3] against "
          "list(model.state_dict())[:3]",
          "the fix of the candidate the keys point at (see the candidates)",
          candidates=(
              ("state-dict-module-prefix", "the checkpoint's keys start with 'module.' and the model's do not (or the "
                                           "other way round): save model.module.state_dict(); strip the prefix "
                                           "with consume_prefix_in_state_dict_if_present(sd, 'module.')"),
              ("compiled-state-dict-prefix", "the keys start with '_orig_mod.': the model was torch.compile'd when "
                                             "saved; save model._orig_mod.state_dict() or strip '_orig_mod.'"),
              ("checkpoint-model-mismatch", "the names differ beyond a prefix, or 'size mismatch for' lines follow: "
                                            "another model or config; load the matching config or checkpoint"))),
    Cause("interactive-env-ddp", "a multi-process strategy started from a notebook (interactive environment)",
          (r"is not compatible with an interactive environment",),
          "The trainer was asked (or chose by itself, with devices or accelerator 'auto' on a machine with several "
          "GPUs) for a strategy that starts processes the way a script does (ddp, ddp_spawn), from Jupyter, "
          "Colab or an IPython shell: a notebook cannot be re-launched per rank, and spawn cannot pickle what "
          "the notebook defines.",
          "the log comes from a notebook; Trainer(...) without strategy, or with strategy='ddp'/'ddp_spawn'",
          "run the code as a script (torchrun / python train.py), or in the notebook use strategy='ddp_notebook' "
          "(Lightning 1.7+, a fork-based DDP), or one device (devices=1)"),
    Cause("multi-device-module-ddp", "DDP given a model spread over several GPUs: one of two causes",
          # not for a CPU model (the message then ends "module parameters {device(type='cpu')}": cpu-tensor-nccl)
          (r"device_ids and output_device arguments only work with single-device"
           r"(?!.{0,400}?module parameters \{device\(type='cpu'\)\})",),
          "DistributedDataParallel was given device_ids for a model whose parameters are on several GPUs (loaded "
          "with device_map='auto', or split by hand). Two readings: one process was meant (model parallelism over "
          "the GPUs) but a launcher started DDP because it saw several GPUs (accelerate or the transformers "
          "Trainer under accelerate launch, a config with several processes); or one process per GPU was meant "
          "and each rank's copy should sit on its own GPU.",
          "how many processes the launcher started (accelerate's 'Num processes', 'Distributed environment'); "
          "the from_pretrained call's device_map",
          "the fix of the candidate that fits what was meant (see the candidates)",
          candidates=(
              ("accelerate-multi-gpu-one-process", "one process was meant (device_map='auto' over the GPUs): start "
                                                   "one plain process (python train.py; accelerate config with "
                                                   "distributed_type NO, or --num_processes 1 on an accelerate "
                                                   "release that honours it), not a multi-GPU launch"),
              ("quantized-device-map", "a process per GPU was meant: load each rank's copy on its own GPU "
                                       "(device_map={'': local_rank}) instead of device_map='auto'"))),
    Cause("uneven-inputs", "the ranks ran out of data at different steps (uneven inputs)",
          (r"Detected at least one rank that exhausted inputs",),
          "The ranks did not get the same number of batches (an IterableDataset or a sampler that does not split "
          "the data evenly, a dataset filtered per rank, a last batch dropped on some ranks only): the rank with "
          "fewer stops issuing DDP's collectives while the others wait in theirs, until the timeout (or DDP's "
          "join() with throw_on_early_termination raises).",
          "print len(dataloader) (or count the batches) on every rank; ddpdoctor check --only sampler",
          "give every rank the same number of batches (DistributedSampler with drop_last=True; for an "
          "IterableDataset split the shards evenly and stop all ranks at the shortest), or wrap the loop in "
          "DDP's join context manager: with model.join(): (torch.distributed.algorithms.Join)"),
    Cause("gloo-recv-timeout", "a gloo collective waited past its timeout for a peer's data",
          (r"Timed out waiting \d{1,18}ms for (?:recv|send) operation to complete",),
          "A gloo collective (all_reduce, broadcast, barrier on a gloo process group, CPU training) waited for "
          "a peer's data longer than the process group timeout (30 minutes by default). The peer is somewhere "
          "else: busy with work of its own, out of data while this rank still has batches, or gone (an error, "
          "a kill by the host's OOM killer).",
          "the other ranks' last lines (a progress line, an error, nothing at all); len(dataloader) on every rank; "
          "dmesg -T | grep -i -e oom -e killed on the nodes",
          "the fix of the candidate the other ranks' lines point at (see the candidates)",
          candidates=(
              ("slow-rank-timeout", "a rank was busy in work of its own (evaluation, saving, preprocessing) as long "
                                    "as the timeout: raise timeout= in init_process_group or move the work"),
              ("uneven-inputs", "the ranks have different numbers of batches (an IterableDataset, an uneven "
                                "split): the rank with fewer stopped first; equal batches or DDP's join()"),
              ("peer-closed", "a rank died first (its error, or no line at all from it: an OOM kill leaves none; "
                              "dmesg shows it): fix that rank"))),
    Cause("lightning-device-index-bug", "Lightning used a GPU's physical number where CUDA renumbers them",
          (),
          "CUDA_VISIBLE_DEVICES (or Lightning's gpus='6,7') made the GPUs listed visible as cuda:0, cuda:1, ...; "
          "Lightning's DDP of that time passed the physical number (6) to torch.cuda.set_device, which asks for a "
          "device that does not exist in the renumbered list: invalid device ordinal. A Lightning bug "
          "(Lightning-AI/pytorch-lightning#1540, #2407, fixed by PR #2739), not too many processes.",
          "the log's visible GPUs (VISIBLE GPUS / CUDA_VISIBLE_DEVICES) do not start at 0, and the traceback goes "
          "through pytorch_lightning; pip show pytorch-lightning",
          "upgrade Lightning; meanwhile select GPUs by count (gpus=2) after exporting CUDA_VISIBLE_DEVICES=6,7, "
          "rather than naming the physical ids to Lightning"),
    # explain6, after dev5 was scored (tests/data/explain_realworld/dev5): its classes.
    Cause("fsdp-mixed-requires-grad", "one FSDP unit mixes frozen and trainable parameters",
          (r"FlatParameter`? requires uniform `?requires_grad",
           r"Must flatten tensors with uniform `?requires_grad"),
          "FSDP (with use_orig_params=False) flattens the parameters of each wrapped unit into one FlatParameter, "
          "which has one requires_grad; this unit holds frozen and trainable parameters together (LoRA/PEFT adapters "
          "on a frozen base, a frozen encoder inside a trained block, layers frozen before wrapping).",
          "{p.requires_grad for p in unit.parameters()} for each unit the auto-wrap policy makes",
          "pass use_orig_params=True (torch 2.1+; accelerate: fsdp_use_orig_params: true), or wrap the frozen and "
          "the trainable parameters in separate FSDP units (an auto-wrap policy that wraps the trainable layers on "
          "their own), or freeze parameters after wrapping"),
    Cause("spawn-main-guard", "a new process started while the main module was still being imported (spawn)",
          (r"An attempt has been made to start a new process before the",),
          "Under the spawn start method (the default on Windows and macOS; mp.spawn, DataLoader workers with "
          "num_workers > 0, accelerate's notebook launcher) every child process re-imports the main script. Code "
          "at module level that starts processes (the training loop, iterating a DataLoader) runs again in the child "
          "before the child has finished starting, and multiprocessing refuses.",
          "the script starts training or iterates a DataLoader at module level, with no if __name__ == '__main__': guard",
          "put the entry point under if __name__ == '__main__': (define main() and call it there); num_workers=0 "
          "avoids the child processes as a stopgap"),
    Cause("module-attribute-unwrapped", "'.module' reached on a model that is not wrapped (DDP/DataParallel)",
          (r"'(?!\w{0,60}DataParallel')(?P<cls>\w{1,100})' object has no attribute 'module'",),
          "The code reaches the model through .module, which only the DataParallel/DistributedDataParallel wrapper "
          "has; here the model ('{cls}') is not wrapped: a script written for multi-GPU training run on one GPU or "
          "without its launcher (the wrapping is skipped), or a copy of the model (EMA, a loaded checkpoint) that "
          "was never wrapped.",
          "where the model is wrapped: the condition (GPU count, --launcher, distributed flag) that skips the wrapping",
          "unwrap only when wrapped: m = model.module if hasattr(model, 'module') else model; or keep the wrapper on "
          "one GPU as the project expects (DataParallel works with one GPU), or run with the launcher it expects"),
    Cause("autograd-inplace", "a tensor autograd saved was modified in place: DDP's buffer broadcast, or the model's own code",
          (r"one of the variables needed for gradient computation has been modified by an inplace operation",),
          "Backward needs a tensor that was changed in place after the forward that used it. Under "
          "DistributedDataParallel this is usually DDP itself: with broadcast_buffers=True (the default) every "
          "forward copies rank 0's buffers (BatchNorm running statistics, registered masks or position ids) into "
          "place, so a second forward before backward (GAN discriminator and generator passes, two views, an EMA "
          "or evaluation pass) or a buffer the model updates in place invalidates what the first forward saved. "
          "Outside DDP it is an in-place operation in the model (ReLU(inplace=True), +=, indexing assignment).",
          "does it fail in a single process too? the tensor the message names ([torch.cuda.FloatTensor [N]] "
          "is at version k): a buffer or an activation; torch.autograd.set_detect_anomaly(True) names the op",
          "the fix of the candidate the checks point at (see the candidates)",
          candidates=(
              ("ddp-broadcast-buffers", "it works in a single process and fails under DDP, the model has buffers "
                                        "(BatchNorm, register_buffer) and calls forward more than once per backward: "
                                        "DistributedDataParallel(..., broadcast_buffers=False), or SyncBatchNorm, or "
                                        "one forward per backward"),
              ("inplace-op-in-model", "it fails in a single process too: anomaly detection names an in-place op in "
                                      "the model (ReLU(inplace=True), x += y, x[idx] = ...); make it out of place "
                                      "(x = x + y) or clone() the tensor first"))),
    Cause("nccl-graph-mismatch", "the ranks computed different NCCL rings or trees",
          (r"NCCL WARN Error : (?:ring|tree) \d{1,9} does not loop back to start",),
          "NCCL's topology search on each rank produced a ring (or tree) that does not close: the ranks disagree on "
          "the graph. With the same NCCL and settings everywhere that is NCCL itself (a release's bug, such as the "
          "uninitialized PCI link speeds of 2.19); otherwise the ranks run different NCCL versions or NCCL_* "
          "settings, or see different topologies (containers or VMs that hide /sys).",
          "the 'NCCL version' line and the NCCL_* variables on every rank (NCCL_DEBUG=INFO); "
          "NCCL_DEBUG_SUBSYS=GRAPH,INIT and NCCL_TOPO_DUMP_FILE on two nodes to compare",
          "the fix of the candidate the versions and settings point at (see the candidates)",
          candidates=(
              ("nccl-known-bug", "the same NCCL release and settings on every rank: a bug of that release (2.19.x: "
                                 "fixed in 2.20, NVIDIA/nccl#1020); install another NCCL release"),
              ("nccl-version-mismatch", "the ranks' NCCL versions or NCCL_* settings (NCCL_ALGO, NCCL_HOSTID, "
                                        "NCCL_TOPO_FILE) differ: make them identical"),
              ("nccl-topology-hidden", "containers or VMs where NCCL cannot read the PCI topology (/sys): mount "
                                       "/sys or give NCCL_TOPO_FILE"))),
    Cause("cuda-init-error", "CUDA initialization error: a forked process, or the driver",
          (r"CUDA error: initialization error",
           r"[Cc]uda (?:runtime )?error \(3\) ?: initialization error"),
          "CUDA could not be initialized in this process. The message is the same for several causes: a process "
          "forked after the parent used CUDA (DataLoader workers with num_workers > 0 whose dataset, collate_fn or "
          "a CUDA default tensor type touches the GPU) cannot initialize CUDA again; or the NVIDIA driver is missing, "
          "broken or was updated without a reboot.",
          "the traceback: a DataLoader worker (worker.py, _worker_loop) or a forked Process means the fork; the main "
          "process at its first CUDA call means the driver (nvidia-smi)",
          "the fix of the candidate the traceback points at (see the candidates)",
          candidates=(
              ("cuda-fork", "the error comes from a DataLoader worker or another forked process: keep CUDA out of the "
                            "dataset, collate_fn and default tensor type (move batches to the GPU in the training loop), "
                            "or start workers with spawn (multiprocessing_context='spawn')"),
              ("cuda-driver-mismatch", "the main process fails at its first CUDA call: nvidia-smi fails or shows a "
                                       "driver older than torch.version.cuda, or the driver was just updated: "
                                       "reinstall the driver or reboot"),
              ("cuda-unavailable", "in a container or job without the GPU devices (docker --gpus, the scheduler's GPU "
                                   "request): torch.cuda.is_available() is False there"))),
    Cause("cuda-unavailable", "NCCL asked for, but this process sees no GPU",
          (r"ProcessGroupNCCL is only supported with GPUs, no GPUs found",),
          "backend='nccl' was requested in a process where torch sees no CUDA device (torch.cuda.device_count() is "
          "0): a CPU-only torch build, an NVIDIA driver that is missing or does not fit the build, "
          "CUDA_VISIBLE_DEVICES set to nothing or to GPUs that do not exist, or a container or job started without "
          "its GPUs.",
          "python -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())'; "
          "nvidia-smi; echo $CUDA_VISIBLE_DEVICES",
          "install a CUDA build of torch that fits the driver (torch.version.cuda must not be None), make the GPUs "
          "visible (CUDA_VISIBLE_DEVICES, docker --gpus all, the scheduler's GPU request), or use backend='gloo' on "
          "a machine without GPUs"),
    # explain6, after dev5's late threads were scored: file descriptors passed between processes, barrier's guessed
    # GPU, NCCL's internal error.
    Cause("fd-sharing-limit", "DataLoader workers ran out of file descriptors passing tensors (file_descriptor sharing)",
          (r"received \d{1,9} items of ancdata", r"received %d items of ancdata"),
          "torch.multiprocessing passes each tensor a DataLoader worker returns as an open file descriptor (the "
          "default file_descriptor sharing strategy on Linux); with many workers, large prefetching or tensors kept "
          "alive, the process hits its open-files limit (ulimit -n) and the descriptor cannot be received.",
          "ulimit -n inside the job; ls /proc/<pid>/fd | wc -l while it runs; whether fewer workers make it go away",
          "torch.multiprocessing.set_sharing_strategy('file_system') at the top of the script (and in each worker "
          "via worker_init_fn if needed), or raise ulimit -n, or use fewer DataLoader workers"),
    Cause("too-many-open-files", "a process hit its open-files limit (Errno 24): one of two causes",
          (r"\[Errno 24\] Too many open files",),
          "The process reached its limit of open file descriptors (ulimit -n). In training jobs that is most often "
          "DataLoader workers passing tensors as descriptors (torch.multiprocessing's file_descriptor strategy); "
          "otherwise the process's own files and sockets (many ranks' connections, open dataset files) outgrew a "
          "low limit.",
          "ulimit -n inside the job; ls /proc/<pid>/fd | wc -l; the traceback's frames (multiprocessing's "
          "resource_sharer or torch/multiprocessing/reductions.py: the DataLoader's descriptors)",
          "the fix of the candidate the traceback points at (see the candidates)",
          candidates=(
              ("fd-sharing-limit", "multiprocessing's resource_sharer, reduction or torch/multiprocessing/reductions.py "
                                   "in the traceback, or DataLoader workers: "
                                   "torch.multiprocessing.set_sharing_strategy('file_system'), fewer workers, or a "
                                   "higher ulimit -n"),
              ("fd-limit-low", "no DataLoader in the traceback: the process's own files or sockets outgrew ulimit -n; "
                               "raise it (ulimit -n 65535, LimitNOFILE for a service, the container's nofile) or "
                               "close what is left open"))),
    Cause("barrier-device-unknown", "NCCL's barrier guessed which GPU to use (the rank's device was never given)",
          (r"to perform barrier as devices used by this process are currently unknown",),
          "ProcessGroupNCCL had to pick a GPU for barrier() on its own (global rank modulo the GPU count) because the "
          "process had not told it its device: no device_id= to init_process_group, no barrier(device_ids=...), "
          "and no collective before. When the guess is not the GPU the rank uses (CUDA_VISIBLE_DEVICES, "
          "torch.cuda.set_device called later or not at all, ranks of several nodes), two ranks end up on one GPU "
          "or on different GPUs than their communicators: the barrier hangs or NCCL fails. Alone it is a warning: "
          "it is the cause when the job then hung at a barrier or failed with an NCCL error.",
          "the rank-to-GPU mapping: print(rank, local_rank, torch.cuda.current_device()) before the barrier",
          "call torch.cuda.set_device(local_rank) before init_process_group and pass "
          "device_id=torch.device('cuda', local_rank) to init_process_group (torch 2.3 and later), or "
          "dist.barrier(device_ids=[local_rank])"),
    Cause("nccl-internal-error", "NCCL's internal error: one of three causes",
          (r"NCCL error:? internal error", r"ncclInternalError", r"internal error - please report this issue to the "
                                                                 r"NCCL developers"),
          "NCCL reported an internal check that failed (ncclInternalError). The message names no cause of its own: "
          "a bug of the NCCL release, a topology NCCL was given that it cannot use (a malformed or mismatched "
          "NCCL_TOPO_FILE, such as a cloud image's topology XML), or ranks running different NCCL releases.",
          "rerun with NCCL_DEBUG=INFO (NCCL_DEBUG=WARN shows the failing check; with NCCL 2.18 the first WARN line is "
          "the real error); echo $NCCL_TOPO_FILE; torch.cuda.nccl.version() on every node",
          "the fix of the candidate the NCCL_DEBUG lines point at (see the candidates)",
          candidates=(
              ("nccl-known-bug", "the WARN before it is about NCCL's own state, the same on every rank: a bug of the "
                                 "release; try another NCCL (a newer nvidia-nccl-cu12, or torch's own)"),
              ("nccl-topo-file-invalid", "NCCL_TOPO_FILE (or a cloud image's topology XML, aws-ofi-nccl's) is set: "
                                         "NCCL_DEBUG=INFO names an attribute it cannot find ('Attribute arch of node "
                                         "cpu not found'); unset it or fix the file"),
              ("nccl-version-mismatch", "ranks or nodes load different NCCL releases: torch.cuda.nccl.version() on "
                                        "every node"))),
    # --- end of explain6's block
    Cause("nccl-message-truncated", "NCCL received more bytes than the receiving rank expected",
          (r"NCCL WARN (?:NET/Socket : )?[Mm]essage truncated",),
          "A peer sent more data than this rank posted for the same operation: the ranks disagree on a "
          "collective's size (a mismatch in shapes or in the order of calls), or their NCCL settings differ "
          "(NCCL_PROTO, NCCL_ALGO, versions) so they split the data differently.",
          "TORCH_DISTRIBUTED_DEBUG=DETAIL (the shapes per rank); compare NCCL versions and NCCL_* variables "
          "across nodes",
          "give every rank the same shapes and call order, and the same NCCL version and NCCL_* settings on "
          "every node"),
    Cause("ddpdoctor-desync", "ddpdoctor found ranks out of sync (DesyncError)",
          (r"\bDesyncError\b",),
          "ddpdoctor.assert_in_sync compared parameters or tensors across ranks and they differ: the ranks "
          "diverged (different initialisation, a rank-dependent update, an unsynchronised buffer).",
          "the message lists the tensors, the ranks on each side and their digests",
          "fix what makes the ranks differ at the place named (seed and broadcast the initial weights, "
          "sync buffers, avoid rank-dependent updates)"),
    Cause("ddpdoctor-collective-mismatch", "ddpdoctor's collective helpers saw ranks disagree",
          (r"\bCollective(?:Mismatch|Timeout)Error\b",),
          "A ddpdoctor collective helper (gather, broadcast_object, ...) found that the ranks passed "
          "incompatible arguments, called different helpers, or did not all arrive within its timeout.",
          "the message names each rank's call and arguments",
          "make every rank reach the same helper with compatible arguments at the same point"),
    # --- issue 17: causes found in real logs from public issue threads (tests/explain_corpus) ---------
    # Specific entries first: a line goes to the first entry that matches it.
    Cause("cuda-arch-unsupported", "this PyTorch build has no kernels for the GPU",
          (r"with CUDA capability sm_\d+ is not compatible with the current PyTorch installation",
           r"PyTorch no longer supports this GPU because it is too old",
           r"no kernel image is available for execution on the device"),
          "The installed PyTorch wheel was not compiled for this GPU's architecture: a GPU newer than the "
          "build (sm_86 with a CUDA 10 wheel, sm_120 with a wheel before CUDA 12.8) or older than its "
          "minimum (compute capability 3.5 and below). Every CUDA kernel then fails with 'no kernel image'.",
          "python -c 'import torch; print(torch.cuda.get_arch_list(), torch.cuda.get_device_capability())'; "
          "ddpdoctor explain --here",
          "install a PyTorch build whose CUDA version supports the GPU (pick the +cuXXX wheel from "
          "pytorch.org for that GPU), or build from source for an old GPU",
          candidates=(
              ("cuda-arch-unsupported", "torch's own warning names the GPU's sm_XX as not compatible, or "
                                        "torch.cuda.get_arch_list() lacks it: install a torch build for this GPU"),
              ("extension-arch-unsupported", "torch's own kernels run (a plain torch.ones(1, device='cuda') * 2 "
                                             "works) and the traceback ends in a compiled extension (apex, mmcv, "
                                             "flash-attn, deepspeed ops, xformers): rebuild it with "
                                             "TORCH_CUDA_ARCH_LIST including this GPU"))),
    Cause("cuda-driver-mismatch", "the NVIDIA driver is older than the CUDA this torch was built with",
          (r"CUDA driver version is insufficient for CUDA runtime version",
           r"The NVIDIA driver on your system is too old"),
          "The CUDA runtime inside the torch wheel (torch.version.cuda) needs a newer NVIDIA driver than the "
          "one installed: each driver supports CUDA up to the version nvidia-smi prints as 'CUDA Version'. "
          "Every rank fails at its first CUDA call; nothing distributed is at fault.",
          "nvidia-smi (the 'Driver Version' and the highest 'CUDA Version' it supports) against "
          "python -c 'import torch; print(torch.version.cuda)'; ddpdoctor explain --here",
          "update the NVIDIA driver to one that supports torch.version.cuda (then reboot), or install the "
          "torch wheel built for the CUDA the driver supports (pip install torch --index-url "
          "https://download.pytorch.org/whl/cuXXX)"),
    Cause("nccl-library-mismatch", "torch loads an NCCL it was not built with",
          (r"undefined symbol: (nccl\w+)",),
          "libtorch_cuda.so needs an NCCL function that the libnccl.so.2 it loaded does not have: a second "
          "NCCL (another nvidia-nccl-cuXX wheel, a system or container libnccl on LD_LIBRARY_PATH) is found "
          "before the one PyTorch was built against.",
          "pip list | grep -i nccl; python -c 'import torch; print(torch.cuda.nccl.version())'; "
          "echo $LD_LIBRARY_PATH; ddpdoctor explain --here",
          "keep one NCCL, the one this torch wheel requires: uninstall the extra nvidia-nccl package or drop "
          "the other libnccl from LD_LIBRARY_PATH (pip install --force-reinstall torch restores its own)"),
    Cause("nccl-not-built", "this PyTorch has no NCCL (Windows, macOS or CPU build)",
          (r"Distributed package doesn't have NCCL (?:\" \")?built in",),
          "backend='nccl' was requested from a PyTorch without NCCL: every Windows and macOS build, and CPU "
          "builds on Linux. It is not a missing install step.",
          "python -c 'import torch.distributed as d; print(d.is_nccl_available())'",
          "use backend='gloo' on Windows/macOS (or run under Linux/WSL2 for NCCL); on Linux install a CUDA "
          "build of PyTorch"),
    Cause("tcpstore-no-libuv", "TCPStore asked for libuv, which this build lacks (Windows)",
          (r"use_libuv was requested but PyTorch was buil[dt] without libuv support",),
          "Since PyTorch 2.4 the rendezvous store uses libuv by default, but the Windows wheels are built "
          "without it, so torchrun/accelerate fail before any rank starts.",
          "python -c 'import torch; print(torch.__version__)' (2.4+ on Windows)",
          "set USE_LIBUV=0 in the environment of the launcher (or init_method='tcp://host:port?use_libuv=0'), "
          "or use PyTorch 2.3 on Windows"),
    Cause("torch-api-mismatch", "the code and the installed PyTorch disagree on an API",
          (r"module 'torch\.distributed' has no attribute '",
           r"'DistributedDataParallel' object has no attribute '(?:num_iterations|reducer|require_\w+_sync)'",
           r"No module named 'torch\.distributed\.",
           r"cannot import name '\w+' from 'torch\.distributed"),
          "The code calls a torch.distributed API that the installed PyTorch does not have: the install is "
          "older than the code needs (device_mesh, _tensor, _all_gather_base), or newer than code written "
          "against removed internals.",
          "python -c 'import torch; print(torch.__version__)' against the project's requirements",
          "install the PyTorch version the project requires (usually newer), or update the code"),
    Cause("launcher-local-rank-arg", "the launcher passes --local-rank, the script does not accept it",
          (r"[Ee]rror: unrecognized arguments: (?:--|[\u2013\u2014]-?)local[-_]rank",),
          "python -m torch.distributed.launch appends --local-rank=N (PyTorch 2.0+; --local_rank before) to "
          "the script's arguments. A parser that declares only the other spelling, or none, rejects it and "
          "every rank exits with code 2.",
          "the usage line above the error shows which spelling the script declares",
          "launch with torchrun and read int(os.environ['LOCAL_RANK']); or accept both spellings: "
          "parser.add_argument('--local-rank', '--local_rank', type=int, default=0)"),
    Cause("no-launcher-env", "started without a launcher: RANK/MASTER_ADDR not set",
          (r"environment variable (?:RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|LOCAL_RANK) expected, but not set",
           r"KeyError: '(?:RANK|LOCAL_RANK|WORLD_SIZE|MASTER_ADDR)'",
           r"Could not find '(?:RANK|LOCAL_RANK)' in the torch environment"),
          "init_process_group(init_method='env://') reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which "
          "torchrun, torch.distributed.launch, srun wrappers or mp.spawn code set. Run as plain python (an "
          "IDE's Run button, os.system) they are missing.",
          "env | grep -e RANK -e MASTER_ in the failing process",
          "start the script with torchrun --nproc-per-node=N (or the project's launch script); for one "
          "process, skip init_process_group or set RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=<free>"),
    Cause("slurm-tasks-mismatch", "Slurm tasks do not match what the trainer expects",
          (r"number of tasks per node configured in SLURM .* does not match",
           r"number of nodes configured in SLURM .* does not match",
           r"You requested \d+ GPUs but launched \d+ slurm tasks"),
          "Under Slurm, Lightning (and srun-based launchers) take the world from SLURM_NTASKS / "
          "--ntasks-per-node / --nodes. When those differ from devices= and num_nodes=, some ranks are never "
          "started and the others wait at initialization until a timeout or the time limit.",
          "echo $SLURM_NTASKS $SLURM_NTASKS_PER_NODE $SLURM_NNODES inside the job; compare with the Trainer",
          "make #SBATCH --nodes equal num_nodes and --ntasks-per-node equal devices (one task per GPU), "
          "and drop a conflicting --ntasks"),
    Cause("master-host-unresolved", "the master's hostname does not resolve (yet)",
          (r"network addresses of \((?!localhost,)\S+, \d+\) cannot be retrieved \(gai error",
           r"host not found: Name or service not known",
           r"socket\.gaierror"),
          "MASTER_ADDR (or the rendezvous endpoint) is a name this node's resolver cannot turn into an address. "
          "Two readings: the name is wrong or only known on another host (use an IP), or it is a pod/DNS name "
          "that resolves only once that host is up: then the warnings stop by themselves and matter only if "
          "they last until the rendezvous timeout.",
          "getent hosts <MASTER_ADDR> on every node; ddpdoctor check --only port",
          "set MASTER_ADDR to the master's IP address (or a name every node resolves); if the warnings are "
          "only at start-up while the master pod comes up, nothing needs fixing"),
    Cause("socket-ifname-missing", "NCCL_/GLOO_SOCKET_IFNAME names an interface this host does not have",
          (r"Unable to find address for: (\S+)",
           r"Bootstrap : no socket interface found",
           r"is neither AF_INET\(2\) nor AF_INET6\(10\)",
           r"no NCCL_SOCKET_IFNAME interface found"),
          "The interface named in GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME (or the host name gloo resolves) "
          "has no address here: a name copied from another machine (eth0 vs enp7s0), different names on "
          "different nodes, or NCCL's ^exclusion syntax given to GLOO_SOCKET_IFNAME, which takes one name.",
          "ip -brief addr (on every node); ddpdoctor explain --here checks the name against this host",
          "set the variable to an interface that exists on each node (NCCL accepts a comma list: "
          "NCCL_SOCKET_IFNAME=enp4s0,enp6s0; GLOO_SOCKET_IFNAME takes exactly one), or unset it"),
    Cause("nccl-wrong-interface", "NCCL uses an interface the nodes cannot reach each other on",
          (r"NET/Socket : Using \[0\]lo:",
           r"NET/Socket : Using .*\[\d+\](?:br-|docker\d|veth)",
           r"NCCL_SOCKET_IFNAME set by environment to lo\b"),
          "NCCL's socket transport picked (or was told to use) loopback, docker bridges or veth interfaces, "
          "whose addresses the other nodes cannot reach; connections are refused or reset during init.",
          "the 'NET/Socket : Using' line of NCCL_DEBUG=INFO lists the interfaces it chose",
          "set NCCL_SOCKET_IFNAME to the interface the nodes share (e.g. bond0, eth0), or exclude the "
          "others (NCCL_SOCKET_IFNAME=^lo,docker,veth,br-)"),
    Cause("nccl-ib-network", "InfiniBand/RoCE transport errors (HCA, GID index, routing)",
          (r"NET/IB : Got completion (?:from peer \S+ )?with error \d+",
           r"Call to ibv_modify_qp failed",
           r"^(?:(?!NCCL INFO).)*NET/IB : No device found",  # as INFO it is harmless: NCCL uses sockets
           r"NET/OFI Request \S+ completed with error"),
          "NCCL's InfiniBand/RoCE connections failed: error 12 is a transport retry timeout (the NICs cannot "
          "talk: wrong GID index for RoCE v2, routing between rails, a bad link), ibv_modify_qp timing out "
          "means the queue pair never reached the peer.",
          "ibstat / show_gids on both nodes; ib_write_bw between them; NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET",
          "set NCCL_IB_GID_INDEX to the RoCE v2 GID (show_gids), NCCL_IB_HCA to the right NICs, "
          "NCCL_CROSS_NIC=0 on rail-optimized fabrics; fix or exclude the bad nodes"),
    Cause("nccl-remote-error", "NCCL remote error: a peer exited, or the network failed",
          (r"remote process exited or there was a network error", r"ncclRemoteError"),
          "NCCL lost a connection to a peer. Two readings: (1) the peer process died first (a crash, a "
          "signal, an exception) and this rank is a victim; (2) the network between them failed (IB/RoCE "
          "errors, a reset link) and no rank crashed. Tell them apart by whether another rank's own error "
          "or signal comes first in the log, and by the 'Last error' line (NET/IB, Connection reset).",
          "the first failure (torchrun's Root Cause) and the other ranks' last lines; on the nodes: "
          "ibstat, dmesg",
          "if a rank crashed first, fix that rank; if none did, check the fabric (ibstat, ib_write_bw) and "
          "exclude bad nodes",
          candidates=(
              ("peer-closed", "another rank's own error, exit code or signal comes first in the log "
                              "(torchrun's Root Cause names it): fix that rank"),
              ("nccl-ib-network", "no rank died first and the 'Last error' line is NET/IB (completion with "
                                  "error, ibv_ calls): the InfiniBand/RoCE fabric; ibstat, ib_write_bw"),
              ("nccl-wrong-interface", "no rank died first and the 'Last error' is a socket error at start-up "
                                       "(refused, reset): the interface NCCL chose; NCCL_SOCKET_IFNAME"))),
    Cause("more-ranks-than-gpus", "more processes on a node than it has GPUs",
          (r"invalid device ordinal",),
          "A rank asked for a CUDA device that does not exist on its node: --nproc-per-node (or the recipe's "
          "GPU count) is larger than the GPUs visible (CUDA_VISIBLE_DEVICES), so local ranks past the last "
          "GPU fail at set_device.",
          "nvidia-smi -L and echo $CUDA_VISIBLE_DEVICES against --nproc-per-node; ddpdoctor explain --here",
          "set --nproc-per-node (devices=, GPUS_PER_NODE) to the number of GPUs the node has and exposes",
          candidates=(
              ("more-ranks-than-gpus", "more processes per node (--nproc-per-node, 'Num processes') than nvidia-smi "
                                       "-L or CUDA_VISIBLE_DEVICES shows: start one process per GPU"),
              ("global-rank-as-device", "several nodes (--nnodes above 1): ranks past the first node ask for "
                                        "cuda:<global rank>; pick the device with LOCAL_RANK, not RANK"),
              ("hard-coded-device", "the code or config names a fixed GPU (cuda:1, --gpu 1, gpu_ids) that this "
                                    "machine does not have: use the device the launcher gives (LOCAL_RANK)"))),
    Cause("cpu-tensor-nccl", "CPU tensors (or a CPU model) under the NCCL backend",
          (r"No backend type associated with device type cpu",
           r"Tensors must be CUDA and dense",
           r"module parameters \{device\(type='cpu'\)\}"),
          "NCCL only moves dense CUDA tensors: a collective got a CPU tensor (a flag or length created without "
          "device=), or DistributedDataParallel got a model still on the CPU (wrapped before .cuda(), or "
          "device_ids given for a CPU model). The bare 'Tensors must be CUDA and dense' is also printed for a "
          "sparse tensor, and comes up when a torch or extension build does not work on this GPU, so the code "
          "falls back to CPU tensors that worked elsewhere.",
          "the traceback names the collective; print(tensor.device, tensor.is_sparse) just before it; "
          "python -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_arch_list())'",
          "create the tensor on the rank's GPU (device=f'cuda:{local_rank}') or move the model there before "
          "DDP; for CPU-side collectives init with backend='cpu:gloo,cuda:nccl' (or a gloo group)",
          candidates=(
              ("cpu-tensor-nccl", "the tensor or module the traceback names is on the CPU (print .device; a "
                                  "model wrapped in DDP before .cuda()): move it to the rank's GPU, or use a "
                                  "gloo group for CPU tensors"),
              ("library-version-mismatch", "the same code runs on other machines and every tensor is meant for "
                                           "the GPU: this torch (or a CUDA extension) build does not fit this GPU "
                                           "or library set (torch.cuda.get_arch_list() lacks the GPU's sm_XX); "
                                           "install the versions the project pins for this GPU"),
              ("sparse-tensor-nccl", "the tensor is sparse (nn.Embedding(sparse=True), a sparse gradient): "
                                     "tensor.is_sparse is True; use dense gradients or the gloo backend for "
                                     "it"))),
    Cause("ddp-reentrant-checkpoint", "a parameter marked ready twice (reentrant checkpointing)",
          (r"Expected to mark a variable ready only once", r"has been marked as ready twice"),
          "DDP saw a second gradient for the same parameter in one iteration: almost always reentrant "
          "activation checkpointing (torch.utils.checkpoint with use_reentrant=True, HF "
          "gradient_checkpointing) re-running part of the model in backward; or a parameter used outside "
          "forward.",
          "the traceback goes through torch/utils/checkpoint.py; TORCH_DISTRIBUTED_DEBUG=DETAIL names the parameter",
          "use non-reentrant checkpointing (checkpoint(..., use_reentrant=False); HF: "
          "gradient_checkpointing_kwargs={'use_reentrant': False}), or DDP(..., static_graph=True) when the "
          "graph never changes",
          candidates=(
              ("ddp-reentrant-checkpoint", "the traceback or config shows activation checkpointing (torch/utils/"
                                           "checkpoint.py, gradient_checkpointing, use_reentrant): non-reentrant "
                                           "checkpointing or static_graph=True"),
              ("parameter-used-twice", "no checkpointing: a module or parameter used twice in one forward (shared "
                                       "layers, tied weights) with find_unused_parameters=True, or used outside "
                                       "forward: TORCH_DISTRIBUTED_DEBUG=DETAIL names it; static_graph=True or "
                                       "find_unused_parameters=False"))),
    Cause("cuda-fork", "CUDA used in a forked subprocess",
          (r"Cannot re-initialize CUDA in forked subprocess",),
          "CUDA cannot be used in a process forked after the parent initialised it: DataLoader workers that "
          "touch the GPU, or multiprocessing with the default 'fork' start method after a .cuda() call.",
          "the traceback shows where: a DataLoader worker (keep data work on CPU) or your own Process/Pool",
          "keep CUDA out of dataset/worker code (move to GPU in the training loop), or start the children with "
          "'spawn' (mp.set_start_method('spawn') / DataLoader(multiprocessing_context='spawn'))"),
    Cause("shm-too-small", "/dev/shm too small (bus error, NCCL shared memory)",
          (r"Unexpected bus error encountered in worker",
           r"is killed by signal: Bus error",
           r"Error while creating shared memory segment",
           r"failed to extend /dev/shm/",
           r"Caught signal 7 \(Bus error",
           r"SIGBUS received",
           # explain7: the DataLoader's message in part, as users quote it (its stable words: bus error ... (shm))
           r"[Bb]us error.{0,120}?\(shm\)", r"insufficient shared memory \(shm\)"),
          "Shared memory ran out: DataLoader workers pass batches and NCCL passes data between local ranks "
          "through /dev/shm, and containers get 64 MB by default (16 MB on some CI images). A full /dev/shm "
          "shows up as a bus error (SIGBUS) or a failed segment.",
          "df -h /dev/shm inside the container; ddpdoctor explain --here (size and free space)",
          "give the container more shared memory: docker run --shm-size=8g (or --ipc=host); Kubernetes: an "
          "emptyDir with medium: Memory mounted on /dev/shm; or fewer DataLoader workers"),
    Cause("shm-permission", "/dev/shm is not writable",
          (r"unable to open shared memory object <[^>]*> in read-write mode: Permission denied",
           r"Permission denied: '/dev/shm",
           r"Call to shm_open failed : Permission denied"),
          "Python multiprocessing (DataLoader workers' queues and locks), torch's shared tensors and NCCL's "
          "shared-memory transport create files in /dev/shm; here the process may not write there (mounted "
          "755, missing in a sandbox), so the semaphore creation fails with Errno 13, or NCCL's shm_open is "
          "denied and its segment cannot be created. This is permission, not size.",
          "ls -ld /dev/shm (expect drwxrwxrwt); ddpdoctor explain --here",
          "make /dev/shm a writable tmpfs with mode 1777 (mount -t tmpfs -o mode=1777 tmpfs /dev/shm; in a "
          "container bind one), or run the loader with num_workers=0"),
    Cause("dataloader-worker-exited", "a DataLoader worker exited: one of three causes",
          (r"DataLoader worker \(pid(?:\(s\))? [\d, ]{1,200}\) exited unexpectedly",),
          "A DataLoader worker process died and the main process only saw it go (torch/utils/data/"
          "dataloader.py). The line is the same for several causes: shared memory ran out (containers get "
          "64 MB of /dev/shm), the host's OOM killer took the worker, or the worker itself crashed (an "
          "exception in a native library, a segfault) and its error was lost.",
          "df -h /dev/shm; dmesg -T | grep -i -e oom -e killed; rerun with num_workers=0 (the worker's own "
          "error then shows in the main process)",
          "the fix of the candidate the checks point at (see the candidates)",
          candidates=(
              ("shm-too-small", "in a container, /dev/shm is small (df -h /dev/shm shows 64M) or a bus error comes "
                                "with it: docker run --shm-size=8g (or --ipc=host), or fewer workers"),
              ("host-oom", "dmesg names the OOM killer and the worker's pid ('Killed', exit -9): fewer workers or "
                           "ranks per node, smaller prefetch, or more RAM"),
              ("dataloader-worker-error", "neither: with num_workers=0 the dataset's own error (or a crash in a "
                                          "native library it calls) shows in the main process; fix that"))),
    # explain7: a DataLoader worker killed by SIGKILL is a family (heldout5's 414 was host-oom with confidence where
    # the thread settled on fewer workers); the OOM killer's own lines (host-oom's patterns) decide it.
    Cause("dataloader-worker-killed", "a DataLoader worker was killed (SIGKILL): one of three causes",
          (r"DataLoader worker \(pid(?:\(s\))? [\d, ]{1,200}\) is killed by signal: Killed",),
          "A DataLoader worker process got SIGKILL ('Killed', exit -9), nearly always from an out-of-memory "
          "killer: host memory grows with ranks per node x num_workers x what each worker holds (its copy of the "
          "dataset's Python objects, prefetched batches). Which limit it hit, and what to lower, is read outside "
          "the log: the kernel's log, the container's or scheduler's memory limit, the worker count against the "
          "machine.",
          "dmesg -T | grep -i -e oom -e 'killed process' (the worker's pid); the container's or job's memory limit "
          "(docker stats, sacct -o MaxRSS, kubectl describe pod); num_workers x ranks per node against nproc and "
          "free -h",
          "the fix of the candidate the checks point at (see the candidates)",
          candidates=(
              ("host-oom", "dmesg names the OOM killer and the worker's pid, with the node's RAM full: lower memory "
                           "per node (fewer ranks or workers, no CPU offload, lazy dataset loading) or add RAM"),
              ("too-many-dataloader-workers", "more workers than the machine carries (num_workers x ranks per node "
                                              "above its CPU cores, each worker holding a copy of the dataset): it "
                                              "passes with num_workers=2 or 0; use fewer workers"),
              ("scheduler-kill", "the container's or the job's memory limit, not the machine's, was reached "
                                 "(OOMKilled in kubectl describe pod, sacct's MaxRSS at --mem, docker's --memory): "
                                 "raise the limit or use fewer workers"))),
    Cause("host-oom", "killed by the host's out-of-memory killer",
          (r"Out of memory: Kill(?:ed)? process \d+",
           r"invoked oom-killer",
           r"Memory cgroup out of memory",
           r"oom[-_]kill event",
           r"srun: error: \S+: task \d+: Out Of Memory"),
          "A process got SIGKILL (exit -9, 'Killed'), which in training jobs is almost always the kernel's or "
          "the cgroup's out-of-memory killer: host RAM (not GPU memory) ran out while loading checkpoints, "
          "offloading optimizer states, or in DataLoader workers. A scheduler kill for time says so itself.",
          "dmesg | grep -i -e oom -e killed; the job's memory request (Slurm --mem); free -h while it runs",
          "use less host memory per node (fewer ranks or workers, no CPU offload, sharded/lazy checkpoint "
          "loading) or give the job more RAM"),
    Cause("store-timeout", "a rank waited at the store past the timeout",
          (r"Socket Timeout", r"Timed out waiting \d+ms for recv"),
          "A rank waited for a key (the NCCL unique id, a barrier) that another rank had not written within "
          "the timeout: that rank was busy with long work, or gone.",
          "the other ranks' last lines: long work (dataset preprocessing, loading) or an error",
          "find what the missing rank was doing; move long work out of the distributed section or raise "
          "timeout= in init_process_group",
          candidates=(
              ("slow-rank-timeout", "one rank was busy with work of its own (preprocessing, loading, saving) "
                                    "before it reached the store: its progress lines run up to the timeout; move "
                                    "the work or raise timeout="),
              ("peer-closed", "a rank never arrived: its own error or signal comes first in the log, or fewer "
                              "ranks started than WORLD_SIZE (count the ranks that printed): fix or start that rank"),
              ("rendezvous-unreachable", "several nodes, at start-up: the other nodes' store traffic is dropped (a "
                                         "firewall, the wrong interface): nc -zv MASTER_ADDR MASTER_PORT from every "
                                         "node; ddpdoctor check --only port"))),
    Cause("slow-rank-timeout", "timeout while one rank did long work (dataset, loading, checkpoint)",
          (),
          "One rank spent longer than the process group timeout in work of its own (tokenizing or mapping a "
          "dataset, loading weights, saving a checkpoint, validating) while the others waited in a barrier or "
          "collective, so their watchdog or store timeout fired. Nothing is broken; the timeout is too short "
          "for that work.",
          "the long task's progress lines on one rank just before the others' timeout",
          "do the long work before the distributed part (preprocess and cache the dataset once; "
          "main_process_first + cache), or raise the timeout: init_process_group(timeout=timedelta(hours=2)), "
          "HF --ddp_timeout, accelerate InitProcessGroupKwargs(timeout=...)"),
    Cause("ddp-unused-already-on", "unused parameters with find_unused_parameters=True already on",
          (),
          "DDP still reports parameters without gradients although the log shows find_unused_parameters=True "
          "is already set: the parameters are outside what DDP can trace (used under no_grad or outside "
          "forward, a head that never gets a loss), so turning detection on does not help.",
          "TORCH_DISTRIBUTED_DEBUG=INFO names the parameters; check where they are used",
          "freeze them (requires_grad=False before wrapping in DDP) or remove the unused module; or make them "
          "take part in the loss (even times zero)"),
    Cause("syncbn-single-process", "SyncBatchNorm without a process group (outside DDP)",
          (r"SyncBatchNorm is only supported within torch\.nn\.parallel\.DistributedDataParallel",),
          "A model with SyncBatchNorm (or a config with SyncBN) ran in a single process or outside "
          "DistributedDataParallel (one GPU, DataParallel, a test script): SyncBatchNorm asks for the world "
          "size and there is no default process group, or (older torch) it refuses outside DDP.",
          "the traceback goes through batchnorm.py (SyncBatchNorm.forward) into get_world_size",
          "for single-process runs use plain BatchNorm (norm_cfg type 'BN'; choose the layer by world size) "
          "or create a world_size=1 process group"),
    Cause("no-default-process-group", "default process group not initialized",
          (r"Default process group has not been initialized", r"Default process group is not initialized"),
          "A torch.distributed call (all_reduce, barrier, DistributedDataParallel, get_rank) ran before "
          "init_process_group, or in a process that never called it (a DataLoader worker, an eval script).",
          "ddpdoctor check --only process-group",
          "call torch.distributed.init_process_group(...) first in every rank (guard single-process "
          "code with torch.distributed.is_initialized())",
          candidates=(
              ("no-default-process-group", "init_process_group is not called on this path: a script's "
                                           "distributed mode started without its launcher or flag (torchrun, "
                                           "--launcher pytorch), or a collective called before the init"),
              ("syncbn-single-process", "the traceback passes through SyncBatchNorm (batchnorm.py, SyncBN in "
                                        "the config) in a single process: use BatchNorm there"))),

    Cause("port-in-use", "address already in use: the launcher's port, or one the program sets itself",
          (r"EADDRINUSE", r"[Aa]ddress already in use",
           r"another process is utilizing it"),  # explain6: accelerate launch's own check of the port
          "The port the job's store listens on is held by another process: a previous run that did not exit, "
          "a second job on the node, another user. Two places choose that port and print the same line: the "
          "launcher (MASTER_PORT, --master-port, 29500 by default; torchrun's agent, accelerate, deepspeed) or "
          "the program itself (init_method='tcp://host:PORT', os.environ['MASTER_PORT'] = ... in its code or "
          "config), which an exported MASTER_PORT or --master-port does not change.",
          "ddpdoctor check --only port (names the process holding it); grep the code and its config for the "
          "port number and for init_method / MASTER_PORT",
          "stop the process that holds the port, or give the job a free one where the port is chosen: "
          "--master-port / MASTER_PORT (torchrun --master-port 0 or --standalone) for the launcher's; the "
          "code or config (read it from the environment: os.environ.setdefault('MASTER_PORT', ...)) for "
          "the program's own",
          candidates=(
              ("port-in-use", "the launcher opens the store (torchrun, python -m torch.distributed.launch, "
                              "accelerate, deepspeed; env:// in the traceback, --master-port on the command "
                              "line): another job holds MASTER_PORT; ss -ltnp | grep :PORT, then a free "
                              "--master-port"),
              ("port-in-use-in-code", "the program chooses the address itself (init_method='tcp://...:PORT', "
                                      "--dist-url, MASTER_PORT set in its code or config, a plain 'python x.py' "
                                      "that opens the store): a new MASTER_PORT changes nothing; change the port "
                                      "where the code sets it"))),
    Cause("gloo-connect-full-mesh", "gloo could not connect the ranks to each other",
          (r"Gloo connectFullMesh failed",
           # Anchored at the line's first pair.cc and a bounded gap: no backtracking on long lines.
           r"^(?:(?!gloo/transport/tcp/pair\.cc).)*gloo/transport/tcp/pair\.cc.*(?:Connect timeout|ECONNREFUSED|"
           r"Connection refused|connect .{0,200}? failed)"),
          "The store worked but gloo's rank-to-rank TCP connections failed. On a multi-node job this is "
          "usually a hostname that resolves to a loopback address (127.0.1.1 in /etc/hosts), so peers "
          "are told to connect to themselves; or a firewall between nodes; or the wrong interface.",
          "ddpdoctor check --only process-group (run on every node); getent hosts $(hostname)",
          "set GLOO_SOCKET_IFNAME to the interface the nodes share (e.g. eth0), or fix /etc/hosts so "
          "the hostname resolves to that interface's address"),
    # explain7: a connect to the store that timed out is a family (heldout5's 422 was one confident cause where the
    # thread settled on the node's host name in /etc/hosts); evidence.py orders it by the host the log names.
    Cause("store-connect-timeout", "the connection to the rendezvous store timed out: one of three causes",
          (r"client socket has timed out after \d+m?s while trying to connect to",
           r"connect\(\) timed out", r"^(?:RuntimeError: )?Connection timed out\s*$",
           r"TCP client failed to connect/validate to host",
           r"RendezvousConnectionError",
           r"[Tt]he connection to the C10d store has failed"),
          "A rank (or torchrun's agent) tried to connect to the rendezvous store (MASTER_ADDR:MASTER_PORT, or "
          "--rdzv-endpoint) and no connection was made before the timeout. Several causes print it alike: the "
          "address cannot be reached from this node (a firewall, a wrong MASTER_ADDR or endpoint, the master on an "
          "interface the nodes do not share); a host name that resolves to the wrong address on a node (c10d "
          "rendezvous hands out the master's own host name; /etc/hosts maps it to 127.0.1.1, an old address, or "
          "not at all); or the node that hosts the store started late or failed first.",
          "nc -zv MASTER_ADDR MASTER_PORT from every node (ddpdoctor check --only port); getent hosts <the host "
          "name> and getent hosts $(hostname) on every node; the master node's own log",
          "the fix of the candidate the checks point at (see the candidates)",
          candidates=(
              ("rendezvous-unreachable", "nc -zv ADDR PORT fails from this node while the master runs: a firewall, "
                                         "a wrong MASTER_ADDR or --rdzv-endpoint, or an address on an interface the "
                                         "nodes do not share; give every node an address it can reach and open the "
                                         "port"),
              ("master-host-unresolved", "the store's host is a name (--rdzv-endpoint or MASTER_ADDR, or the host "
                                         "name c10d hands out): getent hosts NAME on each node gives no address, "
                                         "127.0.1.1 or a wrong one; add the real address to /etc/hosts on every "
                                         "node (and this node's own name), or use an IP"),
              ("master-not-started", "the node hosting the store was not up yet or failed first (its own log "
                                     "shows an error, or it was launched later than the timeout): start every "
                                     "node together, fix its error, or raise the rendezvous timeout"))),
    Cause("rendezvous-unreachable", "rendezvous connect timeout or refused",
          (r"Timed out initializing process group in store based barrier",
           r"RendezvousTimeoutError",
           r"Timed out after \d+ seconds waiting for clients",
           r"The client socket has failed to connect to any network address"),
          "A rank could not reach the rendezvous store on MASTER_ADDR:MASTER_PORT, or the master waited "
          "for ranks that never arrived: a wrong MASTER_ADDR, a firewall, the master not started yet, "
          "or fewer ranks launched than WORLD_SIZE says.",
          "ddpdoctor check --only port (on every node)",
          "make MASTER_ADDR an address every node can reach, open the port, and launch every node "
          "with the same --nnodes/--nproc-per-node"),
    Cause("connection-refused", "connection refused: the store not up, a peer gone, or NCCL's interface",
          (r"[Cc]onnection refused",),
          "A connection was refused: nothing listened at the address and port. The line is the same for "
          "several causes: at start-up the store on MASTER_ADDR:MASTER_PORT is not there (the master not started "
          "yet, a wrong address or port, a firewall that rejects); later, the process that held the store or a "
          "peer exited first; or, for NCCL's and gloo's own connections between ranks, the address they "
          "advertised is on an interface the peer cannot reach.",
          "ddpdoctor check --only port (on every node); the first failure in the log (torchrun's Root Cause); "
          "NCCL_DEBUG=INFO's 'NET/Socket : Using' line",
          "the fix of the candidate the log points at (see the candidates)",
          candidates=(
              ("rendezvous-unreachable", "at start-up, before any step: nothing listens at MASTER_ADDR:MASTER_PORT "
                                         "(the master not started yet, a wrong address or port, a firewall): "
                                         "ddpdoctor check --only port on every node"),
              ("peer-closed", "after the job had started, or another rank's error or signal comes first: the "
                              "process holding the store (rank 0, the master node's agent) or the peer exited; "
                              "fix the rank that failed first"),
              ("nccl-wrong-interface", "the line is NCCL's or gloo's connection between ranks (NCCL WARN ... "
                                       "Connect to ... failed, NET/Socket): the interface it chose is not reachable "
                                       "from the peer; set NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME"))),
    Cause("nccl-watchdog-timeout", "NCCL watchdog timeout",
          (r"Watchdog caught collective operation timeout", r"ProcessGroupNCCL's watchdog",
           r"^(?:(?!WorkNCCL\(SeqNum=).)*WorkNCCL\(SeqNum=\d+.*ran for \d+ milliseconds before timing out"),
          "A collective did not complete within the process group timeout (10 minutes by default). "
          "Almost always one rank is somewhere else (stuck in data loading, a different collective, "
          "an exception swallowed, or dead) and the others wait for it; the rank named in the message "
          "is a waiting rank, not necessarily the culprit.",
          "ddpdoctor stacks (while it hangs), or rerun under ddpdoctor run; read the Flight Recorder "
          "dumps (TORCH_NCCL_DUMP_ON_TIMEOUT=1): ddpdoctor explain --fr DIR names the first collective "
          "where the ranks diverge and the ranks on each side",
          "if one rank was busy in its own work, either raise the timeout (init_process_group(timeout="
          "timedelta(hours=2)), HF --ddp_timeout) or move that work out of the others' way (do it on every rank, "
          "or before the distributed part); otherwise find the rank whose stack differs and fix what it does "
          "(ddpdoctor run gets the grouped stacks and the Flight Recorder dump automatically)",
          candidates=(
              ("slow-rank-timeout", "one rank was busy in work of its own (evaluation, saving a checkpoint, "
                                    "preparing data) while the others waited: its last progress line is near "
                                    "the timeout; raise the timeout or move the work out of the collective's way"),
              ("collective-mismatch", "the ranks called different collectives, or one skipped one: "
                                      "TORCH_DISTRIBUTED_DEBUG=DETAIL or the Flight Recorder (ddpdoctor explain "
                                      "--fr) names the first one that differs"),
              ("peer-closed", "a rank died or hung first: its own error above the timeout, or ddpdoctor stacks "
                              "while the job hangs"))),

    Cause("nccl-system-error", "NCCL system error: a socket, shared memory or a device call failed",
          (r"unhandled system error", r"unhanled system error", r"ncclSystemError",
           r"Error while creating shared memory segment",
           r"/dev/shm/nccl-"),
          "A system call NCCL needs failed. The message is the same for several causes: the ranks cannot "
          "reach each other on the interface NCCL picked (between nodes, or between containers on their own "
          "networks), or shared memory in /dev/shm ran out (a container's 64 MB default). NCCL_DEBUG=INFO "
          "prints the failing call just above the error.",
          "rerun with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,NET): the WARN line before the error names "
          "the call; ddpdoctor check --only env (the /dev/shm size) and --only port (reachability)",
          "the fix of the cause the WARN line points at (see the candidates)",
          candidates=(
              ("nccl-wrong-interface", "ranks on several nodes: a socket WARN (connect refused/timed out, "
                                       "'Connection reset') follows the 'NET/Socket : Using' line; set "
                                       "NCCL_SOCKET_IFNAME to the interface the nodes share"),
              ("container-network", "ranks in separate containers (Docker bridge addresses such as 172.17.x, "
                                    "it works inside one container): run them with --network=host"),
              ("shm-too-small", "one node in a container: a shm_open/'shared memory segment' WARN or a bus "
                                "error; df -h /dev/shm; docker run --shm-size=8g or --ipc=host"))),
    Cause("duplicate-gpu", "Duplicate GPU detected: ranks sharing a GPU, one of three causes",
          (r"Multiple Ranks are using the same GPU", r"Duplicate GPU detected",),
          "NCCL found two ranks of one communicator on the same CUDA device. The message is the same for "
          "several causes: the ranks did not pick their own GPU (no torch.cuda.set_device(local_rank), a "
          "device hard-coded, the global rank used for the local one); the node has fewer GPUs than the "
          "processes started on it; or the framework that assigns the GPUs (Ray, verl, vLLM, a cluster "
          "launcher) gave two workers the same one, a bug of some of its releases.",
          "compare the processes started per node (--nproc-per-node, accelerate's 'Num processes') with "
          "nvidia-smi -L and CUDA_VISIBLE_DEVICES; print torch.cuda.current_device() in each rank; "
          "ddpdoctor check --only process-group (one GPU per rank)",
          "the fix of the candidate the checks point at (see the candidates)",
          candidates=(
              ("duplicate-gpu", "the node has a GPU per process but the ranks print the same device: call "
                                "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before init_process_group, "
                                "pass device_ids=[local_rank], remove a hard-coded device"),
              ("more-ranks-than-gpus", "more processes per node (--nproc-per-node, 'Num processes') than nvidia-smi "
                                       "-L or CUDA_VISIBLE_DEVICES shows: start one process per GPU"),
              ("library-version-mismatch", "the GPUs are assigned by a framework (Ray workers, verl, vLLM), not by "
                                           "your code: a known bug of its release; upgrade it (verl: Ray >= 2.40) "
                                           "or set the devices per worker yourself"))),
    # -- issue 13 (cause13): a rank asking for a GPU it cannot see ------------------------------
    Cause("invalid-device-ordinal", "more local ranks than visible GPUs",
          (r"CUDA error: invalid device ordinal", r"invalid device ordinal"),
          "A rank asked for cuda:<local_rank> and that GPU does not exist here: more processes per node "
          "than visible GPUs (torchrun --nproc-per-node above the GPU count), or CUDA_VISIBLE_DEVICES "
          "hides some of them. That rank fails at once; the others then wait for it.",
          "nvidia-smi -L (the GPUs this node has); echo $CUDA_VISIBLE_DEVICES; ddpdoctor check --only env",
          "use --nproc-per-node at most the GPU count (one rank per GPU), or set CUDA_VISIBLE_DEVICES to "
          "list as many GPUs as local ranks"),
    Cause("ddp-unused-parameters", "DDP unused parameters",
          (r"Expected to have finished reduction in the prior iteration",
           r"did not receive grad for rank \d+",
           r"LightningModule has parameters that were not used in producing the loss"),  # explain6: Lightning's wording
          "Some parameters got no gradient in the last iteration (a branch not taken, a frozen head, an "
          "output not used in the loss), so DDP's reduction never finished.",
          "ddpdoctor check --only param-sync (names unused parameters), or rerun with "
          "TORCH_DISTRIBUTED_DEBUG=INFO: the error then names them",
          "use every output in the loss, or pass find_unused_parameters=True to DistributedDataParallel "
          "(or static_graph=True when the set of unused parameters never changes)"),
    Cause("ddp-model-mismatch", "DDP saw different models (or a stuck rank)",
          (r"DDP expects same model across all ranks",
           r"appears not to match (?:sizes|strides) of the same param in process \d+"),
          "DistributedDataParallel's constructor compares parameter shapes across ranks. A real model "
          "difference is rare; more often one rank is behind or ahead (still loading, or in another "
          "collective), so the check reads another collective's data.",
          "ddpdoctor stacks while it runs; TORCH_DISTRIBUTED_DEBUG=DETAIL names the mismatching collective",
          "build the same model on every rank before DDP(...) and make every rank reach the constructor "
          "(no rank-0-only collectives before it)"),
    Cause("collective-mismatch", "ranks called different collectives",
          (r"Detected mismatch between collectives", r"NCCL WARN Mismatched collective detected"),
          "NCCL noticed ranks enqueue different collectives (its 'Mismatched collective detected'), or, with "
          "TORCH_DISTRIBUTED_DEBUG=DETAIL, PyTorch checked each collective across ranks and found "
          "ranks calling different operations, shapes or dtypes at the same point: a rank skipped or "
          "added a collective (a rank-dependent if, an uneven last batch).",
          "the message names both ranks' collectives; ddpdoctor stacks shows where each rank is",
          "make every rank call the same collectives in the same order with the same shapes (drop_last=True "
          "or DistributedSampler for uneven data)"),
    Cause("syncbn-cpu", "SyncBatchNorm on CPU or one process",
          (r"SyncBatchNorm expected input tensor to be on GPU",
           r"SyncBatchNorm number of input channels should be non-zero"),
          "SyncBatchNorm synchronizes statistics only for GPU (or XPU) tensors in a process group of two "
          "or more ranks; on CPU with gloo it refuses.",
          "ddpdoctor check --only env (devices per rank); ddpdoctor check --only bn-sync (how far plain "
          "BatchNorm statistics drift across ranks)",
          "on CPU keep plain BatchNorm (skip nn.SyncBatchNorm.convert_sync_batchnorm), or move the model "
          "to GPUs with the nccl backend"),
    Cause("cuda-oom-gpu0", "CUDA out of memory on GPU 0",
          (r"^(?:(?!CUDA out of memory\.).)*CUDA out of memory\..*GPU 0[ ;]",),
          "Every rank allocating on GPU 0 fills it: tensors created with device='cuda' before "
          "set_device, or torch.load of a checkpoint saved on cuda:0 without map_location. (An out-of-memory "
          "on GPU 0 alone can also be rank 0's own work not fitting its GPU: see the candidates.)",
          "ddpdoctor check --only process-group (memory held on a GPU that is not the rank's own); "
          "nvidia-smi while it runs (the processes on GPU 0)",
          "torch.cuda.set_device(local_rank) first, and torch.load(path, map_location='cpu') (or "
          "map_location=f'cuda:{local_rank}')",
          candidates=(
              ("cuda-oom-gpu0", "nvidia-smi lists several of the job's processes on GPU 0 (the message lists "
                                "other processes' memory, or a rank other than 0 reports GPU 0): every rank "
                                "touches GPU 0; set_device first, torch.load(..., map_location='cpu')"),
              ("cuda-oom", "only rank 0's own process is on GPU 0 and its memory grew to the GPU's size: the "
                           "model, batch or activations do not fit; a smaller batch, mixed precision, "
                           "activation checkpointing, or sharding (FSDP/ZeRO)"))),
    # An out-of-memory on any other GPU (GPU 0's is the entry above): the GPU was full, a family of three.
    Cause("cuda-oom", "CUDA out of memory on a rank's GPU",
          (r"CUDA out of memory\.", r"\btorch\.(?:cuda\.)?OutOfMemoryError\b"),
          "The GPU this process allocated on was full.",
          "the message's own numbers: 'this process has X GiB memory in use' against the total capacity, and any "
          "'Process N has X GiB memory in use' it lists; nvidia-smi while the job runs (the processes on each GPU)",
          "when this process holds the memory: a smaller batch per rank, mixed precision (torch.autocast), activation "
          "checkpointing, or sharding (FSDP/ZeRO); when others do: one rank per GPU (set_device(local_rank), "
          "device=f'cuda:{local_rank}'), and stop what else holds the GPU",
          candidates=(
              ("cuda-oom", "this process itself holds nearly all of the GPU ('this process has X GiB memory in use' "
                           "close to the total capacity): the model, batch or activations do not fit one GPU"),
              ("ranks-share-gpu", "nvidia-smi lists two of the job's processes on this GPU (the message lists "
                                  "'Process N has ...' for several of its ranks): a rank did not pick its own GPU"),
              ("gpu-held-by-other", "nvidia-smi lists a process of another job, or one left from an earlier run, on "
                                    "this GPU: the memory was taken before this job started")),
          undecided="The GPU this process allocated on was full: the rank's own model and batch did not fit, two "
                    "ranks of the job shared the GPU, or another process held its memory."),
    Cause("teardown-abort", "a rank aborted in std::terminate: the torch/gloo exit race, or on the way out",
          (r"terminate called without an active exception",),
          "The job's work finished; {rank} aborted during interpreter teardown: a torch/gloo exit bug, not a "
          "training failure. A gloo worker thread was still dropping the last collective's work (which takes "
          "the GIL) when the interpreter began finalizing; CPython ends such a thread inside a noexcept C++ "
          "destructor, and std::terminate aborts the process (SIGABRT). torchrun then stops the other ranks "
          "with SIGTERM and reports the job as failed.",
          "the rank's exit code is -6 (SIGABRT) and no Python traceback comes before the line; in a core dump "
          "(ulimit -c unlimited; gdb python core; thread apply all bt) the aborting thread is pt_gloo_runloop "
          "in take_gil",
          "import ddpdoctor (or ddpdoctor.diagnostics) in the training script: its exit hook waits until gloo's "
          "worker threads are idle before the interpreter finalizes; or end the script with "
          "ddpdoctor.exit_now() to skip the interpreter's teardown",
          candidates=(
              ("teardown-abort", "the work had finished, no Python traceback comes before the line and the rank "
                                 "exited by SIGABRT (-6): the exit race; import ddpdoctor, or call "
                                 "destroy_process_group() before the script ends"),
              ("earlier-error", "a Python traceback comes before it: the process was already ending because of "
                                "that error and aborted on the way out; fix the error above"),
              ("native-thread-abort", "it aborts in the middle of training with no Python error: a C++ thread of an "
                                      "extension or a library was destroyed while running; faulthandler "
                                      "(python -X faulthandler) or gdb's backtrace names the library")),
          undecided="The process ({rank}) aborted in std::terminate: a C++ thread object was destroyed while its thread still "
                    "ran. Three things print this line alike: torch/gloo's exit race after the work finished (a "
                    "worker thread still running while the interpreter finalizes), a process already ending "
                    "because of an earlier error, or a native library's thread in the middle of training."),
    Cause("peer-closed", "a peer rank went away",
          (r"Connection closed by peer", r"Connection reset by peer",
           r"Failed to recv, got 0 bytes\. Connection was likely closed"),
          "This rank's connection to another rank (or to the store) closed: the other process crashed, "
          "raised, or was killed first. This rank is a victim, not the cause.",
          "the first failure torchrun reports (Root Cause) and that rank's own lines in the log",
          "fix the rank that failed first; read its traceback or signal above"),
    Cause("killed-by-signal", "a rank was killed by a signal",
          (r"Signal \d+ \((SIG[A-Z0-9]+)\) received by PID \d+",
           r"died with <Signals\.(SIG[A-Z0-9]+): \d+>",
           r"exitcode\s*:\s*-(\d{1,9}) \(pid",  # a signal number: bounded (int() refuses 4300+ digits)
           r"failed \(exitcode: -(\d{1,9})\)", r"[Rr]eturn code ?= ?-(\d{1,9})(?!\d)",  # DeepSpeed's "exits with return code = -7", as quoted
           r"\b(SIG[A-Z0-9]{1,12}) received by PID \d+"),
          "A rank process ended by a signal, not an exception.",
          "dmesg | grep -i -e oom -e killed (SIGKILL); ddpdoctor check --only env (memory, /dev/shm)",
          "find who sent the signal: SIGKILL is often the kernel's OOM killer (dmesg | grep -i oom)"),
    Cause("torch-distributed-error", "an error raised by torch.distributed or DDP itself",
          (),
          "The exception was raised inside torch's own distributed code (the module is named below): it checked "
          "an argument, a state or its peers and refused. Its message is the explanation; the line to change "
          "is your call into it, not torch's.",
          "the exception's message; TORCH_DISTRIBUTED_DEBUG=DETAIL (and TORCH_CPP_LOG_LEVEL=INFO) for more "
          "context; the torch.distributed docs of the API named",
          "change your call (the arguments, the order of calls, the state of the process group) as the "
          "message asks"),
    Cause("accelerate-error", "an error raised by accelerate itself",
          (),
          "The exception was raised inside huggingface accelerate (the module is named below): its own check of "
          "the configuration, the launch or the objects passed to prepare() failed. Its message is the "
          "explanation; the line to change is your call or your accelerate config.",
          "accelerate env (the versions and the config in use); the message",
          "change the config (accelerate config) or your call as the message asks"),
    # --- cppmine (issue 25): torch's C++ (c10d) messages with a known cause, from the mined templates
    # (tests/data/emitters, emitter torch-cpp). Kept together; the families by source file are the last block.
    Cause("collective-noncontiguous", "a non-contiguous tensor given to a collective or send/recv",
          (r"Tensors must be contiguous", r"input tensor has to be contiguous"),
          "The tensor passed to the collective (or to send/recv) is a view whose memory is not one dense run: "
          "the result of .t(), .transpose(), .permute(), .expand() or a strided slice. c10d sends the tensor's "
          "memory as it is, so it refuses such views.",
          "print(t.is_contiguous()) for the tensor the traceback's collective gets",
          "pass t.contiguous() (and copy the result back into the view if you need it there)"),
    Cause("reduce-op-unsupported", "a ReduceOp the backend does not implement",
          (r"Cannot use ReduceOp\.(?P<op>[A-Z_]{2,20}) with (?P<backend>Gloo|NCCL)\b",
           r"Cannot use ReduceOp\.(?P<op>[A-Z_]{2,20}) with (?:non-integral dtype|boolean inputs)"),
          "The collective asked for an operation the backend (or the dtype) does not support: gloo has no AVG "
          "nor PREMUL_SUM, NCCL has no bitwise BAND/BOR/BXOR, the bitwise ops need integer tensors, and AVG "
          "refuses bool tensors.",
          "the op= of the all_reduce/reduce the traceback names, and the backend in init_process_group",
          "for AVG on gloo: all_reduce with ReduceOp.SUM, then divide by dist.get_world_size(); for bitwise ops "
          "on NCCL: use gloo for that tensor (a CPU group) or MAX/MIN on 0/1 tensors; cast the dtype the op "
          "needs"),
    Cause("nccl-too-old-for-op", "the NCCL in use is older than the feature needs",
          (r"only supports (?:alltoall\*|send|recv) for NCCL lib version >= 2\.7\.0",
           r"AVG requires NCCL 2\.10\+", r"PreMulSum requires NCCL>=2\.11\.1",
           r"Capturing NCCL collectives is only allowed with NCCL >= 2\.9\.6"),
          "The operation exists only in newer NCCL releases than the one torch was built with or loaded at run "
          "time (all-to-all and send/recv need 2.7, ReduceOp.AVG 2.10, PREMUL_SUM 2.11.1, CUDA-graph capture "
          "2.9.6): an old torch build, or an old system libnccl found first on LD_LIBRARY_PATH.",
          "python -c 'import torch; print(torch.__version__, torch.cuda.nccl.version())'; "
          "echo $LD_LIBRARY_PATH (a libnccl.so.2 there is loaded first)",
          "upgrade torch (its wheels bundle a recent NCCL) or remove the old libnccl from LD_LIBRARY_PATH; or "
          "avoid the operation (SUM then divide instead of AVG)"),
    Cause("nccl-dtype-unsupported", "a tensor dtype NCCL cannot reduce",
          (r"Input tensor data type is not supported for NCCL process group: (?!BFloat16)(?P<dtype>\w{1,40})",),
          "The tensor's dtype ({dtype}) has no NCCL equivalent in this build: complex and some newer dtypes "
          "(unsigned 16/32/64-bit, the float8 variants in older builds) are not passed to NCCL.",
          "print(tensor.dtype) for the tensor the collective gets",
          "cast before the collective and back after (complex: torch.view_as_real, then view_as_complex; "
          "unsigned: a signed type of the next size)"),
    Cause("gloo-hostname-unresolved", "gloo could not resolve this host's name to a usable address",
          (r"Unable to resolve hostname to a \(local\) address\. Using the loopback address",
           r"Cannot resolve (?P<host>\S{1,200}) to a \(local\) address"),
          "gloo picks its network interface from this machine's hostname; the name does not resolve to an "
          "address it can bind (a container or VM whose /etc/hosts lacks its own name), so it fell back to the "
          "loopback address 127.0.0.1. On one machine that works; across machines the other ranks cannot "
          "connect to a loopback address and the job times out or is refused.",
          "getent hosts $(hostname) on each node; ddpdoctor check --only env",
          "set GLOO_SOCKET_IFNAME to the interface the nodes share (ip -br addr), or add the host's name and "
          "address to /etc/hosts",
          # A warning, printed by every gloo job on a machine whose name does not resolve, and harmless on one
          # machine: alone it is a family, never the confident cause of a job that failed for a reason the log
          # names elsewhere (or not at all).
          candidates=(
              ("gloo-hostname-unresolved", "the ranks run on several machines (--nnodes above 1, several hosts in "
                                           "the log) and fail to connect or time out: the others were sent the "
                                           "loopback address"),
              ("earlier-error", "all ranks run on one machine: the fallback to loopback works there and the warning "
                                "is harmless; the job's own error is the other line of the log")),
          undecided="gloo fell back to the loopback address because this machine's name does not resolve: fatal "
                    "across machines (the others cannot reach 127.0.0.1), harmless when all ranks run on one."),
    Cause("monitored-barrier-failed", "a rank did not reach the monitored barrier in time",
          (r"Ranks? (?P<ranks>\d[\d, ]{0,200}) failed to pass monitoredBarrier in \d{1,12} ms",
           r"timed out in monitoredBarrier after \d{1,12} ms",
           r"ProcessGroupWrapper: Monitored Barrier encountered error running collective"),
          "Rank 0's monitored barrier (dist.monitored_barrier, or TORCH_DISTRIBUTED_DEBUG=DETAIL's check before "
          "every collective) did not hear from some ranks within the timeout: they crashed, are stuck in another "
          "collective, or are still busy with work of their own.",
          "the named ranks' own lines: an error or a signal first (crashed), another collective in progress "
          "(desync: ddpdoctor run shows each rank's position), or long work (loading, evaluation)",
          "fix the rank that failed first; make every rank call the same collectives in the same order; move "
          "long single-rank work out of the distributed section or raise the timeout",
          candidates=(
              ("peer-closed", "the named rank printed an error or died by a signal before the barrier: fix that "
                              "rank's failure"),
              ("collective-mismatch", "the named rank is inside another collective (a branch taken on some ranks "
                                      "only): every rank must call the same collectives in the same order"),
              ("slow-rank-timeout", "the named rank is still working (loading, saving, evaluating on one rank): "
                                    "move that work or raise timeout= in init_process_group"))),
    Cause("filestore-timeout", "a rank waited for a key in the file:// store past the timeout",
          (r"Timeout waiting for key: \S{1,200} after \d{1,12} ms",),
          "The file:// rendezvous (FileStore) waited for a key the other ranks never wrote: they do not see "
          "the same file (a path on a local disk of each node rather than a shared file system), or a file left "
          "by an earlier run holds stale keys, or the other ranks never started.",
          "ls -l the init_method file on every node (the same file? left from an earlier run?); the other "
          "ranks' first lines",
          "give init_method='file://' a path on a file system every node shares, and delete the file before "
          "each run (or use a fresh name); or use tcp:// / env:// rendezvous",
          candidates=(
              ("filestore-not-shared", "the ranks run on several nodes and the path is not on a shared file "
                                       "system: each node has its own file"),
              ("filestore-stale", "the file existed before the job started (an earlier run's): delete it or use "
                                  "a new name each run"),
              ("rendezvous-unreachable", "the other ranks never started or failed first: their own logs"))),
    Cause("ddp-static-graph-late", "static_graph set after training started",
          (r"set_static_graph\(\) should be called before training loop starts",),
          "DDP's static graph mode was switched on after at least one iteration ran; it has to be known before "
          "the first forward.",
          "where _set_static_graph() (or static_graph=) is set in your code",
          "pass static_graph=True to DistributedDataParallel(...) instead of calling _set_static_graph() later"),
    # --- end cppmine (specific)
    # --- issue 25: the rest of NCCL's and gloo's own messages, by the source file they name (NCCL prints
    # "file.cc:LINE NCCL WARN", gloo "[enforce fail at gloo/...:LINE]"). Last in the table, and dropped
    # (evidence.AREA) whenever any other cause is found: a family by subsystem, not a diagnosis.
    Cause("nccl-warn-ib", "an NCCL warning from its InfiniBand/RoCE transport",
          (r"(?:net_ib|ibvwrap|ibvcore|ib_plugin|ibvsymbols)[\w./-]{0,80}:\d{1,9} NCCL WARN ",),
          "NCCL's InfiniBand/RoCE code (the file named before 'NCCL WARN') failed a verbs call or a "
          "connection: the fabric, the NIC's settings, or the process's limits.",
          "ibstat and show_gids on every node; ulimit -l inside the job; NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET",
          "the fix of the candidate the WARN line fits",
          candidates=(("nccl-ib-network", "completion errors, ibv_modify_qp, timeouts between two nodes: the "
                                          "fabric or RoCE settings (NCCL_IB_GID_INDEX, NCCL_IB_HCA)"),
                      ("ib-memlock", "'Cannot allocate memory' from ibv_reg_mr/create_cq: ulimit -l too low"),
                      ("nccl-wrong-interface", "no IB device is usable here: NCCL_IB_DISABLE=1 and the socket "
                                               "interface (NCCL_SOCKET_IFNAME) the nodes share"))),
    Cause("nccl-warn-network", "an NCCL warning from its sockets, bootstrap or proxy",
          (r"(?:socket|net_socket|bootstrap|proxy)[\w./-]{0,80}:\d{1,9} NCCL WARN ",),
          "NCCL's socket, bootstrap or proxy code (the file named before 'NCCL WARN') lost or could not make "
          "a connection to a peer: the peer exited, or the network between them refused it.",
          "the first failing rank's own error above; NCCL_DEBUG=INFO's 'NET/Socket : Using' and 'Bootstrap : "
          "Using' lines on every node; nc -zv between the nodes",
          "the fix of the candidate the log fits",
          candidates=(("peer-closed", "another rank's error or exit comes first in the log: fix that rank"),
                      ("nccl-wrong-interface", "connections refused or timing out at start-up: the interface "
                                               "NCCL picked; NCCL_SOCKET_IFNAME"),
                      ("firewall", "the nodes reach each other on some ports only (nc -zv fails on NCCL's "
                                   "ports): open the ports between the nodes or the port range"))),
    Cause("nccl-warn-cuda", "an NCCL warning: a CUDA call inside NCCL failed",
          (r"(?:cudawrap|alloc|mem_manager|enqueue|register|dev_runtime|init)[\w./-]{0,80}:\d{1,9} NCCL WARN ",
           r"NCCL WARN Cuda failure"),
          "A CUDA runtime or driver call made by NCCL failed (the CUDA error is in the message): the driver "
          "and the CUDA NCCL was built for disagree, the GPU is in a bad state, or memory ran out.",
          "nvidia-smi (driver version, Xid errors in dmesg); python -c 'import torch; print(torch.version.cuda, "
          "torch.cuda.nccl.version())'",
          "update the driver to one that supports the wheel's CUDA, reset or drain a GPU with Xid errors, or "
          "free GPU memory before the communicator is created",
          candidates=(
              ("cuda-oom", "the CUDA error is 'out of memory': the GPU was full when NCCL allocated its buffers; "
                           "free memory before the first collective, or lower NCCL_BUFFSIZE"),
              ("gpu-bad-state", "'an illegal memory access', 'unspecified launch failure', 'ECC' or Xid errors in "
                                "dmesg: a kernel before NCCL failed or the GPU is bad; CUDA_LAUNCH_BLOCKING=1 "
                                "names the kernel; reset or drain the GPU"),
              ("cuda-driver-mismatch", "'driver version is insufficient', 'initialization error', 'system not yet "
                                       "initialized': the driver (or the fabric manager) does not fit the wheel's "
                                       "CUDA; nvidia-smi against torch.version.cuda"))),
    Cause("nccl-warn", "an NCCL warning",
          (r"\.(?:cc|cu|h|c):\d{1,9} NCCL WARN ",),
          "NCCL's own warning; the file named before 'NCCL WARN' is the subsystem (graph/ topology, "
          "transport/ the data path, misc/ helpers). Alone it may be harmless; before a failure it is "
          "usually the first sign of it.",
          "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALL (the lines before the WARN); NCCL_TOPO_DUMP_FILE for graph/ warnings",
          "act on the message; if it is a topology warning in a container, give NCCL /sys (or NCCL_TOPO_FILE)",
          # explain6: a WARN no entry reads is a family, never one confident cause (dev5's 511 was named as one)
          candidates=(("nccl-known-bug", "the message is about NCCL's own state (graph/, misc/, enqueue), the same on "
                                         "every rank's setup: a bug of the NCCL release; search NVIDIA/nccl's issues "
                                         "for the message and try a newer NCCL (torch.cuda.nccl.version())"),
                      ("nccl-topology-hidden", "a graph/ or topology warning in a container or VM: NCCL could not "
                                               "read the PCI/NVLink topology; mount /sys or set NCCL_TOPO_FILE"),
                      ("nccl-version-mismatch", "ranks or nodes load different NCCL releases: "
                                                "torch.cuda.nccl.version() on every node"))),
    Cause("gloo-enforce", "gloo refused a call or lost a connection",
          (r"\[(?:enforce fail at )?[^\s\[\]]{0,300}gloo/[^\s\[\]]{0,200}:\d{1,9}\]",),
          "gloo checked something and it did not hold (the message after the file names it): in "
          "transport/tcp a connection to a peer failed or closed (that peer exited or is unreachable); "
          "elsewhere the ranks passed different sizes or counts to the same collective.",
          "transport/tcp: the other ranks' errors and GLOO_SOCKET_IFNAME; otherwise TORCH_DISTRIBUTED_DEBUG=DETAIL "
          "(the shapes each rank passed)",
          "give every rank the same collective arguments; for connection errors, fix the rank that exited first "
          "or the interface (GLOO_SOCKET_IFNAME)",
          # explain6: by the file gloo names (evidence ranks transport/ first), never one confident cause
          candidates=(("gloo-size-mismatch", "the file is not transport/: the ranks passed different sizes or "
                                             "counts to the same collective (TORCH_DISTRIBUTED_DEBUG=DETAIL)"),
                      ("peer-closed", "transport/tcp (a connection closed, reset or refused): another rank exited "
                                      "first; its own error is the cause"),
                      ("gloo-connect-full-mesh", "transport/tcp at start-up on several nodes: gloo picked an "
                                                 "interface or host address the peers cannot reach; "
                                                 "GLOO_SOCKET_IFNAME"))),
    # --- cppmine (issue 25): the rest of torch's C++ (c10d) messages, by the source file c10d names: the
    # exception's "Exception raised from FUNC at .../c10d/FILE:LINE (most recent call first)" line, or the
    # "[E... FILE:LINE]" / "[W... FILE:LINE]" line of a LOG/TORCH_WARN. Families, dropped (evidence.AREA)
    # whenever any other cause is found; the last entries of the table.
    Cause("torch-reducer-error", "DDP's reducer (C++) refused the iteration",
          (r"c10d/(?:reducer\.cpp|reducer\.hpp|logger\.cpp|comm\.cpp|default_comm_hooks\.cpp):\d{1,9} "
           r"\(most recent call first\)",
           r"(?:\[|^)[EF][^\]\[]{0,160}?\b(?:reducer\.cpp|logger\.cpp|comm\.cpp):\d{1,9}\] "),
          "DistributedDataParallel's C++ reducer checked the iteration and refused (the message above the "
          "'Exception raised from' line says what): the gradients, parameters or buckets it saw were not what "
          "it expected, usually because of how the model or the training loop uses DDP.",
          "the message's own words; TORCH_DISTRIBUTED_DEBUG=DETAIL (names the parameters involved)",
          "the fix of the candidate the message fits",
          candidates=(
              ("ddp-unused-parameters", "it speaks of parameters that got no gradient or a reduction not "
                                        "finished: some parameters were not used in the loss; "
                                        "find_unused_parameters=True, or use every output in the loss"),
              ("ddp-model-mismatch", "it speaks of params, sizes or strides that differ between ranks: the ranks "
                                     "built different models (a config or a branch on rank)"),
              ("ddp-api-misuse", "it names a DDP call made twice or at the wrong time (register_comm_hook, "
                                 "static graph, buckets, sparse gradients): change the call as it says"))),
    Cause("torch-store-error", "the c10d store (TCPStore, FileStore) or its sockets failed",
          (r"c10d/(?:TCPStore\.cpp|TCPStore\.hpp|TCPStoreBackend\.cpp|TCPStoreLibUvBackend\.cpp|socket\.cpp|"
           r"FileStore\.cpp|HashStore\.cpp|PrefixStore\.cpp|Store\.cpp|Store\.hpp):\d{1,9} \(most recent call first\)",
           r"(?:\[|^)[EF][^\]\[]{0,160}?\b(?:TCPStore\.cpp|TCPStoreBackend\.cpp|TCPStoreLibUvBackend\.cpp|socket\.cpp|"
           r"FileStore\.cpp):\d{1,9}\] "),
          "The key-value store the ranks meet at (MASTER_ADDR:MASTER_PORT, or the file:// path) failed: a "
          "connection to it could not be made or was lost, a port could not be bound, or a wait ran past the "
          "timeout.",
          "ddpdoctor check --only port on every node; the first rank's own error (often rank 0, which hosts the "
          "store)",
          "the fix of the candidate the message fits",
          candidates=(
              ("rendezvous-unreachable", "'connect', 'timed out ... trying to connect', 'waiting for clients': a "
                                         "rank cannot reach MASTER_ADDR:MASTER_PORT (wrong address, firewall, "
                                         "rank 0 not started)"),
              ("peer-closed", "'Connection reset', '0 bytes', 'Broken pipe' after training began: the store's "
                              "host (rank 0) exited first; fix rank 0's error"),
              ("port-in-use", "'failed to bind' or 'failed to listen' on the server: MASTER_PORT is taken; "
                              "choose a free port"))),
    Cause("torch-nccl-pg-error", "torch's NCCL process group (C++) failed",
          (r"c10d/(?:ProcessGroupNCCL\.cpp|ProcessGroupNCCL\.hpp|NCCLUtils\.cpp|NCCLUtils\.hpp):\d{1,9} "
           r"\(most recent call first\)",
           r"(?:\[|^)[EF][^\]\[]{0,160}?\b(?:ProcessGroupNCCL\.cpp|ProcessGroupNCCL\.hpp|NCCLUtils\.cpp|"
           r"NCCLUtils\.hpp):\d{1,9}\] "),
          "torch's ProcessGroupNCCL raised or logged an error: a collective's arguments were refused, an NCCL "
          "call failed, or the process group was aborted after another failure (a timeout, a peer's exit).",
          "the first error in the log (an NCCL error, a timeout or a rank's own traceback before this line); "
          "NCCL_DEBUG=INFO and TORCH_NCCL_TRACE_BUFFER_SIZE=2000 for more",
          "the fix of the candidate the log fits",
          candidates=(
              ("earlier-error", "another error or a timeout comes earlier in the log ('aborted', 'taking the "
                                "entire process down' are consequences): fix that one"),
              ("collective-arguments", "the message names tensors, dtypes, devices or list sizes: the arguments "
                                       "of the collective (dense CUDA tensors on the rank's GPU, the same sizes "
                                       "on every rank)"),
              ("nccl-watchdog-timeout", "a collective ran past the timeout: one rank stopped or is slower; its "
                                        "own lines say why"))),
    Cause("torch-gloo-pg-error", "torch's gloo process group (C++) refused a collective",
          (r"c10d/(?:ProcessGroupGloo\.cpp|ProcessGroupGloo\.hpp|ProcessGroupWrapper\.cpp|GlooDeviceFactory\.cpp):"
           r"\d{1,9} \(most recent call first\)",
           r"(?:\[|^)[EF][^\]\[]{0,160}?\b(?:ProcessGroupGloo\.cpp|ProcessGroupWrapper\.cpp):\d{1,9}\] "),
          "torch's ProcessGroupGloo (or the TORCH_DISTRIBUTED_DEBUG=DETAIL wrapper around a process group) "
          "refused a collective: its arguments, or what the other ranks passed, did not fit.",
          "the message's own words; TORCH_DISTRIBUTED_DEBUG=DETAIL (checks that every rank calls the same "
          "collective with the same shapes)",
          "the fix of the candidate the message fits",
          candidates=(
              ("collective-arguments", "it names a list, size, device, layout or type: change the call as it "
                                       "says"),
              ("collective-mismatch", "sizes or counts differ between ranks, or a rank ran another collective: "
                                      "every rank must call the same collectives with the same shapes"),
              ("peer-closed", "a connection or a rank named as failed: that rank stopped first; fix its error"))),
    Cause("torch-c10d-error", "torch.distributed's C++ core (c10d) refused a call",
          (r"c10d/(?:ProcessGroup\.cpp|ProcessGroup\.hpp|Backend\.cpp|Backend\.hpp|Work\.cpp|Work\.hpp|Utils\.cpp|"
           r"Utils\.hpp|Ops\.cpp|Functional\.cpp|exception\.h|ProcessGroupMPI\.cpp|ProcessGroupUCC\.cpp):\d{1,9} "
           r"\(most recent call first\)",
           r"(?:\[|^)[EF][^\]\[]{0,160}?\b(?:ProcessGroup\.cpp|ProcessGroup\.hpp|Backend\.hpp|Work\.cpp|Utils\.cpp|"
           r"Utils\.hpp):\d{1,9}\] "),
          "c10d's process group, backend or work object refused a call (the message says what): an operation "
          "the backend does not have, an argument it checks, or a wait that ran past its timeout.",
          "the message's own words and the collective the traceback names; the backend in init_process_group",
          "the fix of the candidate the message fits",
          candidates=(
              ("backend-unsupported-op", "'Backend X does not support Y' or 'No backend type associated with "
                                         "device type': the backend lacks that operation or device; use one that "
                                         "has it (backend='cpu:gloo,cuda:nccl')"),
              ("collective-arguments", "it names split sizes, devices or an environment variable's value: change "
                                       "the call or the value as it says"),
              ("peer-closed", "a socket or connection error: another rank exited first"))),
    Cause("torch-c10d-warning", "a warning printed by torch.distributed's C++ (c10d)",
          (r"(?:\[|^)W[^\]\[]{0,160}?\b(?:reducer\.cpp|logger\.cpp|comm\.cpp|TCPStore\.cpp|TCPStoreBackend\.cpp|"
           r"TCPStoreLibUvBackend\.cpp|socket\.cpp|FileStore\.cpp|ProcessGroupNCCL\.cpp|ProcessGroupNCCL\.hpp|"
           r"NCCLUtils\.cpp|NCCLUtils\.hpp|ProcessGroupGloo\.cpp|ProcessGroupWrapper\.cpp|ProcessGroup\.cpp|"
           r"ProcessGroup\.hpp|Backend\.hpp|Work\.cpp|Utils\.cpp|Utils\.hpp):\d{1,9}\] "
           r"(?!\[c10d\] The IPv6 network addresses of \(localhost,)",),  # that lookup is noise (test_explain_evidence)
          "A warning from torch.distributed's C++ code (DDP's reducer, the store, a process group): it did not "
          "stop the job by itself. When the job failed, the failure is another line of the log.",
          "the warning's own words; the log's first error",
          "act on the warning if it names a setting (find_unused_parameters, GLOO_SOCKET_IFNAME); look for the "
          "first error for the failure"),
    # --- end cppmine (families)
)
