"""Load a checkpoint on every rank without piling every rank's copy onto GPU 0."""

from __future__ import annotations

import logging
import os
import pickle
import zipfile
from typing import Any, Callable, Mapping, Union

import torch

from ddpdoctor.training.ranks import get_local_rank, get_rank
from ddpdoctor.errors import DdpdoctorError

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
    except pickle.UnpicklingError as exc:
        if not weights_only or not zipfile.is_zipfile(path):  # not a torch.save archive: cut short or another file
            raise CheckpointError("checkpoint-corrupt", f"rank {rank} could not unpickle {name!r}: "
                                  f"{_first_line(exc)}", "check that the file was written completely "
                                  "(torch.save finished on the saving rank) and is not truncated") from exc
        raise CheckpointError(
            "checkpoint-not-weights-only",
            f"rank {rank}: {name!r} holds objects that weights_only=True refuses: {_refused(exc)}",
            "allow the class with torch.serialization.add_safe_globals([...]), or pass weights_only=False "
            "only if you trust the file",
        ) from exc
    except PermissionError as exc:
        raise CheckpointError("checkpoint-unreadable", f"rank {rank} may not read {name!r}: {exc.strerror}",
                              "fix the file's permissions for the user every rank runs as") from exc
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        text = _first_line(exc)
        if "cuda" in text.lower() and "deserialize" in text.lower():
            raise CheckpointError("checkpoint-cuda-on-cpu", f"rank {rank}: {name!r} holds CUDA tensors but this "
                                  f"rank has no usable GPU ({text})", "pass map_location=None (the CPU, the default) "
                                  "or map_location='rank'") from exc
        raise CheckpointError("checkpoint-corrupt", f"rank {rank} could not read {name!r} as a checkpoint "
                              f"({type(exc).__name__}: {text})", "check that the file was written completely "
                              "(torch.save finished, the copy was not cut short) and that it is a torch.save file"
                              ) from exc


def _refused(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if "Unsupported global" in line or "GLOBAL" in line:
            return line.strip()[:300]
    return _first_line(exc)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__
