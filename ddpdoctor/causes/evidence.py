"""Read the evidence around the matched lines: counts, settings and versions the job printed.

The matcher finds causes line by line; this pass reads the whole log once more for the facts that
decide between causes or refine one:

- counts: processes per node (``--nproc-per-node``) against the GPUs the job could see
  (``CUDA_VISIBLE_DEVICES``), Lightning's ``MEMBER: k/N`` lines, the store barrier's
  ``world_size``/``worker_count``;
- settings already on: ``find_unused_parameters=True`` in the log means that advice was taken;
- versions and names: the GPU's ``sm_XX`` against the build's list, the NCCL wheels ``pip list``
  printed, the interface named in ``*_SOCKET_IFNAME``, Windows paths;
- what a timeout waited for: a long task's progress line on one rank (tokenizing, loading weights);
- which reading of NCCL's "remote process exited or there was a network error" the log supports.

A specific cause found in the same log makes the generic one that reports the same failure
redundant (``nccl-system-error`` next to ``shm-too-small``); the generic is then dropped, so that
``explain`` never states two causes for one failure. When the log does not decide between two
causes, both are said, with how to tell them apart.

Linear in the log: one pass over the lines, each cut at 4 KB, with simple patterns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from ddpdoctor.causes.versions import known_nccl_bug, outdated_nccl, version_facts
from ddpdoctor.system.redact import shorten
from ddpdoctor.system.stackframes import is_user, shown_path

__all__ = ["AREA", "DERIVED", "Evidence", "gather", "gather_more", "refine"]

# Causes with no line pattern of their own: only this pass finds them, from the evidence around another match.
DERIVED = ("slow-rank-timeout", "ddp-unused-already-on", "torch-distributed-error",
           "accelerate-error", "lightning-device-index-bug")
# Families by the source file an NCCL WARN or a gloo enforce names (catalogue's last entries).
AREA = ("nccl-warn-ib", "nccl-warn-network", "nccl-warn-cuda", "nccl-warn", "gloo-enforce", "torch-distributed-error",
        "accelerate-error",
        # explain6: a warning that is the cause only when nothing else is, and NCCL's internal error (no cause named)
        "barrier-device-unknown", "nccl-internal-error")
AREA += ("torch-reducer-error", "torch-store-error", "torch-nccl-pg-error", "torch-gloo-pg-error",  # cppmine
         "torch-c10d-error", "torch-c10d-warning")
# Where a Python exception was raised, by the last frame above it: the area family it belongs to.
_RAISED_IN = (("/torch/distributed/", "torch-distributed-error"), ("/torch/nn/parallel/", "torch-distributed-error"),
              ("/torch/multiprocessing/", "torch-distributed-error"), ("/accelerate/", "accelerate-error"))
_EXC = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception)\b:.*)")

MAX_LINE = 4096
_KEPT = 400  # the characters of a line kept as evidence; shown shortened, after redaction (shorten)

_NPROC = re.compile(r"--nproc[-_]per[-_]node[= ](\d{1,9})(?!\d)")
_NNODES = re.compile(r"--nnodes[= ](\d{1,9})(?!\d)")
_VISIBLE = re.compile(r"CUDA_VISIBLE_DEVICES=([0-9][0-9,]*)")
_FIND_UNUSED_ON = re.compile(r"find_unused_parameters\s*=\s*True")
_SYNCBN_FRAME = re.compile(r"batchnorm\.py\", line \d+, in forward|sync_bn|SyncBatchNorm|SyncBN")
_ERRNO13 = re.compile(r"\[Errno 13\] Permission denied")
_SEMLOCK = re.compile(r"SemLock|multiprocessing/synchronize\.py")
_LONG_TASK = re.compile(r"Running tokenizer|Tokeniz|Loading checkpoint shards|Loading safetensors|Load weight|"
                        r"Saving checkpoint|Validat|Evaluat|Preprocess|Caching|Filter|Map\b")
_ELAPSED = re.compile(r"\[(?:(\d{1,9}):)?(\d{1,9}):(\d\d)<")
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(\d{1,18})(?!\d)")
_SIGNAL = re.compile(r"Signal \d+ \((SIG[A-Z0-9]+)\) received|\((SIG(?:SEGV|ABRT|BUS|KILL|ILL|FPE))\)")
_NET_LAST = re.compile(r"NET/IB|Connection reset by peer|Broken pipe|ibv_|NET/OFI")
_IFNAME = re.compile(r"(NCCL|GLOO)_SOCKET_IFNAME(?: set by environment to |=)(\S+)")
_NO_ADDR = re.compile(r"Unable to find address for: (\S+)")
_SLURM = re.compile(r"^srun: |slurmstepd|SLURM_|#SBATCH")
_MEMBER = re.compile(r"GLOBAL_RANK: (\d{1,9}), MEMBER: \d+/(\d{1,9})(?!\d)")
_HANG_END = re.compile(r"DUE TO TIME LIMIT|timed out|Timed out|Watchdog caught")
_STORE_BARRIER = re.compile(r"world_size=(\d{1,9}), worker_count=(\d{1,9})(?!\d)")
_ARCH = re.compile(r"with CUDA capability (sm_\d+)")
_ARCH_LIST = re.compile(r"supports CUDA capabilities ((?:sm_\d+ ?|compute_\d+ ?)+)")
_OLD_GPU = re.compile(r"which is of cuda capability (\d+\.\d+)")
_PIP_NCCL = re.compile(r"nvidia-nccl-(cu\d+)\s+(\d[\w.]*)")
_LD_NCCL = re.compile(r"LD_LIBRARY_PATH.*nccl|/nccl-?[\d.]+/lib")
_WINDOWS = re.compile(r"[A-Z]:\\\\|[A-Z]:\\[A-Za-z]|\.exe\b|Windows")
_LR_PASSED = re.compile(r"unrecognized arguments: ((?:--|[\u2013\u2014]-?)local[-_]rank)")
_LR_DECLARED = re.compile(r"\[(--local[-_]rank) ")
_MEM_LINE = re.compile(r"CPU Virtual Memory:.*percent = (\d+(?:\.\d+)?)%")
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d{1,7})\b")
_SUMMARY_SIGNAL = re.compile(r"^\s*exitcode\s*:\s*-(\d{1,3})\b")
_SHM_SIGN = re.compile(r"shm_open|/dev/shm|shared memory segment|Bus error|SIGBUS")
_DOCKER_SIGN = re.compile(r"\b172\.1[7-9]\.\d{1,3}\.\d{1,3}\b|\bdocker\b|--network|\bveth\w|\bcontainers?\b", re.I)
# What tells the readings of "busy or unavailable" and "Duplicate GPU detected" apart.
_DRIVER_SIGN = re.compile(r"CUDA driver version is insufficient|driver on your system is too old|"
                          r"Driver/library version mismatch|Found no NVIDIA driver|NVIDIA driver.{0,60}?"
                          r"(?:too old|not (?:installed|loaded)|failed)", re.I)
_EXCLUSIVE_SIGN = re.compile(r"Exclusive_Process|E\. Process|EXCLUSIVE_PROCESS|exclusive[ -]process", re.I)
# A framework assigned the GPUs: accelerate's state lines, or Ray's workers (verl, vLLM run on Ray).
_ACCELERATE_SIGN = re.compile(r"Distributed environment: MULTI_GPU|accelerate launch|/accelerate/")
_RAY_SIGN = re.compile(r"\bray(?:\.exceptions|::| start|_pkg|/session_)|\bRay(?:Worker|Actor|Task)|\(\w+ pid=\d+\)")
_BAR = re.compile(r"\d%\|")  # a tqdm bar: "35%|####"
# Which port "address already in use" was about: one the program chose (a tcp:// init method, MASTER_PORT set in
# code, a plain `python x.py` that opens the store itself) or the launcher's (torchrun, launch, accelerate,
# deepspeed, env:// rendezvous, --master-port).
_PORT_CODE = re.compile(r"_tcp_rendezvous_handler|init_method\s*=\s*['\"]?tcp://|--(?:dist[-_]url|init[-_]method)[= ]"
                        r"['\"]?tcp://|\btcp://[\w.\-]{1,100}:\d{2,5}|os\.environ\[['\"]MASTER_PORT['\"]\]\s*=")
_PORT_LAUNCHER = re.compile(r"\btorchrun\b|torch\.distributed\.(?:launch|run|elastic)\b|/distributed/(?:elastic|launcher)/|"
                            r"\baccelerate(?:-launch| launch)\b|--master[-_]port|--main[-_]process[-_]port|"
                            r"_env_rendezvous_handler|\bdeepspeed(?:\.launcher\b|\s)")
_PLAIN_PY = re.compile(r"^\s{0,8}(?:[>$#+]\s{0,4})?(?:[A-Za-z_]\w{0,60}=\S{0,200}\s+){0,8}python[\d.]{0,6}\s+(?:-u\s+)?"
                       r"(?!-m\b)\S{1,300}\.py\b")
# "Tensors must be CUDA and dense": what the log shows about the tensor.
_CPU_WRAPPED = re.compile(r"DistributedDataParallel\([^()]{0,200}\)\.cuda\(\)")
_SPARSE_SIGN = re.compile(r"sparse=True|\.is_sparse|Sparse(?:CUDA|CPU)\b|sparse_coo_tensor|to_sparse\(")
# Out of memory on GPU 0 shared by several processes: the allocator lists each ("Process 2201 has 11.80 GiB memory
# in use"), or a rank other than 0 reports GPU 0.
_OOM_PROCS = re.compile(r"Process \d{1,9} has ")
_OOM_RANK = re.compile(r"^\s*\[(?:rank|default)(\d{1,9})\]")
# nvidia-smi's process table: "|    0     62250      C   /usr/bin/python3.6     4903MiB |" (GI/CI columns since 450).
_SMI_ROW = re.compile(r"^\W{0,4}\|\s+(\d{1,2})\s+(?:N/A\s+N/A\s+)?(\d{1,9})\s+(?:C\+G|C|G)\s+\S")
_SMI_MAX = 4096  # rows kept: bounded memory on any log
# "cannot pickle 'X' object": a new process (spawn) or a save or copy, by the traceback's frames.
_SPAWN_SIGN = re.compile(r"multiprocessing/reduction\.py|ForkingPickler|popen_spawn|multiprocessing/spawn\.py|"
                         r"ddp_spawn|DDPSpawn|_MultiProcessingDataLoaderIter|mp\.spawn\(")
_SAVE_SIGN = re.compile(r"torch/serialization\.py|/copy\.py\b|\bdeepcopy\(|\btorch\.save\(")
_TERMINATE = "terminate called without an active exception"
# "marked ready twice": activation checkpointing in the traceback or the config.
_CHECKPOINTING = re.compile(r"utils/checkpoint\.py|gradient_checkpointing|use_reentrant|CheckpointFunction|"
                            r"activation_checkpoint|checkpoint_sequential")
# "no kernel image": a compiled extension's frame or name in the traceback.
_EXTENSION = re.compile(r"site-packages/(?:apex|mmcv|flash_attn|deepspeed/ops|xformers|detectron2|bitsandbytes|"
                        r"spconv|torch_scatter|torch_sparse|pointnet2|nvdiffrast)\b|_C\.\w+\.so|_ext\b")
_TB_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
# ddpdoctor's own errors: the cause and the exception names that stand for it.
_OWN_ERRORS = {"ddpdoctor-desync": ("DesyncError",),
               "ddpdoctor-collective-mismatch": ("CollectiveMismatchError", "CollectiveTimeoutError")}
# A rank killed by a signal, when nothing else in the log decides: the causes it may be, commonest first.
_SIGNAL_FAMILIES = {
    "SIGKILL": (("host-oom", "the node's kernel log names it: dmesg -T | grep -i -e oom -e 'killed process'; "
                             "host memory grows with ranks x DataLoader workers"),
                ("scheduler-kill", "the scheduler stopped it at a time or memory limit: sacct -j JOB -o "
                                   "State,ExitCode,MaxRSS (Slurm), OOMKilled in kubectl describe pod"),
                ("peer-closed", "torchrun stopped this rank after another failed: that rank's error comes first")),
    "SIGSEGV": (("library-version-mismatch", "a native extension built for another torch/CUDA/NCCL (apex, "
                                             "deepspeed ops, flash-attn, a second NCCL): python -X faulthandler "
                                             "names the library in the crashing frame"),
                ("nccl-p2p-shm", "NCCL's GPU peer-to-peer or shared-memory transport on this machine: it passes "
                                 "with NCCL_P2P_DISABLE=1 (then NCCL_SHM_DISABLE=1)")),
}
# explain6: a timeout's uneven inputs; the GPUs' physical numbers a job made visible; a checkpoint's key prefixes.
_UNEVEN_SIGN = re.compile(r"IterableDataset|[Uu]neven (?:inputs|data|batch|number|dataset|shard)|"
                          r"different numbers? of (?:batches|samples|steps|iterations)")
_VISIBLE_IDS = re.compile(r"(?:CUDA_VISIBLE_DEVICES=|VISIBLE GPUS: )['\"]?(\d{1,3}(?:, ?\d{1,3}){0,63})(?!\d)")
_LIGHTNING_SIGN = re.compile(r"pytorch_lightning|lightning[./:]|INFO:lightning")
_TIMEOUTS = ("nccl-watchdog-timeout", "store-timeout", "gloo-recv-timeout")
_IFACE_NAME = re.compile(r"(?:eth|en|eno|ens|enp|ib|bond|lo|wl|br|docker|veth|team|hsn|mlx)\w*")


@dataclass
class Evidence:
    """The facts one pass over the log found (``None``/empty when the log does not say)."""

    nproc: Optional[int] = None
    visible_gpus: Optional[int] = None
    find_unused_on: str = ""
    syncbn: bool = False
    errno13: str = ""
    semlock: bool = False
    long_task: str = ""
    long_task_s: int = 0
    timeout_ms: Optional[int] = None
    crash_signals: list = field(default_factory=list)
    net_last_error: str = ""
    ifnames: list = field(default_factory=list)
    slurm: bool = False
    members: set = field(default_factory=set)
    member_world: Optional[int] = None
    hang_end: bool = False
    barrier_counts: Optional[tuple] = None
    gpu_arch: str = ""
    build_archs: str = ""
    old_gpu_cc: str = ""
    pip_nccl: list = field(default_factory=list)
    ld_nccl: bool = False
    windows: bool = False
    lr_passed: str = ""
    lr_declared: str = ""
    host_mem_pct: Optional[float] = None
    signalled: dict = field(default_factory=dict)  # rank -> signal number, from torchrun's failure summary
    shm_sign: str = ""       # a line about shared memory (shm_open, /dev/shm, a bus error)
    docker_sign: str = ""    # a line showing containers (Docker bridge addresses, docker, veth)
    bar_s: int = 0           # the longest elapsed time of a progress bar that had not finished
    bar_line: str = ""
    driver_sign: str = ""     # the NVIDIA driver is missing, broken or older than the build's CUDA
    exclusive_sign: str = ""  # the GPUs are in exclusive-process compute mode
    accelerate_sign: str = ""  # accelerate assigned the devices (its state lines)
    ray_sign: str = ""        # Ray workers assigned the devices
    port_code_sign: str = ""  # the program chose the port (tcp:// init, MASTER_PORT set in code)
    port_launcher_sign: str = ""  # a launcher opened the store (torchrun, env://, --master-port)
    plain_python: str = ""    # a command line running a script with plain python, no launcher
    cpu_decisive: str = ""    # a line that says the tensor or model is on the CPU
    sparse_sign: str = ""     # a sparse tensor in the log
    oom_shared: str = ""      # an out-of-memory on GPU 0 listing several processes, or from a rank other than 0
    smi_rows: dict = field(default_factory=dict)  # nvidia-smi's process table: GPU index -> set of PIDs
    smi_line: str = ""        # its first row on GPU 0
    error_before_abort: str = ""  # a Python traceback before "terminate called without an active exception"
    spawn_sign: str = ""      # the pickling was multiprocessing's: a new process (spawn, DataLoader workers)
    save_sign: str = ""       # the pickling was a save or a copy (torch.save, copy.deepcopy)
    checkpointing: str = ""   # activation checkpointing in the traceback or config
    extension: str = ""       # a compiled extension in the traceback
    uneven_sign: str = ""     # explain6: a line showing the ranks' data may be uneven (an IterableDataset)
    visible_ids: tuple = ()   # the GPUs' physical numbers the job made visible (CUDA_VISIBLE_DEVICES=6,7)
    lightning_sign: str = ""  # Lightning in the log
    module_keys: str = ""     # a checkpoint key starting with 'module.'
    compiled_keys: str = ""   # a checkpoint key starting with '_orig_mod.'
    size_mismatch: str = ""   # load_state_dict's 'size mismatch for'


def gather(lines: Sequence[str]) -> Evidence:
    """One pass over the lines (each cut at 4 KB). Each regex runs only on the lines that hold the text it
    cannot match without (``in`` costs a tenth of a regex call): the same answer, several times faster."""
    ev = Evidence()
    summary_rank: Optional[int] = None
    for raw in lines:
        line = raw[:MAX_LINE]
        if "rank" in line or "exitcode" in line:  # torchrun's failure summary: rank : N, then exitcode : -S
            m = _SUMMARY_RANK.match(line)
            if m:
                summary_rank = int(m.group(1))
            m = _SUMMARY_SIGNAL.match(line)
            if m and summary_rank is not None:
                ev.signalled.setdefault(summary_rank, int(m.group(1)))
        if "--nproc" in line:
            m = _NPROC.search(line)
            if m:
                ev.nproc = int(m.group(1))
        if "CUDA_VISIBLE_DEVICES=" in line:
            m = _VISIBLE.search(line)
            if m:
                ev.visible_gpus = len([d for d in m.group(1).split(",") if d])
        if "find_unused_parameters" in line:
            if ("keyword argument" not in line and "`find_unused" not in line
                    and "strategy=DDPStrategy(find_unused" not in line  # Lightning's advice (explain6)
                    and _FIND_UNUSED_ON.search(line)):
                ev.find_unused_on = ev.find_unused_on or line.strip()[:_KEPT]
            elif not ev.find_unused_on and "Since `find_unused_parameters=True` is enabled" in line:
                # the reducer's newer wording says the setting is on: keep the words that say so
                ev.find_unused_on = line[line.index("Since `find_unused"):].strip()[:_KEPT]
        if not ev.syncbn and ("batchnorm.py" in line or "sync_bn" in line or "SyncB" in line) \
                and _SYNCBN_FRAME.search(line):
            ev.syncbn = True
        if not ev.errno13 and "[Errno 13]" in line and _ERRNO13.search(line):
            ev.errno13 = line.strip()[:_KEPT]
        if not ev.semlock and ("SemLock" in line or "synchronize.py" in line) and _SEMLOCK.search(line):
            ev.semlock = True
        if "<" in line and _LONG_TASK.search(line):
            m = _ELAPSED.search(line)  # a progress bar's elapsed time: [29:55<4:48:08
            secs = (int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + int(m.group(3))) if m else 0
            if secs > ev.long_task_s:
                ev.long_task, ev.long_task_s = line.strip()[:_KEPT], secs
        if "|" in line and "<" in line and "100%|" not in line and _BAR.search(line):
            m = _ELAPSED.search(line)
            secs = (int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + int(m.group(3))) if m else 0
            if secs > ev.bar_s:
                ev.bar_s, ev.bar_line = secs, line.strip()[:_KEPT]
        if not ev.shm_sign and ("shm" in line or "Bus error" in line or "SIGBUS" in line or "shared memory" in line) \
                and _SHM_SIGN.search(line):
            ev.shm_sign = line.strip()[:_KEPT]
        if not ev.docker_sign and ("172.1" in line or "ocker" in line or "veth" in line or "ontainer" in line
                                   or "--network" in line) and _DOCKER_SIGN.search(line):
            ev.docker_sign = line.strip()[:_KEPT]
        if not ev.driver_sign and ("driver" in line or "Driver" in line) and _DRIVER_SIGN.search(line):
            ev.driver_sign = line.strip()[:_KEPT]
        if not ev.exclusive_sign and ("xclusive" in line or "XCLUSIVE" in line or "E. Process" in line) \
                and _EXCLUSIVE_SIGN.search(line):
            ev.exclusive_sign = line.strip()[:_KEPT]
        if not ev.accelerate_sign and ("ccelerate" in line or "MULTI_GPU" in line) and _ACCELERATE_SIGN.search(line):
            ev.accelerate_sign = line.strip()[:_KEPT]
        if not ev.ray_sign and ("ray" in line or "Ray" in line or " pid=" in line) and _RAY_SIGN.search(line):
            ev.ray_sign = line.strip()[:_KEPT]
        if "Timeout(ms)=" in line and ev.timeout_ms is None:
            m = _TIMEOUT_MS.search(line)
            if m:
                ev.timeout_ms = int(m.group(1))
        if "SIG" in line:
            m = _SIGNAL.search(line)
            if m:
                sig = m.group(1) or m.group(2)
                if sig not in ("SIGTERM", "SIGINT", "SIGHUP") and sig not in ev.crash_signals:
                    ev.crash_signals.append(sig)
        if not ev.net_last_error and ("NET/" in line or "Connection reset" in line or "Broken pipe" in line
                                      or "ibv_" in line) and _NET_LAST.search(line):
            ev.net_last_error = line.strip()[:_KEPT]
        if "SOCKET_IFNAME" in line:
            m = _IFNAME.search(line)
            if m and (m.group(1), m.group(2)) not in ev.ifnames:
                ev.ifnames.append((m.group(1), m.group(2)))
        if "Unable to find address for" in line:
            m = _NO_ADDR.search(line)
            if m and not any(v == m.group(1) for _, v in ev.ifnames):
                ev.ifnames.append(("lookup", m.group(1)))  # an interface name, or a host name gloo looked up
        if not ev.slurm and ("srun: " in line or "slurmstepd" in line or "SLURM_" in line or "#SBATCH" in line) \
                and _SLURM.search(line):
            ev.slurm = True
        if "MEMBER:" in line:
            m = _MEMBER.search(line)
            if m:
                ev.members.add(int(m.group(1)))
                ev.member_world = int(m.group(2))
        if not ev.hang_end and ("DUE TO TIME LIMIT" in line or "imed out" in line or "Watchdog caught" in line) \
                and _HANG_END.search(line):
            ev.hang_end = True
        if "worker_count=" in line:
            m = _STORE_BARRIER.search(line)
            if m:
                ev.barrier_counts = (int(m.group(1)), int(m.group(2)))
        if "CUDA capabilit" in line or "cuda capability" in line:
            for rx, attr in ((_ARCH, "gpu_arch"), (_ARCH_LIST, "build_archs"), (_OLD_GPU, "old_gpu_cc")):
                m = rx.search(line)
                if m and not getattr(ev, attr):
                    setattr(ev, attr, m.group(1).strip())
        if "nvidia-nccl-" in line:
            m = _PIP_NCCL.search(line)
            if m and m.groups() not in ev.pip_nccl:
                ev.pip_nccl.append(m.groups())
        if not ev.ld_nccl and "nccl" in line and _LD_NCCL.search(line):
            ev.ld_nccl = True
        if not ev.windows and (":\\" in line or ".exe" in line or "Windows" in line) and _WINDOWS.search(line):
            ev.windows = True
        if "local" in line and ("-local" in line or "\u2013local" in line or "\u2014local" in line):  # dashes as typed
            m = _LR_PASSED.search(line)
            if m:
                ev.lr_passed = m.group(1)
            m = _LR_DECLARED.search(line)
            if m:
                ev.lr_declared = m.group(1)
        if "CPU Virtual Memory" in line:
            m = _MEM_LINE.search(line)
            if m:
                ev.host_mem_pct = float(m.group(1))
        if not ev.uneven_sign and ("terable" in line or "neven" in line or "different number" in line) \
                and _UNEVEN_SIGN.search(line):
            ev.uneven_sign = line.strip()[:_KEPT]
        if not ev.visible_ids and "VISIBLE" in line:
            m = _VISIBLE_IDS.search(line)
            if m:
                ev.visible_ids = tuple(int(d) for d in m.group(1).replace(" ", "").split(","))
        if not ev.lightning_sign and "ightning" in line and _LIGHTNING_SIGN.search(line):
            ev.lightning_sign = line.strip()[:_KEPT]
        if "module." in line or "_orig_mod." in line or "size mismatch for" in line:
            if not ev.module_keys and ('"module.' in line or "'module." in line) and 'File "' not in line:
                ev.module_keys = line.strip()[:_KEPT]
            if not ev.compiled_keys and "_orig_mod." in line:
                ev.compiled_keys = line.strip()[:_KEPT]
            if not ev.size_mismatch and "size mismatch for" in line:
                ev.size_mismatch = line.strip()[:_KEPT]
    return ev


def gather_more(lines: Sequence[str], ev: Evidence, port: bool, tensor: bool, memory: bool,
                abort: bool = False, pickle: bool = False, twice: bool = False, kernel: bool = False) -> None:
    """A second pass, only when a cause in play needs it (most logs never pay for it): who chose the port of
    "address already in use" (``port``), what the log shows of a tensor NCCL refused (``tensor``), GPU 0
    shared by several processes (``memory``: the out-of-memory line, nvidia-smi's process table), a Python
    traceback before a C++ abort (``abort``), who pickled an object that cannot be pickled (``pickle``),
    activation checkpointing beside "marked ready twice" (``twice``), an extension beside "no kernel image"
    (``kernel``)."""
    if not (port or tensor or memory or abort or pickle or twice or kernel):
        return
    traceback = ""
    for raw in lines:
        line = raw[:MAX_LINE]
        if abort:
            if "Traceback (most recent call last)" in line:
                traceback = traceback or line.strip()[:_KEPT]
            elif traceback and ("Error" in line or "Exception" in line) and _EXC.match(line.strip()):
                traceback = line.strip()[:_KEPT]  # the exception the traceback ends in says more than its header
            elif _TERMINATE in line:
                ev.error_before_abort, abort = traceback, False  # only what came before the first abort counts
        if twice and not ev.checkpointing and ("heckpoint" in line or "reentrant" in line) \
                and _CHECKPOINTING.search(line):
            ev.checkpointing = line.strip()[:_KEPT]
        if kernel and not ev.extension and ("site-packages/" in line or "_ext" in line or "_C." in line) \
                and _EXTENSION.search(line):
            ev.extension = line.strip()[:_KEPT]
        if pickle:
            if not ev.spawn_sign and ("multiprocessing" in line or "Pickler" in line or "spawn" in line
                                      or "Spawn" in line or "MultiProcessing" in line) and _SPAWN_SIGN.search(line):
                ev.spawn_sign = line.strip()[:_KEPT]
            if not ev.save_sign and ("serialization" in line or "copy" in line or "save(" in line) \
                    and _SAVE_SIGN.search(line):
                ev.save_sign = line.strip()[:_KEPT]
        if port:
            if not ev.port_code_sign and ("tcp" in line or "MASTER_PORT" in line) and _PORT_CODE.search(line):
                ev.port_code_sign = line.strip()[:_KEPT]
            if not ev.port_launcher_sign and ("torchrun" in line or "distributed" in line or "accelerate" in line
                                              or "--ma" in line or "deepspeed" in line) and _PORT_LAUNCHER.search(line):
                ev.port_launcher_sign = line.strip()[:_KEPT]
            if not ev.plain_python and "python" in line and ".py" in line and _PLAIN_PY.match(line):
                ev.plain_python = line.strip()[:_KEPT]
        if tensor:
            if not ev.cpu_decisive and ("device type cpu" in line or "device(type='cpu')" in line
                                        or (".cuda()" in line and _CPU_WRAPPED.search(line))):
                ev.cpu_decisive = line.strip()[:_KEPT]
            if not ev.sparse_sign and "parse" in line and _SPARSE_SIGN.search(line):
                ev.sparse_sign = line.strip()[:_KEPT]
        if memory:
            if not ev.oom_shared and "CUDA out of memory" in line and "GPU 0" in line:
                m = _OOM_RANK.match(line)
                if len(_OOM_PROCS.findall(line)) >= 2 or (m and int(m.group(1)) != 0):
                    ev.oom_shared = line.strip()[:_KEPT]
            if "|" in line and (" C " in line or " G " in line or " C+G " in line):
                m = _SMI_ROW.match(line)
                if m and sum(len(p) for p in ev.smi_rows.values()) < _SMI_MAX:
                    ev.smi_rows.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
                    if m.group(1) == "0" and not ev.smi_line:
                        ev.smi_line = line.strip()[:_KEPT]


# A specific cause explains the lines the generic one matched: the generic is dropped when both are found.
SUBSUMED_BY = {
    "nccl-system-error": ("shm-too-small", "shm-permission", "nccl-wrong-interface", "nccl-ib-network",
                          "socket-ifname-missing", "nccl-remote-error"),
    "shm-too-small": ("shm-permission",),
    "dataloader-worker-exited": ("shm-too-small", "shm-permission", "host-oom", "dataloader-worker-killed"),
    "dataloader-worker-killed": ("host-oom",),  # explain7: the OOM killer's own line decides the family
    "store-connect-timeout": ("master-host-unresolved", "nccl-wrong-interface", "slurm-tasks-mismatch",
                              "gloo-connect-full-mesh", "gloo-hostname-unresolved", "socket-ifname-missing"),
    "rendezvous-unreachable": ("master-host-unresolved", "nccl-wrong-interface", "slurm-tasks-mismatch"),
    "connection-refused": ("rendezvous-unreachable", "store-connect-timeout", "master-host-unresolved", "nccl-wrong-interface",
                           "socket-ifname-missing", "slurm-tasks-mismatch", "nccl-remote-error", "nccl-ib-network"),
    "pickle-error": ("spawn-pickle",),
    "peer-closed": ("nccl-remote-error", "nccl-ib-network", "nccl-wrong-interface"),
    "store-timeout": ("slow-rank-timeout", "uneven-inputs"),
    "nccl-watchdog-timeout": ("slow-rank-timeout", "uneven-inputs"),
    "no-default-process-group": ("syncbn-single-process",),
    "ddp-unused-parameters": ("ddp-unused-already-on",),
    "duplicate-gpu": ("more-ranks-than-gpus",),
    "cuda-devices-busy": ("cuda-driver-mismatch",),
    # explain6
    "gloo-recv-timeout": ("slow-rank-timeout", "uneven-inputs"),
    "nccl-unhandled-cuda": ("cuda-driver-mismatch", "cuda-arch-unsupported", "nccl-library-mismatch", "nvls-fabric-manager",
                            "nccl-not-built"),
    "state-dict-mismatch": ("state-dict-module-prefix",),
    "more-ranks-than-gpus": ("lightning-device-index-bug",),
    "too-many-open-files": ("fd-sharing-limit",),
    "nccl-internal-error": ("nccl-warn-ib", "nccl-warn-network", "nccl-warn-cuda", "nccl-warn"),
}
# cppmine: gloo's loopback fallback is the warning before the connection failure that explains it (and fixes it alike)
SUBSUMED_BY["gloo-hostname-unresolved"] = ("gloo-connect-full-mesh",)
# killed-by-signal is redundant only next to the cause its signal stands for.
_SIGNAL_OWNER = {"SIGKILL": "host-oom", "SIGBUS": "shm-too-small"}


def _caller_line(lines: Sequence[str], names: tuple) -> str:
    """``func (file:line)``: the user's innermost frame in the traceback that ends in one of ``names``."""
    last = ""
    for raw in lines:
        line = raw[:MAX_LINE]
        if "Traceback (most recent call last)" in line:
            last = ""
        elif 'File "' in line:
            m = _TB_FRAME.search(line)
            if m and is_user(m.group("file")):
                last = f"{m.group('func')} ({shown_path(m.group('file'))}:{m.group('line')})"
        elif last and any(n in line for n in names):
            return last
    return ""


def _raised_in(lines: Sequence[str]) -> tuple:
    """(cause id, module, exception line, the user's line) for the first exception raised inside torch's
    distributed code or accelerate, read from its traceback; () when there is none."""
    frame, user = "", ""
    for raw in lines:
        line = raw[:MAX_LINE]
        if 'File "' in line:
            m = _TB_FRAME.search(line)
            if m:
                frame = m.group("file")
                if is_user(frame):
                    user = f"{m.group('func')} ({shown_path(frame)}:{m.group('line')})"
            continue
        if frame and ("Error" in line or "Exception" in line):
            m = _EXC.match(line.strip())
            if m:
                for part, cid in _RAISED_IN:
                    if part in frame:
                        module = frame.split("site-packages/")[-1].replace("/", ".").removesuffix(".py")
                        return cid, module, m.group(1), user
                frame = ""
    return ()


def _rank_first(found: dict, family: str, cid: str, line: str) -> None:
    """Put candidate ``cid`` first in ``family``'s list when the log holds ``line`` as evidence for it."""
    m = found.get(family)
    if m is None or not line or not m.candidates:
        return
    ranked = m.candidates
    pick = [c for c in ranked if c[0] == cid]
    if pick:
        m.ranked = pick + [c for c in ranked if c[0] != cid]
        why = f"This log points at {cid}: '{shorten(line, 100)}'."
        if why not in m.extra:
            m.extra = f"{m.extra} {why}".strip()


def _read_explain6(lines: Sequence[str], found: dict, ev: Evidence, add: Callable, note: Callable, crashed: list,
                   too_many: bool) -> None:
    """explain6's readings: a known bug of the NCCL release the log prints, uneven inputs behind a timeout, a GPU's
    physical number used where CUDA renumbers them, and which prefix a checkpoint's keys carry."""
    # A known bug of the NCCL release the log prints: said as a fact, and that candidate goes first (the family stays
    # a family: the table names releases, not this job's failure).
    for family in ("nccl-bootstrap-truncated", "nccl-unhandled-cuda", "nccl-graph-mismatch"):
        if family in found:
            fact = known_nccl_bug(lines, family)
            if fact:
                _rank_first(found, family, "nccl-known-bug", fact)
                note(family, fact)
    if "nccl-unhandled-cuda" in found and ev.driver_sign:
        _rank_first(found, "nccl-unhandled-cuda", "cuda-driver-mismatch", ev.driver_sign)
    # A timeout in a job whose ranks may hold different numbers of batches (an IterableDataset): uneven inputs
    # first, with the two other readings of a timeout; a long task's progress line (slow-rank-timeout) wins.
    timed_out = [c for c in _TIMEOUTS if c in found]
    if timed_out and ev.uneven_sign and "slow-rank-timeout" not in found and "uneven-inputs" not in found:
        m = found[timed_out[0]]
        how = ("the log shows data that may split unevenly across ranks ('" + shorten(ev.uneven_sign, 80) + "'): the "
               "rank with fewer batches stopped issuing collectives; give every rank the same number of batches, or "
               "DDP's join() (with model.join():)")
        m.ranked = [("uneven-inputs", how)] + [c for c in m.cause.candidates if c[0] in ("slow-rank-timeout",
                                                                                         "peer-closed")][:2]
        note(timed_out[0], f"This log points at uneven-inputs: '{shorten(ev.uneven_sign, 100)}'.")
    if "gloo-recv-timeout" in found and crashed:
        _rank_first(found, "gloo-recv-timeout", "peer-closed", f"a rank died by {crashed[0]}")
    # "invalid device ordinal" while the job made GPUs visible by physical numbers that do not start at 0: the
    # device was picked by its physical number; with Lightning in the log, Lightning's own bug of that kind.
    ids = ev.visible_ids
    renumbered = bool(ids) and max(ids) >= len(ids)
    if "more-ranks-than-gpus" in found and renumbered and not too_many:
        shown = ",".join(str(i) for i in ids)
        if ev.lightning_sign and add("lightning-device-index-bug", like="more-ranks-than-gpus"):
            found["lightning-device-index-bug"].decided = True
            note("lightning-device-index-bug", f"The log makes GPUs {shown} visible (they become cuda:0..{len(ids) - 1}) "
                                               f"and runs Lightning: '{shorten(ev.lightning_sign, 80)}'.")
        else:
            _rank_first(found, "more-ranks-than-gpus", "hard-coded-device",
                        f"GPUs {shown} visible: inside the job they are cuda:0..{len(ids) - 1}")
    # A checkpoint's keys: the prefix the log shows decides the family's reading.
    if "state-dict-mismatch" in found:
        if ev.module_keys and add("state-dict-module-prefix", like="state-dict-mismatch"):
            note("state-dict-module-prefix", f"The log shows a key with the prefix: '{shorten(ev.module_keys, 100)}'.")
        elif ev.compiled_keys:
            _rank_first(found, "state-dict-mismatch", "compiled-state-dict-prefix", ev.compiled_keys)
        elif ev.size_mismatch:
            _rank_first(found, "state-dict-mismatch", "checkpoint-model-mismatch", ev.size_mismatch)
    # "Too many open files" with multiprocessing's descriptor passing in the traceback: the DataLoader's descriptors.
    if "too-many-open-files" in found:
        fd = next((ln.strip() for ln in lines if "resource_sharer" in ln or "multiprocessing/reductions.py" in ln
                   or "DataLoader worker" in ln or "rebuild_storage_fd" in ln), "")
        if fd:
            _rank_first(found, "too-many-open-files", "fd-sharing-limit", fd)
    # NCCL's internal error with a topology file in the log: the file first.
    if "nccl-internal-error" in found:
        topo = next((ln.strip() for ln in lines if "NCCL_TOPO_FILE" in ln or "topo.xml" in ln or "aws-ofi-nccl" in ln),
                    "")
        if topo:
            _rank_first(found, "nccl-internal-error", "nccl-topo-file-invalid", topo)
    # gloo's enforce from its transport (a connection): a peer's exit goes first, not a size mismatch.
    if "gloo-enforce" in found and "/transport/" in found["gloo-enforce"].evidence:
        _rank_first(found, "gloo-enforce", "peer-closed", found["gloo-enforce"].evidence)
    # CUDA's "initialization error" in a DataLoader worker: CUDA used in a forked worker decides it.
    if "cuda-init-error" in found:
        worker = next((ln.strip() for ln in lines if "_worker_loop" in ln or "DataLoader worker process" in ln), "")
        if worker and add("cuda-fork", like="cuda-init-error"):
            found.pop("cuda-init-error")
            note("cuda-fork", f"The error is raised in a DataLoader worker (a forked process): '{shorten(worker, 100)}'.")
    # An in-place change to a saved tensor under DDP: with broadcast_buffers=False in the log the buffers' broadcast
    # is ruled out, so the model's own in-place op goes first.
    if "autograd-inplace" in found:
        off = next((ln.strip() for ln in lines if "broadcast_buffers=False" in ln or "broadcast_buffers = False" in ln),
                   "")
        if off:
            _rank_first(found, "autograd-inplace", "inplace-op-in-model", f"buffers' broadcast already off: '{off}'")
    _read_explain7(lines, found, add, note)
    # DDP around a model spread over GPUs: a launcher that started several processes from one config reads as one
    # process meant; several processes a user asked for (--nproc-per-node above 1) read as a process per GPU.
    if "multi-device-module-ddp" in found and ev.nproc is not None and ev.nproc > 1:
        _rank_first(found, "multi-device-module-ddp", "quantized-device-map", f"--nproc-per-node {ev.nproc}")


# explain7: the store's host as the log names it (an endpoint, MASTER_ADDR, tcp://, the store's own "trying to connect
# to (HOST, PORT)"); a name, not an address, puts its resolution first.
_STORE_HOST = re.compile(r"(?:--rdzv[-_]endpoint[= ]|--master[-_]addr[= ]|MASTER_ADDR[= ]|\btcp://|"
                         r"trying to connect to \(|to host )['\"]?\[?([A-Za-z0-9][\w.:-]{0,100}?)\]?['\"]?(?=[:, )'\"]|$)")
_IP = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}|[0-9A-Fa-f:]*:[0-9A-Fa-f:]*")
_LOCAL_NAMES = ("localhost", "0.0.0.0")
# The KeyError's message alone on its line (the exception's name lost in the paste), and a frame reading that variable.
_BARE_ENV_KEY = re.compile(r"^\s{0,8}'(RANK|LOCAL_RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT)'\s*$")
_ENV_READ = re.compile(r"os\.environ\[['\"](RANK|LOCAL_RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT)['\"]\]")
_OPTIM_SIGN = re.compile(r"/torch/optim/|optimizer\.step\(|\.load_state_dict\(|_multi_tensor_|map_location")
_DEVICES_SAID = re.compile(r"found at least two devices,\s{0,3}([\w:]{1,12}) and ([\w:]{1,12})|"
                           r"Expected object of device type \w{1,12} but got device type \w{1,12}")


