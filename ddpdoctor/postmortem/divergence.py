"""Where the ranks' collectives part ways, read from Flight Recorder dumps (``ddpdoctor explain --fr``).

Per process group, the ranks' recorded collectives are lined up by sequence number. The first number
where the ranks that recorded it disagree (operation, shapes, dtypes), or where some ranks entered it
and others never did, is the divergence: the point a hang starts or silently wrong results begin. A
rank with no dump is a finding of its own. Completion comes from ``pg_status`` (gloo leaves every
entry ``scheduled``) or from an entry's own ``completed`` state (NCCL).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from ddpdoctor.causes.catalogue import CAUSES
from ddpdoctor.postmortem.flight_recorder import DumpSet, Entry
from ddpdoctor.result import format_ranks
from ddpdoctor.system.redact import safe_text

__all__ = ["GroupVerdict", "find_divergences", "render_divergences", "user_frame", "describe_entry",
           "explain_dumps_command"]

# Operations whose shapes must agree on every rank (gather/scatter/all_to_all may differ by design).
_SAME_SHAPE = {"all_reduce", "allreduce", "broadcast", "reduce", "all_gather", "allgather", "_allgather_base",
               "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
               "allreduce_coalesced", "all_reduce_coalesced", "barrier"}
# Frames that are not the user's: torch, ddpdoctor (its package, and the hook ``run`` injects), the standard
# library's process and thread machinery.
_NOT_USER = re.compile(
    r"(?:^|[/\\])(?:site|dist)-packages[/\\](?:torch|ddpdoctor)[/\\]"
    r"|(?:^|[/\\])torch[/\\](?:distributed|nn|autograd|_tensor\.py|utils|multiprocessing|_dynamo|amp)\b"
    r"|(?:^|[/\\])ddpdoctor[/\\](?:postmortem|training|runner|diagnostics|system|locate|causes)[/\\]"
    r"|[/\\]lib[/\\]python3\.\d+[/\\](?!site-packages|dist-packages)"
    r"|[/\\]\.inject[/\\](?:sitecustomize|_ddpdoctor_recorder)\.py$"  # ddpdoctor run's hook (its collective timing)
    r"|^<")


def user_frame(entry: Entry) -> Optional[tuple]:
    """The innermost frame of the user's own code that issued ``entry`` (None when none was recorded)."""
    for frame in entry.frames:
        if not _NOT_USER.search(frame[0]):
            return frame
    return None


def _ddp_part(entry: Entry) -> str:
    """Which part of DDP issued ``entry`` ('' when it was not DDP): the label says why a user never wrote it."""
    for path, _, name in entry.frames:
        if name == "_engine_run_backward" or (name == "backward" and "autograd" in path):
            return "DDP's gradient all-reduce, from backward()"
        if re.search(r"nn[/\\]parallel[/\\]distributed\.py$", path):
            if name in ("_pre_forward", "forward", "_post_forward"):
                return "DDP's forward (bucket rebuild or buffer sync)"
            if name == "__init__":
                return "DDP's constructor (parameter check and sync)"
    return ""


def describe_entry(entry: Entry) -> str:
    """``all_reduce [4] Float at train.py:30 in step`` (sizes and dtypes as recorded)."""
    sizes = " ".join("[" + ",".join(map(str, s)) + "]" for s in entry.input_sizes)
    dtypes = ",".join(sorted(set(entry.input_dtypes)))
    text = " ".join(p for p in (entry.op, sizes, dtypes) if p)
    part = _ddp_part(entry)
    if part:
        text += f" ({part})"
    frame = user_frame(entry)
    if frame:
        text += f" at {frame[0]}:{frame[1]} in {frame[2]}"
    elif entry.frames:
        text += f" at {entry.frames[0][0]}:{entry.frames[0][1]} (no frame of user code recorded)"
    return safe_text(text)


def _signature(entries: list) -> tuple:
    """What must agree across ranks at one sequence number: operations, and shapes/dtypes where they must."""
    sig = []
    for e in entries:
        shapes = (e.input_sizes, e.output_sizes) if e.op in _SAME_SHAPE else ()
        sig.append((e.op, shapes, tuple(sorted(set(e.input_dtypes + e.output_dtypes)))))
    return tuple(sig)


