"""PyTorch Flight Recorder dumps, read from a directory of per-rank files (``<prefix><rank>``).

Each rank's Flight Recorder keeps a ring of the last collectives it issued; a dump is a pickle (or, from
``_dump_fr_trace_json``, JSON) of plain dicts and lists: ``version``, ``pg_config`` (group name ->
name, desc, ranks), ``pg_status`` (pg_id -> last enqueued/started/completed sequence number) and
``entries`` (one per collective: ``pg_id``, ``process_group`` = (name, desc), ``collective_seq_id``,
``profiling_name`` such as ``gloo:all_reduce``, input/output sizes and dtypes, ``state``, ``frames``).
The schema is torch's (``torch/csrc/distributed/c10d/FlightRecorder.hpp``); this reader is ddpdoctor's
own because torch's analyzer crashes on gloo dumps and needs every rank's dump.

What this reader tolerates, on purpose:

- missing ranks (a rank that died, or never dumped) and dumps cut short by a kill while writing;
- truncated rings (only the last ``TORCH_FR_BUFFER_SIZE`` entries are kept);
- several process groups: the default group (named ``''`` in gloo's ``pg_config`` but ``'0'`` in its
  entries) and sub-groups whose members ``pg_config`` may not list;
- gloo's states: gloo leaves every entry ``scheduled``; what completed shows only in ``pg_status``.

Files are unpickled with an Unpickler that refuses every class, so a hostile file cannot run code.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from dataclasses import dataclass, field
from typing import Optional

from ddpdoctor.errors import UsageError
from ddpdoctor.system.redact import safe_text

__all__ = ["Entry", "RankDump", "DumpSet", "read_dumps", "read_dump", "OLDEST_FORMAT", "MAX_DUMP_BYTES"]

OLDEST_FORMAT = (2, 3)
"""The oldest dump format read: format 2.3 (torch's TraceUtils.h) already writes every key read here
(``pg_config``, ``pg_status``, ``process_group``, ``collective_seq_id``, ``profiling_name``, sizes, dtypes,
``state``, ``frames``); older formats were not checked, so they are refused in one line."""
MAX_DUMP_BYTES = 512 << 20
"""A larger file is not a Flight Recorder dump (2000 entries with stacks take a few MB)."""

_NAME = re.compile(r"^(.*?)(\d+)$")


@dataclass(frozen=True)
class Entry:
    """One recorded collective of one rank, normalised across formats and backends."""

    group: str  # the process group's name ('0' for the default group)
    group_desc: str
    pg_id: int
    seq: int  # collective_seq_id (p2p_seq_id for point-to-point entries)
    op: str  # 'all_reduce', without the backend prefix
    backend: str  # 'gloo', 'nccl', ... ('' when the name has no prefix)
    input_sizes: tuple
    input_dtypes: tuple
    output_sizes: tuple
    output_dtypes: tuple
    state: str  # 'scheduled', 'started', 'completed' as recorded
    retired: bool
    is_p2p: bool
    frames: tuple  # ((filename, line, name), ...), innermost first


@dataclass
class RankDump:
    """One rank's dump: its entries and the per-group status, or why it could not be read."""

    rank: int
    path: str
    version: str = ""
    entries: list = field(default_factory=list)
    status: dict = field(default_factory=dict)  # pg_id -> {'last_enqueued_collective': n, ...}
    config: dict = field(default_factory=dict)  # group name -> list of ranks ([] when not recorded)
    problem: str = ""  # set when the file exists but holds no readable dump (cut short by a kill)

    def completed(self, pg_id: int) -> int:
        """The last collective of group ``pg_id`` this rank saw complete (-1: none, or not recorded)."""
        return _int(self.status.get(pg_id, {}).get("last_completed_collective"), -1)

    def enqueued(self, pg_id: int) -> int:
        """The last collective of group ``pg_id`` this rank entered (-1: none, or not recorded)."""
        return _int(self.status.get(pg_id, {}).get("last_enqueued_collective"), -1)


@dataclass
class DumpSet:
    """Every rank's dump in one directory, and the ranks the job had that left none."""

    directory: str
    prefix: str
    dumps: dict  # rank -> RankDump
    world: list  # the ranks the job had: --world-size, else pg_config's default group, else the dumps'
    world_known: bool = True  # False: only the ranks that dumped are known (gloo's pg_config often lists none)

    @property
    def missing(self) -> list:
        return [r for r in self.world if r not in self.dumps]


class _PlainUnpickler(pickle.Unpickler):
    """Loads only builtin data (dict, list, tuple, str, bytes, numbers, bool, None): never a class."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it asks for {module}.{name}, and a Flight Recorder dump holds no objects")


class _CutShort(Exception):
    """The file ends inside the dump: its rank was killed while writing it, or it is empty."""


def read_dump(path: str) -> dict:
    """The raw dump in ``path`` (pickle or JSON), as plain dicts and lists.

    Raises:
        _CutShort: the file is empty or ends inside the pickle.
        UsageError: the file is not a Flight Recorder dump at all.
    """
    try:
        size = os.path.getsize(path)
        if size > MAX_DUMP_BYTES:
            raise UsageError("fr-dump-unreadable", f"{safe_text(path)} is {size >> 20} MiB, too large for a "
                             "Flight Recorder dump", "give the directory of the job's dump files")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UsageError("fr-dump-unreadable", f"{safe_text(path)}: {exc.strerror}",
                         "give a readable directory of dump files") from None
    if not data:
        raise _CutShort("the file is empty")
    if data.lstrip()[:1] == b"{":
        try:
            doc = json.loads(data.decode("utf-8", errors="replace"))
        except ValueError as exc:
            if "Expecting" in str(exc) and exc.pos >= len(data.rstrip()) - 1:  # ends mid-document
                raise _CutShort("the file ends inside the JSON") from None
            raise UsageError("fr-dump-unreadable", f"{safe_text(path)} is not a Flight Recorder dump "
                             f"(bad JSON: {safe_text(exc)})", "pass --prefix to name only the dump files") from None
    else:
        try:
            doc = _PlainUnpickler(io.BytesIO(data)).load()
        except EOFError:
            raise _CutShort("the file ends inside the pickle") from None
        except pickle.UnpicklingError as exc:
            if "truncated" in str(exc):
                raise _CutShort("the file ends inside the pickle") from None
            raise UsageError("fr-dump-unreadable", f"{safe_text(path)} is not a Flight Recorder dump "
                             f"({safe_text(exc)})", "pass --prefix to name only the dump files") from None
        except (ValueError, TypeError, IndexError, KeyError, AttributeError,
                MemoryError, RecursionError, OverflowError, UnicodeDecodeError) as exc:
            raise UsageError("fr-dump-unreadable", f"{safe_text(path)} is not a Flight Recorder dump "
                             f"({safe_text(exc)})", "pass --prefix to name only the dump files") from None
    if not isinstance(doc, dict) or "version" not in doc:
        raise UsageError("fr-dump-unreadable", f"{safe_text(path)} is not a Flight Recorder dump (no version key)",
                         "pass --prefix to name only the dump files")
    return doc


def _int(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _version(text: str) -> tuple:
    parts = str(text).split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return (0, 0)


def _sizes(value) -> tuple:
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(tuple(_int(d, -1) for d in s) if isinstance(s, (list, tuple)) else () for s in value)


def _strings(value) -> tuple:
    return tuple(str(v) for v in value) if isinstance(value, (list, tuple)) else ()


def _frames(value) -> tuple:
    out = []
    for f in value if isinstance(value, (list, tuple)) else ():
        if isinstance(f, dict):
            out.append((str(f.get("filename", "?")), _int(f.get("line"), 0), str(f.get("name", "?"))))
    return tuple(out)


def _entry(raw: dict) -> Optional[Entry]:
    if not isinstance(raw, dict):
        return None
    name = raw.get("process_group")
    group, desc = (str(name[0]), str(name[1])) if isinstance(name, (list, tuple)) and len(name) == 2 \
        else (str(raw.get("pg_id", "?")), "")
    is_p2p = bool(raw.get("is_p2p", False))
    backend, _, op = str(raw.get("profiling_name", "?")).rpartition(":")
    seq = _int(raw.get("p2p_seq_id" if is_p2p else "collective_seq_id"), -1)
    if seq < 0:
        return None
    return Entry(group=group, group_desc=desc, pg_id=_int(raw.get("pg_id"), -1), seq=seq, op=op,
                 backend=backend, input_sizes=_sizes(raw.get("input_sizes")),
                 input_dtypes=_strings(raw.get("input_dtypes")), output_sizes=_sizes(raw.get("output_sizes")),
                 output_dtypes=_strings(raw.get("output_dtypes")), state=str(raw.get("state", "?")),
                 retired=bool(raw.get("retired", False)), is_p2p=is_p2p, frames=_frames(raw.get("frames")))


def _ranks(text) -> list:
    """pg_config's ranks, written as the string '[0, 1, 2]' (or a list in some formats)."""
    if isinstance(text, (list, tuple)):
        return sorted({_int(r, -1) for r in text} - {-1})
    return sorted({int(m) for m in re.findall(r"\d+", str(text))})


def _rank_dump(rank: int, path: str, doc: dict) -> RankDump:
    version = str(doc.get("version", ""))
    if _version(version) < OLDEST_FORMAT:
        raise UsageError("fr-format-too-old", f"{safe_text(path)} is Flight Recorder format {safe_text(version)}; "
                         f"ddpdoctor reads format {OLDEST_FORMAT[0]}.{OLDEST_FORMAT[1]} and newer", "read it with torch's own 'python -m torch.distributed.flight_recorder.fr_trace', "
                         "or rerun the job with a newer torch")
    entries = [e for e in map(_entry, doc.get("entries") or []) if e is not None]
    status = {}
    for key, value in (doc.get("pg_status") or {}).items():
        if isinstance(value, dict):
            status[_int(key, -1)] = value
    config = {}
    for key, value in (doc.get("pg_config") or {}).items():
        if isinstance(value, dict):
            config[str(key)] = _ranks(value.get("ranks", ""))
    return RankDump(rank=rank, path=path, version=version, entries=entries, status=status, config=config)


def _prefix_of(names: list, directory: str) -> str:
    found: dict = {}
    for n in names:
        m = _NAME.match(n)
        if m:
            found.setdefault(m.group(1), []).append(n)
    if not found:
        raise UsageError("fr-no-dumps", f"{safe_text(directory)} holds no Flight Recorder dumps (no file named "
                         "<prefix><rank>)", "give the directory TORCH_FR_DUMP_TEMP_FILE pointed into")
    if len(found) > 1:
        best = max(found, key=lambda p: len(found[p]))
        tied = [p for p in found if len(found[p]) == len(found[best])]
        if len(tied) > 1:
            shown = ", ".join(repr(safe_text(p)) for p in sorted(found))
            raise UsageError("fr-prefix-ambiguous", f"{safe_text(directory)} holds files of several prefixes "
                             f"({shown})", "pass --prefix to name the dump files")
        return best
    return next(iter(found))


def read_dumps(directory: str, prefix: Optional[str] = None, world_size: Optional[int] = None) -> DumpSet:
    """Every ``<prefix><rank>`` dump in ``directory`` (``prefix`` guessed when the names agree on one).

    ``world_size``: the job's number of ranks, for dumps that do not record it (then a rank that left no
    dump can only be named when it is given).

    Raises:
        UsageError: not a directory, no dump in it, a file of the prefix that is not a dump, or a format
            older than :data:`OLDEST_FORMAT` (exit 2, one line).
    """
    if not os.path.isdir(directory):
        raise UsageError("fr-not-a-directory", f"--fr {safe_text(directory)} is not a directory",
                         "give the directory that holds the per-rank dump files")
    try:
        names = sorted(n for n in os.listdir(directory) if os.path.isfile(os.path.join(directory, n)))
    except OSError as exc:
        raise UsageError("fr-not-a-directory", f"--fr {safe_text(directory)}: {exc.strerror}",
                         "give a readable directory") from None
    if prefix is None:
        prefix = _prefix_of(names, directory)
    dumps: dict = {}
    for n in names:
        if not n.startswith(prefix) or not n[len(prefix):].isdigit():
            continue
        rank, path = int(n[len(prefix):]), os.path.join(directory, n)
        try:
            dumps[rank] = _rank_dump(rank, path, read_dump(path))
        except _CutShort as why:
            dumps[rank] = RankDump(rank=rank, path=path, problem=f"{why}: cut short, likely killed while writing it")
    if not dumps:
        raise UsageError("fr-no-dumps", f"{safe_text(directory)} holds no file named {safe_text(prefix)}<rank>",
                         "check --prefix (TORCH_FR_DUMP_TEMP_FILE's last part) and the directory")
    if all(d.problem for d in dumps.values()):
        first = dumps[min(dumps)]
        raise UsageError("fr-dump-unreadable", f"no readable dump in {safe_text(directory)}: "
                         f"{safe_text(os.path.basename(first.path))}: {first.problem}",
                         "give the directory of a job whose ranks finished writing their dumps")
    if world_size is not None and max(dumps) >= world_size:
        raise UsageError("fr-world-size", f"--world-size {world_size}, but {safe_text(directory)} holds the dump "
                         f"of rank {max(dumps)}", f"pass --world-size {max(dumps) + 1} or more, or leave it out")
    recorded = _recorded_world(dumps)
    ranks = set(dumps) | recorded | (set(range(world_size)) if world_size else set())
    return DumpSet(directory=directory, prefix=prefix, dumps=dumps, world=sorted(ranks),
                   world_known=bool(world_size) or bool(recorded))


def _recorded_world(dumps: dict) -> set:
    """The default group's ranks as any dump's pg_config lists them (gloo's often lists none)."""
    ranks: set = set()
    for d in dumps.values():
        for name in ("", "0"):
            ranks.update(d.config.get(name, []))
    return ranks
