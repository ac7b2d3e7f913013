"""Name the known causes in an error message or a whole job log: what it means, how to confirm, the fix.

A log may interleave several ranks (torchrun's ``[rank1]:`` or ``[default1]:`` prefixes, NCCL's
``[Rank 1]``) and end with torchrun's ChildFailedError summary (``rank : 1``, ``exitcode : -9``);
each match remembers the ranks it came from. The table below is matched against the real message
texts of PyTorch, gloo and NCCL (tests trigger each one on CPU where that is possible).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from ddpdoctor.result import format_ranks
from ddpdoctor.runner.supervisor import signal_hint

__all__ = ["Cause", "Match", "CAUSES", "explain_text", "first_failure", "render_matches", "ranks_of_lines"]


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
    """

    id: str
    title: str
    patterns: tuple
    meaning: str
    confirm: str
    fix: str

    def compiled(self) -> list:
        return [re.compile(p) for p in self.patterns]


@dataclass
class Match:
    """A cause found in the text: the ranks that said it and the first line that did."""

    cause: Cause
    ranks: set = field(default_factory=set)
    evidence: str = ""
    count: int = 0
    extra: str = ""

    def to_dict(self) -> dict:
        return {"id": self.cause.id, "title": self.cause.title, "ranks": sorted(self.ranks),
                "evidence": self.evidence, "count": self.count, "meaning": self.meaning,
                "confirm": self.cause.confirm, "fix": self.fix}

    @property
    def meaning(self) -> str:
        return self.cause.meaning + (f" {self.extra}" if self.extra else "")

    @property
    def fix(self) -> str:
        if self.cause.id == "killed-by-signal" and self.extra:
            return self._signal_fix()
        return self.cause.fix

    def _signal_fix(self) -> str:
        name = self.extra.split()[0].rstrip(".") if self.extra else ""
        try:
            return signal_hint(int(signal.Signals[name]))
        except KeyError:
            return signal_hint(-1)


CAUSES: tuple = (
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

_PREFIX = re.compile(r"^\s*\[(?:rank|default|Rank )(\d+)\]:?")
_NCCL_RANK = re.compile(r"\[(?:PG [^\]]*)?Rank (\d+)\]")
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_LOOPBACK = re.compile(r"\b127\.\d+\.\d+\.\d+\b|\[::1\]|localhost")
_STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")
_SUMMARY_END = re.compile(r"^\s*(\[\d+\]:|Root Cause|Other Failures|=+\s*$)")


def ranks_of_lines(lines: Sequence[str]) -> list:
    """The rank each line came from (``None`` when it does not say), using prefixes and summaries."""
    ranks: list = []
    summary_rank: Optional[int] = None
    for line in lines:
        m = _PREFIX.match(line)
        if m:
            ranks.append(int(m.group(1)))
            continue
        s = _SUMMARY_RANK.match(line)
        if s:
            summary_rank = int(s.group(1))
        elif _SUMMARY_END.match(line):
            summary_rank = None
        n = _NCCL_RANK.search(line)
        ranks.append(int(n.group(1)) if n else summary_rank)
    return ranks


def _signal_name(m: re.Match) -> str:
    token = m.group(1) if m.groups() else ""
    if token.isdigit():
        try:
            return signal.Signals(int(token)).name
        except ValueError:
            return f"signal {token}"
    return token


def _first_hit(line: str, table: list):
    """The first cause (in table order) whose regex matches ``line``, with the regex match."""
    for cause, regexes in table:
        for rx in regexes:
            m = rx.search(line)
            if m and not (cause.id == "killed-by-signal" and _signal_name(m) in _STOP_SIGNALS):
                return cause, m  # SIGTERM/SIGINT is how torchrun or a scheduler stops survivors
    return None, None


def explain_text(text: str, causes: Iterable[Cause] = CAUSES) -> list:
    """Every known cause in ``text``, in table order, with the ranks that reported it.

    One cause per line: the most specific (earliest in the table) wins.
    """
    lines = text.splitlines()
    found: dict = {}
    table = [(c, c.compiled()) for c in causes]
    for line, rank in zip(lines, ranks_of_lines(lines)):
        cause, m = _first_hit(line, table)
        if cause is None:
            continue
        match = found.setdefault(cause.id, Match(cause))
        match.count += 1
        if not match.evidence:
            match.evidence = _PREFIX.sub("", line).strip()[:240]
        if rank is not None:
            match.ranks.add(rank)
        if cause.id == "killed-by-signal" and not match.extra:
            match.extra = f"{_signal_name(m)}."
        if cause.id == "gloo-connect-full-mesh" and _LOOPBACK.search(line):
            match.extra = ("The address in the message is a loopback address: on a multi-node job this "
                           "node's hostname resolves to loopback, so the other nodes cannot reach it.")
    if "port-in-use" in found and "rendezvous-unreachable" in found:
        # EADDRINUSE on the master makes the others time out: the timeout is a consequence.
        found["rendezvous-unreachable"].extra = "Here most likely because the master could not listen (port-in-use)."
    return [found[c.id] for c, _ in table if c.id in found]


_ROOT = re.compile(r"Root Cause \(first observed failure\)")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt)\b:?.*")
_TB_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