@dataclass
class GroupVerdict:
    """One process group's reading: the first divergent collective (``seq``), or none."""

    group: str
    desc: str
    members: list
    seq: Optional[int] = None  # the first divergent collective; None: no divergence
    kind: str = "none"  # 'mismatch' (different calls), 'absent' (some ranks never entered), 'waiting' (on a rank with no dump), 'none'
    variants: list = field(default_factory=list)  # [(ranks, Entry)] of the ranks that entered ``seq``
    absent: list = field(default_factory=list)  # [(rank, last Entry or None)] of the ranks that never did
    missing: list = field(default_factory=list)  # members with no dump
    timed_out: list = field(default_factory=list)  # ranks whose ``seq`` was retired without completing (not gloo)
    last_seq: int = -1  # the last collective any rank of the group entered
    last_completed: int = -1  # the last collective any rank saw complete
    cause: str = ""
    fix: str = ""
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        def entry(e: Optional[Entry]) -> Optional[dict]:
            if e is None:
                return None
            frame = user_frame(e)
            return {"seq": e.seq, "op": e.op, "input_sizes": [list(s) for s in e.input_sizes],
                    "input_dtypes": list(e.input_dtypes), "state": e.state,
                    "frame": None if frame is None else {"file": safe_text(frame[0]), "line": frame[1],
                                                         "function": safe_text(frame[2])}}

        return {"group": safe_text(self.group), "desc": safe_text(self.desc), "members": self.members,
                "divergent_seq": self.seq, "kind": self.kind,
                "entered": [{"ranks": r, "call": entry(e)} for r, e in self.variants],
                "never_entered": [{"rank": r, "last": entry(e)} for r, e in self.absent],
                "missing_ranks": self.missing, "timed_out_ranks": self.timed_out, "last_seq": self.last_seq, "last_completed": self.last_completed,
                "cause": self.cause, "fix": self.fix, "notes": [safe_text(n) for n in self.notes]}


def _default_alias(name: str) -> str:
    return "0" if name == "" else name


def _groups(dumps: DumpSet) -> dict:
    """group name -> (desc, members): members from pg_config where it lists them, else the ranks seen."""
    out: dict = {}
    for d in dumps.dumps.values():
        for e in d.entries:
            desc, seen = out.get(e.group, ("", set()))
            out[e.group] = (desc or e.group_desc, seen | {d.rank})
    for d in dumps.dumps.values():
        for name, ranks in d.config.items():
            name = _default_alias(name)
            if ranks and name in out:
                out[name] = (out[name][0], out[name][1] | set(ranks))
    if "0" in out:
        out["0"] = (out["0"][0], out["0"][1] | set(dumps.world))
    return {g: (desc, sorted(members)) for g, (desc, members) in out.items()}


def find_divergences(dumps: DumpSet) -> list:
    """One :class:`GroupVerdict` per process group seen in the dumps, the default group first."""
    verdicts = []
    for name, (desc, members) in sorted(_groups(dumps).items(), key=lambda kv: (kv[0] != "0", kv[0])):
        verdicts.append(_group_verdict(dumps, name, desc, members))
    return verdicts


def _group_verdict(dumps: DumpSet, name: str, desc: str, members: list) -> GroupVerdict:
    v = GroupVerdict(group=name, desc=desc, members=members)
    v.missing = [r for r in members if r not in dumps.dumps or dumps.dumps[r].problem]
    calls: dict = {}  # rank -> {seq: [entries]}
    last: dict = {}  # rank -> the last seq entered (pg_status, else the newest entry)
    done: dict = {}  # rank -> the last seq completed
    p2p = 0
    for r in members:
        d = dumps.dumps.get(r)
        if d is None or d.problem:
            continue
        mine = [e for e in d.entries if e.group == name]
        p2p += sum(e.is_p2p for e in mine)
        by_seq: dict = {}
        for e in mine:
            if not e.is_p2p:
                by_seq.setdefault(e.seq, []).append(e)
        calls[r] = by_seq
        pg_ids = {e.pg_id for e in mine}
        pg_id = pg_ids.pop() if len(pg_ids) == 1 else None
        newest = max(by_seq, default=0)
        last[r] = max(newest, d.enqueued(pg_id)) if pg_id is not None else newest
        completed = [s for s, es in by_seq.items() if any(e.state == "completed" for e in es)]
        done[r] = max([d.completed(pg_id) if pg_id is not None else -1] + completed)
    if p2p:
        v.notes.append(f"{p2p} point-to-point entr{'ies' if p2p != 1 else 'y'} (send/recv) not compared")
    if not calls:
        return v
    v.last_seq = max(last.values())
    v.last_completed = max(done.values())
    for seq in sorted({s for by_seq in calls.values() for s in by_seq}):
        entered = {r: by_seq[seq] for r, by_seq in calls.items() if seq in by_seq}
        absent = [r for r in calls if last[r] < seq]
        sigs: dict = {}
        for r, es in entered.items():
            sigs.setdefault(_signature(es), []).append(r)
        if len(sigs) > 1:
            v.seq, v.kind = seq, "mismatch"
        elif absent and not all(done[r] >= seq for r in entered):
            v.seq, v.kind = seq, "absent"
        else:
            continue
        ordered = sorted(sigs.values(), key=lambda rs: (-len(rs), rs))
        v.variants = [(rs, entered[rs[0]][0]) for rs in ordered]
        v.absent = [(r, _last_entry(calls[r])) for r in absent]
        break
    else:
        if v.missing and v.last_completed < v.last_seq:
            v.seq, v.kind = v.last_seq, "waiting"
            waiting = sorted(r for r, by_seq in calls.items() if v.last_seq in by_seq)
            if waiting:
                v.variants = [(waiting, calls[waiting[0]][v.last_seq][0])]
    if v.seq is not None:
        # retired but not completed: the watchdog gave up on it (gloo retires every entry; its state says nothing)
        v.timed_out = sorted(r for r, by_seq in calls.items() for e in by_seq.get(v.seq, [])[:1]
                             if e.retired and e.state != "completed" and e.backend != "gloo")
    v.cause, v.fix = _cause(v)
    return v


