"""The catalogue of known causes: data (id, patterns, meaning, how to confirm, the fix), one entry per cause.

Read by ``ddpdoctor explain`` and by the runner. Entries are matched against the real message texts of
PyTorch, gloo and NCCL; the first entry in table order that matches a line wins, so the most specific
entries come first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Cause", "CAUSES"]

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
    """

    id: str
    title: str
    patterns: tuple
    meaning: str
    confirm: str
    fix: str
    from_ranks: bool = False

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
    Cause("launch-local-rank-arg", "script not ready for torch.distributed.launch (--local-rank)",
          (r"unrecognized arguments:.*--local[-_]rank",),
          "torch.distributed.launch passes --local-rank=N to the script (PyTorch 2.0 and later; --local_rank "
          "before), and the script's argparse does not declare that spelling, so every rank exits with a "
          "usage error (exit code 2) before training starts.",
          "grep -n 'local.rank' in the script's argument parser",
          "declare both spellings: parser.add_argument('--local-rank', '--local_rank', type=int, "
          "default=int(os.environ.get('LOCAL_RANK', 0))); better, launch with torchrun and read "
          "os.environ['LOCAL_RANK'] (torch.distributed.launch is deprecated)"),
    # --- end of issue 14's block
    Cause("no-default-process-group", "default process group not initialized",
          (r"Default process group has not been initialized",),
          "A torch.distributed call (all_reduce, barrier, DistributedDataParallel, get_rank) ran before "
          "init_process_group, or in a process that never called it (a DataLoader worker, an eval script).",
          "ddpdoctor check --only process-group",
          "call torch.distributed.init_process_group(...) first in every rank (guard single-process "
          "code with torch.distributed.is_initialized())"),
    Cause("port-in-use", "address already in use",
          (r"EADDRINUSE", r"[Aa]ddress already in use"),
          "The rendezvous port (MASTER_PORT, --master-port, 29500 by default) is held by another process, "
          "often a previous job that did not exit or a second job on the same node.",
          "ddpdoctor check --only port",
          "pick a free port (torchrun --master-port 0 / --standalone, or export MASTER_PORT) or stop the "
          "process that holds it"),
    Cause("gloo-connect-full-mesh", "gloo could not connect the ranks to each other",
          (r"Gloo connectFullMesh failed", r"gloo/transport/tcp/pair\.cc.*(Connect timeout|ECONNREFUSED|Connection refused|"
           r"connect .* failed)"),
          "The store worked but gloo's rank-to-rank TCP connections failed. On a multi-node job this is "
          "usually a hostname that resolves to a loopback address (127.0.1.1 in /etc/hosts), so peers "
          "are told to connect to themselves; or a firewall between nodes; or the wrong interface.",
          "ddpdoctor check --only process-group (run on every node); getent hosts $(hostname)",
          "set GLOO_SOCKET_IFNAME to the interface the nodes share (e.g. eth0), or fix /etc/hosts so "
          "the hostname resolves to that interface's address"),
    Cause("rendezvous-unreachable", "rendezvous connect timeout or refused",
          (r"client socket has timed out after \d+ms while trying to connect to",
           r"TCP client failed to connect/validate to host",
           r"[Cc]onnection refused",
           r"RendezvousTimeoutError|RendezvousConnectionError",
           r"Timed out after \d+ seconds waiting for clients",
           r"The client socket has failed to connect to any network address"),
          "A rank could not reach the rendezvous store on MASTER_ADDR:MASTER_PORT, or the master waited "
          "for ranks that never arrived: a wrong MASTER_ADDR, a firewall, the master not started yet, "
          "or fewer ranks launched than WORLD_SIZE says.",
          "ddpdoctor check --only port (on every node)",
          "make MASTER_ADDR an address every node can reach, open the port, and launch every node "
          "with the same --nnodes/--nproc-per-node"),
    Cause("nccl-watchdog-timeout", "NCCL watchdog timeout",
          (r"Watchdog caught collective operation timeout", r"ProcessGroupNCCL's watchdog",
           r"WorkNCCL\(SeqNum=\d+.*ran for \d+ milliseconds before timing out"),
          "A collective did not complete within the process group timeout (10 minutes by default). "
          "Almost always one rank is somewhere else (stuck in data loading, a different collective, "
          "an exception swallowed, or dead) and the others wait for it; the rank named in the message "
          "is a waiting rank, not necessarily the culprit.",
          "ddpdoctor stacks (while it hangs), or rerun under ddpdoctor run; read the Flight Recorder "
          "dump (TORCH_NCCL_DUMP_ON_TIMEOUT=1, python -m torch.distributed.flight_recorder.fr_trace)",
          "find the rank whose stack differs and fix what it does; rerun with ddpdoctor run to get the "
          "grouped stacks and the Flight Recorder dump automatically"),
    Cause("nccl-system-error", "NCCL unhandled system error (/dev/shm)",
          (r"unhandled system error", r"ncclSystemError",
           r"Error while creating shared memory segment",
           r"/dev/shm/nccl-"),
          "A system call NCCL needs failed, most often creating shared memory in /dev/shm (Docker's "
          "default is 64 MB), sometimes a socket or an InfiniBand resource.",
          "ddpdoctor check --only env (reports the /dev/shm size); rerun with NCCL_DEBUG=INFO",
          "give the container more shared memory (docker run --shm-size=8g or --ipc=host; Kubernetes: "
          "an emptyDir with medium: Memory on /dev/shm)"),
    Cause("duplicate-gpu", "two ranks on the same GPU",
          (r"Duplicate GPU detected",),
          "Two ranks use the same CUDA device: torch.cuda.set_device(local_rank) was not called (every "
          "rank uses cuda:0), or the global rank was used where the local rank belongs.",
          "ddpdoctor check --only process-group (one GPU per rank)",
          "call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before init_process_group and pass "
          "device_ids=[local_rank] to DistributedDataParallel"),
    Cause("ddp-unused-parameters", "DDP unused parameters",
          (r"Expected to have finished reduction in the prior iteration",),
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
          (r"Detected mismatch between collectives",),
          "With TORCH_DISTRIBUTED_DEBUG=DETAIL, PyTorch checked each collective across ranks and found "
          "ranks calling different operations, shapes or dtypes at the same point: a rank skipped or "
          "added a collective (a rank-dependent if, an uneven last batch).",
          "the message names both ranks' collectives; ddpdoctor stacks shows where each rank is",
          "make every rank call the same collectives in the same order with the same shapes (drop_last=True "
          "or DistributedSampler for uneven data)"),
    Cause("syncbn-cpu", "SyncBatchNorm on CPU or one process",
          (r"SyncBatchNorm expected input tensor to be on GPU",
           r"SyncBatchNorm is only supported within torch\.nn\.parallel\.DistributedDataParallel",
           r"SyncBatchNorm number of input channels should be non-zero"),
          "SyncBatchNorm synchronizes statistics only for GPU (or XPU) tensors in a process group of two "
          "or more ranks; on CPU with gloo it refuses.",
          "ddpdoctor check --only env (devices per rank); ddpdoctor check --only bn-sync (how far plain "
          "BatchNorm statistics drift across ranks)",
          "on CPU keep plain BatchNorm (skip nn.SyncBatchNorm.convert_sync_batchnorm), or move the model "
          "to GPUs with the nccl backend"),
    Cause("cuda-oom-gpu0", "CUDA out of memory on GPU 0",
          (r"CUDA out of memory\..*GPU 0 ", r"CUDA out of memory\..*GPU 0;"),
          "Every rank allocating on GPU 0 fills it: tensors created with device='cuda' before "
          "set_device, or torch.load of a checkpoint saved on cuda:0 without map_location.",
          "ddpdoctor check --only process-group (memory held on a GPU that is not the rank's own)",
          "torch.cuda.set_device(local_rank) first, and torch.load(path, map_location='cpu') (or "
          "map_location=f'cuda:{local_rank}')"),
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
           r"exitcode\s*:\s*-(\d+) \(pid",
           r"(SIG[A-Z]+) received by PID \d+"),
          "A rank process ended by a signal, not an exception.",
          "dmesg | grep -i -e oom -e killed (SIGKILL); ddpdoctor check --only env (memory, /dev/shm)",
          "find who sent the signal: SIGKILL is often the kernel's OOM killer (dmesg | grep -i oom)"),
)