def _read_explain7(lines: Sequence[str], found: dict, add: Callable, note: Callable) -> None:
    """explain7's readings (heldout5's classes): the store's host a connect timeout names, the devices and the frames
    of "tensors on two devices", an NCCL too old for this century's jobs, and a bare ``'LOCAL_RANK'`` with the frame
    that read it."""
    if "store-connect-timeout" in found:
        host = ""
        for raw in lines:
            line = raw[:MAX_LINE]
            if ("endpoint" in line or "addr" in line or "ADDR" in line or "tcp://" in line or "connect to" in line
                    or "to host" in line):
                m = _STORE_HOST.search(line)
                if m:
                    host = m.group(1).rstrip(".")
                    break
        # A name is weak evidence (most multi-node jobs use names, and most of their timeouts are unreachable
        # addresses: putting resolution first made the older corpus's 034 partial), so it is said, not ranked; an
        # address rules resolution out.
        m = found["store-connect-timeout"]
        if host and host not in _LOCAL_NAMES and not _IP.fullmatch(host):
            note("store-connect-timeout", f"The store's host is a name ({host}): run getent hosts {host} on every "
                                          "node, as well as the checks for an unreachable address.")
        elif host:
            m.ranked = [c for c in m.candidates if c[0] != "master-host-unresolved"]
            note("store-connect-timeout", f"The store's host is an address ({host}): no name is resolved, so it is "
                                          "one of two causes.")
    if "tensors-on-different-devices" in found:
        said = found["tensors-on-different-devices"].evidence
        m = _DEVICES_SAID.search(said)
        devices = {m.group(1), m.group(2)} if m and m.group(1) else set()
        optim = next((ln.strip() for ln in lines if ("optim" in ln or "state_dict" in ln or "map_location" in ln)
                      and _OPTIM_SIGN.search(ln[:MAX_LINE])), "")
        if optim:
            _rank_first(found, "tensors-on-different-devices", "checkpoint-map-location", optim)
        elif (m and not m.group(1)) or "cpu" in devices:
            _rank_first(found, "tensors-on-different-devices", "input-on-wrong-device",
                        "one of the two devices is the CPU: a model spread over GPUs does not put a tensor there")
    if "nccl-unhandled-cuda" in found:
        fact = outdated_nccl(lines)
        if fact:
            m = found["nccl-unhandled-cuda"]
            how = f"{fact} Install a current NCCL and rebuild what links it (nccl-tests, an extension) first."
            m.ranked = [("nccl-release-outdated", how)] + [c for c in m.candidates
                                                           if c[0] != "nccl-known-bug"][:2]
            note("nccl-unhandled-cuda", fact)
    if not found or all(c in AREA for c in found):
        key = ""
        for raw in lines:
            line = raw[:MAX_LINE]
            if not key and line[:12].strip().startswith("'"):
                b = _BARE_ENV_KEY.match(line)
                key = b.group(1) if b else ""
            elif key and "environ[" in line:
                r = _ENV_READ.search(line)
                if r and r.group(1) == key:
                    for cid in [c for c in found if c in AREA]:
                        del found[cid]
                    if add("no-launcher-env", line.strip()):
                        note("no-launcher-env", f"The KeyError '{key}' comes from this line: '{shorten(line.strip(), 100)}'.")
                    break