def _last_entry(by_seq: dict) -> Optional[Entry]:
    return by_seq[max(by_seq)][-1] if by_seq else None


def _catalogue(cause_id: str) -> tuple:
    for c in CAUSES:
        if c.id == cause_id:
            return c.title, c.fix
    return cause_id, ""


def _cause(v: GroupVerdict) -> tuple:
    """(cause, fix) in words, from the shape of the divergence."""
    if v.kind == "mismatch":
        ops = {e.op for _, e in v.variants}
        if len(ops) > 1:
            ddp = [e for _, e in v.variants if _ddp_part(e)]
            title, fix = _catalogue("collective-mismatch")
            cause = (f"{title}: at #{v.seq} the ranks issued different operations. A collective inside a "
                     "rank-dependent branch (if rank == 0:), a data-dependent branch, or one rank skipping a step")
            if ddp and len(ddp) < len(v.variants):
                cause += ("; one side is DDP's own collective: the other side called its collective where those "
                          "ranks ran the model (a step one rank takes alone, such as a checkpoint or evaluation "
                          "with a barrier, while the others keep training)")
            return cause + ".", fix
        dtypes = {tuple(sorted(set(e.input_dtypes))) for _, e in v.variants}
        if len(dtypes) > 1:
            return (f"ranks passed different dtypes to #{v.seq} ({', '.join('/'.join(d) for d in sorted(dtypes))}): "
                    "a tensor cast on some ranks only, or built from data whose type differs by rank.",
                    "cast to one dtype on every rank before the collective (tensor.to(torch.float32))")
        title, fix = _catalogue("gloo-size-mismatch")
        return (f"{title} at #{v.seq}: uneven inputs (the last batch, variable-length results) or shapes that "
                "differ by rank; gloo accepts equal byte counts silently, so this can be silently wrong "
                "results rather than a hang.", fix)
    if v.kind == "absent":
        entered = sorted(r for rs, _ in v.variants for r in rs)
        absent = [r for r, _ in v.absent]
        where = ""
        if v.variants:
            frame = user_frame(v.variants[0][1])
            where = f" at {frame[0]}:{frame[1]}" if frame else ""
        lead = ("a collective inside `if rank == 0:` (rank 0 alone issued it)" if entered == [0] and len(v.members) > 2
                else "a collective inside a rank-dependent or data-dependent branch")
        return (safe_text(f"rank{'s' if len(entered) != 1 else ''} {format_ranks(entered)} entered #{v.seq}{where}; "
                          f"rank{'s' if len(absent) != 1 else ''} {format_ranks(absent)} never did: {lead}; or an "
                          "early exit on the ranks that never entered it (a loop that ended first: uneven inputs, a "
                          "break or return); or they raised before entering it (gloo checks sizes and dtypes "
                          "locally before the call is recorded: read their tracebacks)."),
                "make every rank issue the same collectives in the same order: take the collective out of the "
                "branch or make the condition agree across ranks (compute it once and broadcast it); for uneven "
                "inputs use DistributedSampler(drop_last=True) or DDP's join() context manager")
    if v.kind == "waiting":
        return (f"every rank that dumped entered #{v.seq} and it never completed: it waits for rank"
                f"{'s' if len(v.missing) != 1 else ''} {format_ranks(v.missing)}, which left no dump.",
                "read the missing ranks' own output (their last lines, an exit code or signal), or run "
                "'ddpdoctor stacks' on them while the job hangs")
    return "", ""