def first_failure(text: str) -> Optional[str]:
    """torchrun's root cause in one line: ``rank 1 exited with code 1: RuntimeError: boom (train.py:22)``.

    Returns None when the text has no torchrun failure summary.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _ROOT.search(line)), None)
    if start is None:
        return None
    rank = code = None
    for line in lines[start:start + 12]:
        r, c = _SUMMARY_RANK.match(line), _EXITCODE.match(line)
        if r and rank is None:
            rank = int(r.group(1))
        if c and code is None:
            code = int(c.group(1))
    if rank is None or code is None:
        return None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} was killed by {name}"
    exc, where = "", ""
    for line, lr in zip(lines, ranks_of_lines(lines)):
        if lr != rank:
            continue
        body = _PREFIX.sub("", line).strip()
        f = _TB_FRAME.search(body)
        if f and "/site-packages/" not in f.group("file") and "/lib/python" not in f.group("file"):
            where = f"{f.group('func')} ({'/'.join(f.group('file').split('/')[-2:])}:{f.group('line')})"
        elif _EXC_LINE.match(body) and not body.startswith("Traceback"):
            exc = body if len(body) <= 160 else body[:157] + "..."
    text_out = f"rank {rank} exited with code {code}"
    if exc:
        text_out += f": {exc}"
    if where:
        text_out += f" at {where}"
    return text_out


def render_matches(matches: Sequence[Match], source: str, first: Optional[str] = None) -> list:
    """The lines ``ddpdoctor explain`` prints (``first``: torchrun's first failure, if known)."""
    head = [f"first failure: {first}"] if first else []
    if not matches:
        if first:
            return head + [f"{source}: no other known cause found; read that rank's lines above its exit."]
        return [f"{source}: no known cause found in this text.",
                "  Run 'ddpdoctor check' on the same nodes (it proves ports, process group and environment),",
                "  and 'ddpdoctor stacks' while a job hangs."]
    out = head + [f"{source}: {len(matches)} known cause{'s' if len(matches) != 1 else ''}"]
    for m in matches:
        who = f" (rank{'s' if len(m.ranks) != 1 else ''} {format_ranks(m.ranks)})" if m.ranks else ""
        out.append(f"- {m.cause.id}: {m.cause.title}{who}")
        out.append(f"    seen:    {m.evidence}" + (f"  [x{m.count}]" if m.count > 1 else ""))
        out.append(f"    means:   {m.meaning}")
        out.append(f"    confirm: {m.cause.confirm}")
        out.append(f"    fix:     {m.fix}")
    return out


def read_input(text: Sequence[str], log_path: Optional[str]) -> tuple:
    """The text to explain and a name for it, from TEXT words, ``--log FILE`` or ``-`` (stdin).

    Raises:
        UsageError: nothing to read, or both TEXT and --log given.
    """
    import sys

    from ddpdoctor.errors import UsageError

    if log_path and text:
        raise UsageError("explain-input", "give either TEXT or --log FILE, not both", "drop one of them")
    if log_path:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            return f.read(), log_path
    if list(text) == ["-"] or (not text and not sys.stdin.isatty()):
        return sys.stdin.read(), "stdin"
    if not text:
        raise UsageError("explain-input", "nothing to explain",
                         "pass the error text, --log FILE, or - to read standard input")
    return " ".join(text), "the message"


def explain_command(text: Sequence[str], log_path: Optional[str], as_json: bool) -> int:
    """``ddpdoctor explain``: print the known causes; exit 0 (finding nothing is not an error)."""
    import json

    import click

    body, source = read_input(text, log_path)
    matches = explain_text(body)
    first = first_failure(body)
    if as_json:
        click.echo(json.dumps({"schema": 1, "source": source, "first_failure": first,
                               "causes": [m.to_dict() for m in matches]}, indent=2))
    else:
        click.echo("\n".join(render_matches(matches, source, first)))
    return 0