def _fmt_secs(secs: int) -> str:
    return f"{secs // 60} min {secs % 60:02d} s" if secs >= 60 else f"{secs} s"


def refine(lines: Sequence[str], found: dict, by_id: dict, make: Callable) -> Evidence:
    """Adjust ``found`` (cause id -> Match) with the log's evidence; return the evidence read.

    ``by_id``: the causes in play (id -> Cause); ``make(cause)``: a new, empty Match.
    """
    ev = gather(lines)

    def add(cid: str, evidence: str = "", like: Optional[str] = None):
        if cid not in by_id:
            return None
        m = found.get(cid)
        if m is None:
            m = found[cid] = make(by_id[cid])
            if like and like in found:
                m.ranks |= found[like].ranks
                m.count = found[like].count
                m.evidence = found[like].evidence
        if evidence and not m.evidence:
            m.evidence = shorten(evidence, 240)
        m.count = max(m.count, 1)
        return m

    def note(cid: str, text: str) -> None:
        if cid in found and text and text not in found[cid].extra:
            found[cid].extra = f"{found[cid].extra} {text}".strip()

    # Settings already present: find_unused_parameters=True is on, so that advice cannot be the fix.
    if "ddp-unused-parameters" in found and ev.find_unused_on and add("ddp-unused-already-on", like="ddp-unused-parameters"):
        note("ddp-unused-already-on", f"The log shows it on: '{shorten(ev.find_unused_on, 200)}'.")

    # SyncBatchNorm in the traceback of "no default process group".
    if "no-default-process-group" in found and ev.syncbn:
        add("syncbn-single-process", like="no-default-process-group")

    # Errno 13 while creating a multiprocessing lock: /dev/shm permission.
    if ev.errno13 and ev.semlock:
        add("shm-permission", ev.errno13)

    # A timeout while one rank's long task was still running.
    timed_out = [c for c in _TIMEOUTS if c in found]
    # Long: at least half the timeout when the log gives it, else five minutes; a short validation pass
    # next to a real hang is not the cause.
    long_enough = ev.long_task_s >= (ev.timeout_ms // 2000 if ev.timeout_ms else 300)
    # A progress bar that had not finished and had run about as long as the timeout (0.8x to 1.6x): that
    # rank started its work when the others began to wait. A training bar runs far longer than the timeout.
    if timed_out and not (ev.long_task and long_enough) and ev.timeout_ms and ev.bar_line \
            and 0.8 * ev.timeout_ms / 1000 <= ev.bar_s <= 1.6 * ev.timeout_ms / 1000:
        ev.long_task, ev.long_task_s, long_enough = ev.bar_line, ev.bar_s, True
    if timed_out and ev.long_task and long_enough:
        limit = f" (the timeout was {ev.timeout_ms // 1000} s)" if ev.timeout_ms else ""
        if add("slow-rank-timeout", ev.long_task, like=timed_out[0]):
            took = f" after {_fmt_secs(ev.long_task_s)}" if ev.long_task_s else ""
            note("slow-rank-timeout", f"In this log a rank was still at '{shorten(ev.long_task, 90)}'{took} when the "
                                      f"others timed out{limit}.")

    # Counts: more processes than visible GPUs decides between the two readings of a shared GPU.
    too_many = ev.nproc is not None and ev.visible_gpus is not None and ev.nproc > ev.visible_gpus
    counts = (f"The log starts {ev.nproc} processes per node with {ev.visible_gpus} visible GPU"
              f"{'s' if ev.visible_gpus != 1 else ''} (CUDA_VISIBLE_DEVICES).") if too_many else ""
    if "duplicate-gpu" in found and too_many:
        add("more-ranks-than-gpus", like="duplicate-gpu")
        note("more-ranks-than-gpus", counts)
    elif "duplicate-gpu" in found and ev.nproc is not None and ev.visible_gpus is not None:
        note("duplicate-gpu", f"The log starts {ev.nproc} processes per node with {ev.visible_gpus} visible GPUs, "
                              "enough for one each: the ranks did not pick their own.")
    elif "duplicate-gpu" in found and not (ev.accelerate_sign or ev.ray_sign):
        note("duplicate-gpu", "If the node has fewer GPUs than processes, it is that instead: compare "
                              "--nproc-per-node with nvidia-smi -L (the log does not show both counts).")
    if "more-ranks-than-gpus" in found:
        if counts:
            found["more-ranks-than-gpus"].decided = True  # the counts settle it
            note("more-ranks-than-gpus", counts)
        elif ev.nproc is not None:
            note("more-ranks-than-gpus", f"The log starts {ev.nproc} processes per node.")
        if not counts:  # several nodes: a rank past the first may use its global rank as the device
            nodes = next((ln.strip() for ln in lines if "nnodes" in ln[:MAX_LINE]
                          and (n := _NNODES.search(ln[:MAX_LINE])) and int(n.group(1)) > 1), "")
            _rank_first(found, "more-ranks-than-gpus", "global-rank-as-device", nodes[:_KEPT])

    # Slurm: fewer ranks joined than the world the trainer expects.
    if ev.slurm and "slurm-tasks-mismatch" in by_id:
        short = ev.barrier_counts and ev.barrier_counts[1] < ev.barrier_counts[0]
        members_short = (ev.member_world is not None and len(ev.members) < ev.member_world and ev.hang_end)
        if short or members_short:
            add("slurm-tasks-mismatch", "", like="rendezvous-unreachable" if short else None)
            if short:
                note("slurm-tasks-mismatch", f"{ev.barrier_counts[1]} of {ev.barrier_counts[0]} ranks joined.")
            else:
                note("slurm-tasks-mismatch", f"Only {len(ev.members)} of {ev.member_world} ranks started "
                                             f"(Lightning's MEMBER lines) before the job hung.")
            if not found["slurm-tasks-mismatch"].evidence:
                found["slurm-tasks-mismatch"].evidence = next(
                    (shorten(ln.strip(), 240) for ln in lines if "MEMBER:" in ln[:MAX_LINE]), "")

    # A finished job's abort at exit: name the rank that aborted; the ranks torchrun then stopped are not causes.
    if "teardown-abort" in found:
        m = found["teardown-abort"]
        aborted = sorted(m.ranks) or sorted(r for r, sig in ev.signalled.items() if sig == 6)
        m.groups = dict(m.groups, rank=f"rank {aborted[0]}" if aborted else "a rank")
        m.ranks |= set(aborted[:1])
        stopped = sorted(r for r, sig in ev.signalled.items() if sig == 15 and r not in aborted)
        if stopped:
            names = ", ".join(str(r) for r in stopped)
            note("teardown-abort", f"torchrun then stopped rank{'s' if len(stopped) > 1 else ''} {names} with "
                                   f"SIGTERM: a consequence, not a cause.")
        if "killed-by-signal" in found and set(ev.crash_signals) <= {"SIGABRT"}:
            del found["killed-by-signal"]  # the abort is explained; SIGTERM was torchrun's own

    # NCCL remote error: which reading does this log support?
    if "nccl-remote-error" in found:
        crashed = [s for s in ev.crash_signals if s != "SIGABRT"]
        if crashed:
            note("nccl-remote-error", f"This log supports reading (1): a rank died by {crashed[0]} first.")
        elif ev.net_last_error:
            note("nccl-remote-error", f"No rank died first in this log and the last error is a network one "
                                      f"('{shorten(ev.net_last_error, 100)}'): reading (2).")
        else:
            note("nccl-remote-error", "This log shows neither a crashed rank nor a network error: check both.")

    # Names and versions the job printed.
    if "socket-ifname-missing" in found and ev.ifnames:
        names = ", ".join(v if k == "lookup" else f"{k}_SOCKET_IFNAME={v}" for k, v in ev.ifnames)
        note("socket-ifname-missing", f"The log names: {names}.")
        if any(k in ("GLOO", "lookup") and v.startswith("^") for k, v in ev.ifnames):
            note("socket-ifname-missing", "GLOO_SOCKET_IFNAME was given an ^exclusion list; gloo takes one interface name.")
    if "cuda-arch-unsupported" in found:
        if ev.gpu_arch:
            note("cuda-arch-unsupported", f"The GPU is {ev.gpu_arch}" + (f"; this build has {ev.build_archs}." if ev.build_archs else "."))
        elif ev.old_gpu_cc:
            note("cuda-arch-unsupported", f"The GPU has compute capability {ev.old_gpu_cc}, below this build's minimum.")
    if "nccl-library-mismatch" in found:
        if len(ev.pip_nccl) > 1:
            note("nccl-library-mismatch", "The log lists several NCCL wheels: "
                 + ", ".join(f"nvidia-nccl-{k} {v}" for k, v in ev.pip_nccl) + ".")
        elif ev.pip_nccl:
            note("nccl-library-mismatch", f"The log shows nvidia-nccl-{ev.pip_nccl[0][0]} {ev.pip_nccl[0][1]}.")
        if ev.ld_nccl:
            note("nccl-library-mismatch", "LD_LIBRARY_PATH in the log points at another NCCL.")
    if "nccl-not-built" in found and ev.windows:
        note("nccl-not-built", "This log comes from Windows.")
    if "launcher-local-rank-arg" in found and ev.lr_passed:
        declared = f"; the script declares {ev.lr_declared}" if ev.lr_declared and ev.lr_declared != ev.lr_passed else ""
        note("launcher-local-rank-arg", f"The launcher passed {ev.lr_passed}{declared}.")
    # SIGKILL alone is said as a signal (its hint names the OOM killer); memory evidence makes it host-oom.
    if ("killed-by-signal" in found and found["killed-by-signal"].extra.startswith("SIGKILL")
            and ev.host_mem_pct is not None and ev.host_mem_pct >= 85):
        add("host-oom", like="killed-by-signal")
    if "dataloader-worker-killed" in found and ev.host_mem_pct is not None and ev.host_mem_pct >= 85:
        add("host-oom", like="dataloader-worker-killed")  # explain7: a killed worker with the host's memory full
    if "host-oom" in found and ev.host_mem_pct is not None:
        note("host-oom", f"The job printed host memory at {ev.host_mem_pct:g}% used.")

    # A bus error is /dev/shm running out in nearly every training job: say so, not only the signal.
    if "killed-by-signal" in found and found["killed-by-signal"].extra.startswith("SIGBUS"):
        add("shm-too-small", like="killed-by-signal")

    # gloo looked up a name that is not an interface's: this host's own name does not resolve.
    if "socket-ifname-missing" in found and ev.ifnames and all(k == "lookup" for k, _ in ev.ifnames) \
            and not any(_IFACE_NAME.fullmatch(v.lstrip("^")) for _, v in ev.ifnames):
        note("socket-ifname-missing", f"gloo looked up '{ev.ifnames[0][1]}', a host name: with no "
                                      "GLOO_SOCKET_IFNAME set, this host's own name must resolve (getent hosts "
                                      "$(hostname)); set GLOO_SOCKET_IFNAME to the interface to use.")

    # ddpdoctor's own errors: the place is the caller's line, not ddpdoctor's.
    for cid, names in _OWN_ERRORS.items():
        if cid in found:
            place = _caller_line(lines, names)
            if place:
                found[cid].groups = dict(found[cid].groups, where=place)
                note(cid, f"Raised by your call at {place}.")

    # A signal with nothing else to decide it: the causes it may be.
    if "killed-by-signal" in found:
        sig = found["killed-by-signal"].extra.split(".")[0].split()[0] if found["killed-by-signal"].extra else ""
        if sig in _SIGNAL_FAMILIES and not found["killed-by-signal"].ranked:
            found["killed-by-signal"].ranked = list(_SIGNAL_FAMILIES[sig])

    # Versions the log prints, read against the table of facts.
    facts = version_facts(lines) if any(c.startswith("nccl") for c in found) else []
    for fact in facts:
        for cid in [c for c in found if c.startswith("nccl")][:1]:
            note(cid, fact)

    # Families: the log's evidence puts one candidate first.
    _rank_first(found, "nccl-system-error", "shm-too-small", ev.shm_sign)
    _rank_first(found, "nccl-system-error", "container-network", ev.docker_sign)
    # Who assigned the GPUs decides between the readings of "Duplicate GPU detected": accelerate sets each
    # process's device from its local index, so a shared device there means fewer GPUs than processes;
    # under Ray the framework's own assignment is the suspect. Counts (above) decide before either.
    if "duplicate-gpu" in found and not too_many:
        if ev.nproc is not None and ev.visible_gpus is not None:
            _rank_first(found, "duplicate-gpu", "duplicate-gpu", f"--nproc-per-node {ev.nproc} with "
                                                                 f"{ev.visible_gpus} visible GPUs")
        elif ev.ray_sign:
            _rank_first(found, "duplicate-gpu", "library-version-mismatch", ev.ray_sign)
        elif ev.accelerate_sign:
            _rank_first(found, "duplicate-gpu", "more-ranks-than-gpus", ev.accelerate_sign)
    # "busy or unavailable": a driver message, or the compute mode printed, decides the reading.
    if "cuda-devices-busy" in found:
        if ev.driver_sign:
            _rank_first(found, "cuda-devices-busy", "cuda-driver-mismatch", ev.driver_sign)
        elif ev.exclusive_sign:
            _rank_first(found, "cuda-devices-busy", "gpu-exclusive-mode", ev.exclusive_sign)
    if "nccl-remote-error" in found and not [s for s in ev.crash_signals if s != "SIGABRT"] and ev.net_last_error:
        first = "nccl-ib-network" if ("NET/IB" in ev.net_last_error or "ibv_" in ev.net_last_error
                                      or "NET/OFI" in ev.net_last_error) else "nccl-wrong-interface"
        _rank_first(found, "nccl-remote-error", first, ev.net_last_error)

    # "Connection refused", "Socket Timeout": a rank that died first (a signal) puts the peer first; NCCL's own
    # connection line puts its interface first.
    crashed = [s for s in ev.crash_signals if s not in ("SIGABRT",)]
    if "connection-refused" in found:
        said = found["connection-refused"].evidence
        if "NCCL" in said or "NET/" in said:
            _rank_first(found, "connection-refused", "nccl-wrong-interface", said)
        elif crashed:
            _rank_first(found, "connection-refused", "peer-closed", f"a rank died by {crashed[0]}")
    if "store-timeout" in found and crashed:
        _rank_first(found, "store-timeout", "peer-closed", f"a rank died by {crashed[0]}")
    _read_explain6(lines, found, ev, add, note, crashed, too_many)
    # The wrapper's device against the model's: all on GPU 0 while the wrapper has the rank's GPU is the model put on
    # one fixed GPU; a GPU 0 wrapper with a parameter elsewhere is a model spread over GPUs (the default order).
    if "module-device-mismatch" in found:
        groups = found["module-device-mismatch"].groups
        if groups.get("want", "0") != "0" and groups.get("got") == "0":
            _rank_first(found, "module-device-mismatch", "model-on-wrong-gpu", found["module-device-mismatch"].evidence)
    # An NCCL WARN from its CUDA calls: the CUDA error it quotes puts that failure first.
    if "nccl-warn-cuda" in found:
        said = found["nccl-warn-cuda"].evidence.lower()
        for cid, words in (("cuda-oom", ("out of memory",)),
                           ("gpu-bad-state", ("illegal memory access", "launch failure", "ecc", "xid")),
                           ("cuda-driver-mismatch", ("driver version", "initialization error", "not yet initialized"))):
            if any(w in said for w in words):
                _rank_first(found, "nccl-warn-cuda", cid, found["nccl-warn-cuda"].evidence)
                break

    gather_more(lines, ev, port="port-in-use" in found, tensor="cpu-tensor-nccl" in found,
                memory=not found or "cuda-oom-gpu0" in found, abort="teardown-abort" in found,
                pickle="pickle-error" in found, twice="ddp-reentrant-checkpoint" in found,
                kernel="cuda-arch-unsupported" in found)
    # "marked ready twice": checkpointing in the log decides it; without, a parameter used twice is as likely.
    if "ddp-reentrant-checkpoint" in found and ev.checkpointing:
        found["ddp-reentrant-checkpoint"].decided = True
        note("ddp-reentrant-checkpoint", f"The log shows checkpointing: '{shorten(ev.checkpointing, 100)}'.")
    # "no kernel image": torch's own warning about the GPU decides torch's build; an extension's frame puts it first.
    if "cuda-arch-unsupported" in found:
        if ev.gpu_arch or ev.old_gpu_cc or "no kernel image" not in found["cuda-arch-unsupported"].evidence:
            found["cuda-arch-unsupported"].decided = True
        elif ev.extension:
            _rank_first(found, "cuda-arch-unsupported", "extension-arch-unsupported", ev.extension)
    # "terminate called without an active exception": the finished job's exit race only when the rank aborted
    # (SIGABRT) and no Python traceback came before; a traceback before it puts that error first.
    if "teardown-abort" in found:
        if ev.error_before_abort:
            _rank_first(found, "teardown-abort", "earlier-error", ev.error_before_abort)
        elif 6 in ev.signalled.values() or "SIGABRT" in ev.crash_signals:
            found["teardown-abort"].decided = True
    # "cannot pickle": a save or a copy in the traceback puts that first; multiprocessing's pickler decides spawn.
    if "pickle-error" in found:
        if ev.save_sign:
            _rank_first(found, "pickle-error", "checkpoint-pickle", ev.save_sign)
        elif ev.spawn_sign and add("spawn-pickle", like="pickle-error"):
            note("spawn-pickle", f"The traceback shows a new process's pickling: '{shorten(ev.spawn_sign, 100)}'.")
    # "address already in use": the log shows who chose the port (the program's own choice wins: under any
    # launcher, a tcp:// init method or a MASTER_PORT set in code is the port the store used).
    if "port-in-use" in found:
        if ev.port_code_sign:
            _rank_first(found, "port-in-use", "port-in-use-in-code", ev.port_code_sign)
        elif ev.port_launcher_sign:
            _rank_first(found, "port-in-use", "port-in-use", ev.port_launcher_sign)
        elif ev.plain_python:
            _rank_first(found, "port-in-use", "port-in-use-in-code", ev.plain_python)
    # "Tensors must be CUDA and dense": a line showing the CPU tensor or model decides; else the family, reordered.
    if "cpu-tensor-nccl" in found:
        if ev.cpu_decisive:
            found["cpu-tensor-nccl"].decided = True
            if ev.cpu_decisive not in found["cpu-tensor-nccl"].evidence:
                note("cpu-tensor-nccl", f"The log shows the CPU side: '{shorten(ev.cpu_decisive, 120)}'.")
        elif ev.sparse_sign:
            _rank_first(found, "cpu-tensor-nccl", "sparse-tensor-nccl", ev.sparse_sign)
        elif "cuda-arch-unsupported" in found:
            _rank_first(found, "cpu-tensor-nccl", "library-version-mismatch", found["cuda-arch-unsupported"].evidence)
    # nvidia-smi's table with the job's processes on GPU 0 and on their own GPUs: every rank opened GPU 0.
    # Several processes on GPU 0, at least one of them also on another GPU (a rank whose own GPU is not 0).
    gpu0 = sorted(ev.smi_rows.get(0, ()))
    also = [p for p in gpu0 if any(p in pids for g, pids in ev.smi_rows.items() if g)]
    if len(gpu0) >= 2 and also and (not found or "cuda-oom-gpu0" in found):
        m = add("cuda-oom-gpu0", ev.smi_line)
        if m is not None:
            m.decided = True
            shown = ", ".join(str(p) for p in gpu0[:6]) + (", ..." if len(gpu0) > 6 else "")
            note("cuda-oom-gpu0", f"nvidia-smi in this log lists processes {shown} on GPU 0, and {also[0]} also on "
                                  "another GPU: the ranks hold memory on GPU 0 besides their own GPU.")
    # Out of memory on GPU 0: several processes there, or a rank other than 0 on it, decide; alone, a family.
    if "cuda-oom-gpu0" in found and ev.oom_shared:
        found["cuda-oom-gpu0"].decided = True
        note("cuda-oom-gpu0", f"The log shows GPU 0 shared: '{shorten(ev.oom_shared, 120)}'.")

    # An exception torch.distributed or accelerate raised itself, when nothing else explains the log.
    if not found:
        raised = _raised_in(lines)
        if raised and add(raised[0], raised[2]):
            where = f" Your call: {raised[3]}." if raised[3] else ""
            note(raised[0], f"Raised in {raised[1]}.{where}")

    # The families by source file stand only when nothing else explains the log.
    if any(c not in AREA and c != "peer-closed" for c in found):
        for cid in AREA:
            found.pop(cid, None)

    # Drop the generic cause where a specific one explains the same failure.
    for generic, specifics in SUBSUMED_BY.items():
        if generic in found and any(s in found for s in specifics):
            del found[generic]
    if "killed-by-signal" in found:
        sig = found["killed-by-signal"].extra.split(".")[0]
        owner = _SIGNAL_OWNER.get(sig)
        if owner and owner in found:
            del found["killed-by-signal"]
    return ev