def render_divergences(dumps: DumpSet, verdicts: list) -> list:
    """The lines ``ddpdoctor explain --fr`` prints."""
    versions = sorted({d.version for d in dumps.dumps.values() if d.version})
    readable = [r for r, d in dumps.dumps.items() if not d.problem]
    out = [safe_text(f"Flight Recorder dumps in {dumps.directory} (prefix '{dumps.prefix}', format "
                     f"{', '.join(versions) or '?'}): rank{'s' if len(dumps.world) != 1 else ''} {format_ranks(dumps.world)}, "
                     f"{len(readable)} readable dump{'s' if len(readable) != 1 else ''}")]
    for r in dumps.missing:
        out.append(f"- rank {r} left no dump: dead, or stuck outside any collective")
    if not dumps.world_known:
        out.append("- the dumps do not record the job's world size (gloo): a rank above "
                   f"{max(dumps.world)} that left no dump cannot be named; pass --world-size N")
    for r, d in sorted(dumps.dumps.items()):
        if d.problem:
            out.append(safe_text(f"- rank {r}'s dump is unreadable ({d.problem}): count it as no dump"))
    if not any(d.entries for d in dumps.dumps.values()):
        out.append("no collective recorded in any dump (was TORCH_FR_BUFFER_SIZE set, and did the job issue any?)")
    for v in verdicts:
        head = f"process group '{v.group}'" + (f" ({v.desc})" if v.desc else "") + f", rank{'s' if len(v.members) != 1 else ''} {format_ranks(v.members)}"
        if v.kind == "none":
            done = f"#{v.last_completed} completed" if v.last_completed >= 0 else "none seen completing"
            out.append(safe_text(f"{head}: no divergence (last collective #{v.last_seq}; {done})"))
        else:
            out.append(safe_text(f"{head}: the ranks diverge at collective #{v.seq}"))
            for ranks, e in v.variants:
                who = f"rank{'s' if len(ranks) != 1 else ''} {format_ranks(ranks)}"
                verb = "called" if v.kind == "mismatch" else "entered"
                out.append(f"    {who} {verb} #{v.seq} {describe_entry(e)}")
            for r, e in v.absent:
                last = f"last entered #{e.seq} {describe_entry(e)}" if e else "entered nothing in this group"
                out.append(f"    rank {r} never entered #{v.seq}; {last}")
            if v.timed_out:
                out.append(f"    rank{'s' if len(v.timed_out) != 1 else ''} {format_ranks(v.timed_out)}: #{v.seq} "
                           "retired without completing (the watchdog timed it out)")
            if v.missing:
                out.append(f"    rank{'s' if len(v.missing) != 1 else ''} {format_ranks(v.missing)}: no dump")
            out.append(f"  cause: {v.cause}")
            out.append(f"  fix:   {v.fix}")
        out += [f"  note: {safe_text(n)}" for n in v.notes]
    return out


def explain_dumps_command(directory: str, prefix: Optional[str], as_json: bool,
                          world_size: Optional[int] = None) -> int:
    """``ddpdoctor explain --fr DIR``: print each process group's divergence; exit 0 (a finding is not an error).

    Raises:
        UsageError: ``directory`` holds no readable dump (see :func:`~ddpdoctor.postmortem.flight_recorder.read_dumps`).
    """
    import json

    import click

    from ddpdoctor.postmortem.flight_recorder import read_dumps

    dumps = read_dumps(directory, prefix, world_size)
    verdicts = find_divergences(dumps)
    if as_json:
        doc = {"schema": 1, "directory": safe_text(dumps.directory), "prefix": safe_text(dumps.prefix),
               "formats": sorted({safe_text(d.version) for d in dumps.dumps.values() if d.version}),
               "world": dumps.world, "world_known": dumps.world_known, "missing_ranks": dumps.missing,
               "unreadable": {str(r): safe_text(d.problem) for r, d in dumps.dumps.items() if d.problem},
               "groups": [v.to_dict() for v in verdicts]}
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo("\n".join(render_divergences(dumps, verdicts)))
    return 0
