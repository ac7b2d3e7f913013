"""Load a checkpoint on every rank without piling every rank's copy onto GPU 0."""

from __future__ import annotations

import logging
import os
import pickle
from typing import Any, Callable, Mapping, Union

import torch

from ddpdoctor.dist.ranks import get_local_rank, get_rank
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
    if not os.path.isfile(path):
        raise CheckpointError("checkpoint-missing", f"rank {get_rank()} found no checkpoint file at {os.fspath(path)!r}",
                              "check the path and that the file system is shared by every node")
    try:
        return torch.load(path, map_location=location, weights_only=weights_only)
    except pickle.UnpicklingError as exc:
        if not weights_only:
            raise
        raise CheckpointError(
            "checkpoint-not-weights-only",
            f"{os.fspath(path)!r} holds objects that weights_only=True refuses: {str(exc).splitlines()[0]}",
            "allow the class with torch.serialization.add_safe_globals([...]), or pass weights_only=False "
            "only if you trust the file",
        ) from exc
