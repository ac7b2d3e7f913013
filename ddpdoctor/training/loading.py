"""Load a checkpoint on every rank without piling every rank's copy onto GPU 0."""

from __future__ import annotations

import io
import logging
import os
import pickle
import pickletools
import re
import zipfile
from typing import Any, Callable, Mapping, Optional, Union

import torch

from ddpdoctor.training.ranks import get_local_rank, get_rank
from ddpdoctor.errors import DdpdoctorError
from ddpdoctor.system.redact import safe_text

__all__ = ["CheckpointError", "load_checkpoint"]

logger = logging.getLogger(__name__)

MapLocation = Union[None, str, torch.device, Mapping[str, str], Callable[..., Any]]


class CheckpointError(DdpdoctorError):
    """A checkpoint could not be loaded; the message names the file and the reason."""


def own_device() -> torch.device:
    """This rank's own device: ``cuda:LOCAL_RANK`` (modulo the visible GPUs) when CUDA is available, else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", get_local_rank() % torch.cuda.device_count())
    return torch.device("cpu")


def _resolve(map_location: MapLocation) -> Any:
    if map_location is None:
        return torch.device("cpu")
    if isinstance(map_location, str) and map_location in ("rank", "local", "own"):
        return own_device()
    if isinstance(map_location, (str, torch.device)):
        device = torch.device(map_location)
        if device.type == "cuda" and device.index is None:
            # A bare "cuda" means the current device, which is GPU 0 on every rank that never
            # called set_device: N copies on one GPU. Use this rank's own GPU instead.
            return own_device() if torch.cuda.is_available() else device
        return device
    return map_location


def load_checkpoint(path: Union[str, os.PathLike], *, map_location: MapLocation = None,
                    weights_only: bool = True) -> Any:
    """``torch.load`` for training code that runs on every rank.

    Tensors land on the CPU by default. Saved CUDA tensors otherwise go back to the GPU they were
    saved from, usually GPU 0, so every rank would allocate its own copy there and run GPU 0 out of
    memory. ``map_location="rank"`` (or a bare ``"cuda"``) loads onto this rank's own GPU
    (``cuda:LOCAL_RANK``); any other ``torch.load`` map_location is passed through.

    ``weights_only=True`` is the default because a checkpoint is a pickle: with ``False`` loading
    a file runs whatever code it names, so a downloaded or shared checkpoint could execute
    anything on every node. Pass ``weights_only=False`` only for files you wrote yourself.

    Args:
        path: the checkpoint file.
        map_location: None (CPU), ``"rank"`` (this rank's own device), or a torch.load map_location.
        weights_only: refuse anything but tensors, primitive types and allow-listed classes.

    Raises:
        CheckpointError: the file is missing, or it holds objects that ``weights_only`` refuses
            (naming the file and the fix).
    """
    location = _resolve(map_location)
    name, rank = os.fspath(path), get_rank()
    if os.path.isdir(path):
        raise CheckpointError("checkpoint-is-directory", f"rank {rank}: {name!r} is a directory, not a checkpoint file",
                              "pass the file inside it (e.g. model.pt), or load sharded checkpoints with "
                              "torch.distributed.checkpoint")
    if not os.path.isfile(path):
        raise CheckpointError("checkpoint-missing", f"rank {rank} found no checkpoint file at {name!r}",
                              "check the path and that the file system is shared by every node")
    try:
        return torch.load(path, map_location=location, weights_only=weights_only)
    except PermissionError as exc:
        raise CheckpointError("checkpoint-unreadable", f"rank {rank} may not read {name!r}: {exc.strerror}",
                              "fix the file's permissions for the user every rank runs as") from exc
    except Exception as exc:  # noqa: BLE001 - the unpicklers raise anything (IndexError, KeyError, ...) on bad bytes
        raise _explain(exc, path, name, rank, weights_only) from exc


def _explain(exc: Exception, path: Union[str, os.PathLike], name: str, rank: int,
             weights_only: bool) -> CheckpointError:
    """Why ``torch.load`` failed: refused by weights_only, CUDA tensors without a GPU, or not a whole checkpoint.

    Decided from the file itself, never from which exception the unpickler happened to raise: its
    pickle is read opcode by opcode (:mod:`pickletools` runs nothing), so a complete pickle that
    weights_only refused is told apart from a cut-short copy, a CSV or random bytes.
    """
    text = _first_line(exc)
    if "cuda" in text.lower() and "deserialize" in text.lower():
        return CheckpointError("checkpoint-cuda-on-cpu", f"rank {rank}: {name!r} holds CUDA tensors but this "
                               f"rank has no usable GPU ({text})", "pass map_location=None (the CPU, the default) "
                               "or map_location='rank'")
    problem, names, kind = _pickle_problem(path)
    # The weights-only unpickler's own failures (a Warning too: its protocol warning under -W error)
    refused = _refused(exc, names) if weights_only and isinstance(exc, (pickle.UnpicklingError, Warning)) else None
    if problem is None and refused:
        return CheckpointError(
            "checkpoint-not-weights-only",
            f"rank {rank}: {name!r} was refused, not damaged: weights_only=True loads only tensors, primitive "
            f"types and allow-listed classes, and this file names {refused}",
            "if you trust the file (you wrote it), allow the class with torch.serialization.add_safe_globals([...]) "
            "or pass weights_only=False; never for a file from elsewhere: loading it could run any code it names")
    if problem is None and kind == "pickle":
        return CheckpointError(
            "checkpoint-unloadable", f"rank {rank} could not load {name!r}: it is a plain pickle (pickle.dump), "
            "not a torch.save file", "save it with torch.save, or read it with pickle.load only if you trust it "
            "(unpickling runs any code the file names)")
    if problem is None and isinstance(exc, (AttributeError, ImportError, pickle.UnpicklingError)):
        return CheckpointError(
            "checkpoint-unloadable", f"rank {rank} could not load {name!r}: its pickle is whole but a class it "
            f"names is missing ({type(exc).__name__}: {text})",
            "make every class it names importable under the module path it was saved from")
    if problem is None and weights_only and isinstance(exc, pickle.UnpicklingError):
        return CheckpointError(
            "checkpoint-not-weights-only", f"rank {rank}: {name!r} was refused, not damaged: weights_only=True "
            f"cannot read it ({text})", "pass weights_only=False only if you trust the file (you wrote it)")
    if problem is None:
        problem = f"its tensor data is cut short or damaged ({type(exc).__name__}: {text})"
    return CheckpointError("checkpoint-corrupt", f"rank {rank} could not read {name!r} as a checkpoint: {problem}",
                           "check that it is a torch.save file and that it was written completely (torch.save "
                           "finished on the saving rank, the copy was not cut short)")


def _pickle_problem(path: Union[str, os.PathLike]) -> tuple[Optional[str], list[str], str]:
    """(what makes the file no whole checkpoint or None, the globals its pickle names, its kind).

    The kind is ``zip`` (torch.save), ``legacy`` (torch.save with _use_new_zipfile_serialization=False),
    ``pickle`` (a plain pickle.dump file) or ``other``.

    A torch.save file is a zip archive holding ``data.pkl``, or (the legacy format) a file that starts
    with a pickle. Only opcodes are parsed; nothing is imported or called.
    """
    try:
        size = os.path.getsize(path)
        if size == 0:
            return "the file is empty (0 bytes)", [], "other"
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                pickles = [n for n in archive.namelist() if n.endswith("data.pkl")]
                if not pickles:
                    return "a zip archive without data.pkl: not a torch.save file", [], "other"
                with archive.open(pickles[0]) as stream:
                    return _scan(io.BytesIO(stream.read(_SCAN_LIMIT)), zipped=True)
        with open(path, "rb") as stream:
            head = stream.read(_SCAN_LIMIT)
    except (OSError, zipfile.BadZipFile, RuntimeError, ValueError, EOFError) as exc:
        return f"{type(exc).__name__}: {_first_line(exc)}", [], "other"
    if head[:2] == b"PK":
        return f"a damaged or cut-short zip archive ({size} bytes)", [], "other"
    return _scan(io.BytesIO(head), zipped=False)


_SCAN_LIMIT = 64 << 20  # a checkpoint's pickle holds the structure, not the tensors: a few MB at most


def _scan(stream: io.BytesIO, *, zipped: bool) -> tuple[Optional[str], list[str], str]:
    """Parse the pickle(s) at the start of ``stream``: one in a zip archive or a plain pickle, the
    five a legacy torch.save file starts with (magic number, protocol, system info, object, storage keys)."""
    names: list[str] = []
    wanted, kind = 1, "zip" if zipped else "pickle"
    for index in range(5):
        if index == wanted:
            break
        try:
            args = _scan_one(stream, names)
        except Exception as exc:  # noqa: BLE001 - genops raises ValueError, but any failure means "not a pickle"
            if zipped:
                return f"its pickle is cut short or damaged ({type(exc).__name__}: {_first_line(exc)})", names, kind
            start = stream.getvalue()[:12]
            if index or start[:1] == b"\x80":  # PROTO: a pickle that stops short
                return "its pickle is cut short or damaged", names, kind
            return f"it is not a torch.save file (it starts with {safe_text(repr(start))})", names, "other"
        if index == 0 and not zipped and torch.serialization.MAGIC_NUMBER in args:
            wanted, kind = 5, "legacy"
    return None, names, kind


def _scan_one(stream: io.BytesIO, names: list[str]) -> list[Any]:
    """One pickle's opcodes up to its STOP; the globals it names are added to ``names``."""
    strings: list[str] = []
    memo: dict[Any, str] = {}
    args: list[Any] = []
    for opcode, arg, _ in pickletools.genops(stream):
        args.append(arg)
        if opcode.name == "GLOBAL":
            names.append(str(arg).replace(" ", "."))
        elif opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"):
            strings.append(str(arg))
        elif opcode.name == "MEMOIZE" and strings:
            memo[len(memo)] = strings[-1]
        elif opcode.name in ("BINGET", "LONG_BINGET", "GET") and arg in memo:
            strings.append(memo[arg])
        elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
            names.append(f"{strings[-2]}.{strings[-1]}")
    if not args:
        raise ValueError("no pickle")
    return args


def _refused(exc: BaseException, names: list[str]) -> Optional[str]:
    """What the weights-only unpickler refused: its own words when it names a global, else the globals
    the pickle names that are not allowed (None when it names none)."""
    match = re.search(r"GLOBAL ([\w.]+)", str(exc))
    if match:
        return safe_text(match.group(1))
    unsafe = [n for n in dict.fromkeys(names) if n not in _allowed_globals()]
    if unsafe:
        return ", ".join(safe_text(n) for n in unsafe[:5])
    return None


def _allowed_globals() -> set[str]:
    """The globals weights_only allows by default and those the program added."""
    allowed: set[str] = set()
    try:
        from torch import _weights_only_unpickler
        allowed.update(_weights_only_unpickler._get_allowed_globals())
    except (ImportError, AttributeError):  # a torch without it: every global is listed
        pass
    for item in torch.serialization.get_safe_globals():
        obj = item[0] if isinstance(item, tuple) else item
        allowed.add(f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}")
    return allowed


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return safe_text(lines[0][:300]) if lines else type(exc).__name__
