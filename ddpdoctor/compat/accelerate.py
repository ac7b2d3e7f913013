"""accelerate's operations and process helpers, with accelerate's semantics (accelerate 1.15).

``accelerate.utils.gather`` -> ``gather`` and so on; the ``PartialState`` / ``Accelerator`` methods
(``split_between_processes``, ``on_main_process``, ``set_trigger`` ...) are functions here that read
the job from the launcher's variables and the process group, with the same arguments and results.

Deliberately different, because accelerate hangs or misaligns there:

* every collective takes ddpdoctor's agreement step first, so a rank with another shape, structure or
  a bad leaf makes every rank raise instead of hanging the others. The error keeps accelerate's class:
  a string in ``gather``/``reduce`` raises :class:`~ddpdoctor.compat.mismatch.CollectiveTypeError`
  (a ``TypeError``) on every rank; ``broadcast`` with shapes that differ raises
  :class:`DistributedOperationException` always (accelerate checks only with
  ``ACCELERATE_DEBUG_MODE=1``);
* ``gather`` also takes tensors whose dim 0 differs between ranks (accelerate's all_gather_into_tensor
  needs equal shapes);
* ``on_main_process`` and friends decide at each call, not when decorating, and "main" is
  :func:`ddpdoctor.training.is_rank_zero`'s rule.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from ddpdoctor.compat.collection import flat_leaves, map_leaves
from ddpdoctor.compat.exchange import broadcast_into, group_exists
from ddpdoctor.compat.mismatch import as_builtin
from ddpdoctor.training import (CollectiveMismatchError, broadcast_object, get_local_rank, get_rank, get_world_size,
                                is_rank_zero)
from ddpdoctor.training import barrier as _barrier
from ddpdoctor.training import gather as _gather
from ddpdoctor.training import gather_object as _objects
from ddpdoctor.training import pad_across_processes as _pad
from ddpdoctor.training import reduce as _reduce
from ddpdoctor.training.gathering import Unreducible

__all__ = ["gather", "gather_object", "broadcast", "broadcast_object_list", "reduce", "pad_across_processes",
           "split_between_processes", "on_main_process", "on_local_main_process", "on_last_process", "on_process",
           "synchronize_rng_states", "synchronize_rng_state", "set_trigger", "check_trigger", "join_uneven_inputs",
           "wait_for_everyone", "DistributedOperationException", "CannotPadNestedTensorWarning"]


class DistributedOperationException(CollectiveMismatchError):
    """accelerate's error for an operation whose inputs differ across processes; raised on every rank."""


class CannotPadNestedTensorWarning(UserWarning):
    """accelerate's warning: a nested tensor is returned unpadded."""


def _unsupported(func: str) -> Callable[[Any], Any]:
    def leaf(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x
        return Unreducible(TypeError(
            f"Unsupported types ({type(x)}) passed to `{func}`. Only nested list/tuple/dicts of objects that are "
            f"valid for `is_torch_tensor` should be passed."))
    return leaf


def gather(tensor: Any) -> Any:
    """accelerate's ``gather``: every rank's tensors concatenated along dim 0, on every rank, structure kept.

    Raises:
        CollectiveTypeError: (a ``TypeError``) on every rank, when some rank's data holds a non-tensor leaf.
        CollectiveMismatchError: on every rank, when ranks pass different structures, dtypes or shapes beyond dim 0.
    """
    if not group_exists("gather()"):
        return tensor
    return as_builtin(lambda: _gather(tensor))


def gather_object(object: Any) -> Any:
    """accelerate's ``gather_object``: every rank's list, concatenated in rank order (``object`` itself alone).

    Raises:
        TypeError: on every rank, when some rank's ``object`` is not iterable (accelerate's own error).
    """
    if not group_exists("gather_object()"):
        return object
    parts = _objects(object)
    assert parts is not None
    return [x for y in parts for x in y]


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """accelerate's ``broadcast``: ``from_process``'s tensors copied in place into every rank's, structure kept.

    Raises:
        DistributedOperationException: on every rank, when the ranks' shapes or structures differ (what
            accelerate's debug mode checks; without it accelerate hangs or corrupts).
        CollectiveTypeError: on every rank, when some rank's data holds a non-tensor leaf.
    """
    if not group_exists("broadcast()"):
        return tensor
    leaves: list[torch.Tensor] = []
    bad: Optional[str] = None

    def collect(x: Any) -> Any:
        nonlocal bad
        if isinstance(x, torch.Tensor):
            leaves.append(x)
        elif bad is None:
            bad = (f"TypeError: Unsupported types ({type(x)}) passed to `_gpu_broadcast_one`. Only nested list/tuple/dicts of "
                   f"objects that are valid for `is_torch_tensor` should be passed.")
        return x
    map_leaves(tensor, collect)
    shapes = map_leaves(tensor, lambda x: list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__)

    def mismatch(table: list[Any]) -> BaseException:
        lines = "\n".join(f"  - Process {r}: {shape}" for r, shape in enumerate(table))
        return DistributedOperationException(
            "collective-mismatch",
            "Cannot apply desired operation due to shape mismatches. All shapes across devices must be valid."
            f"\n\nOperation: `accelerate.utils.operations.broadcast`\nInput shapes:\n{lines}",
            "pass the same shapes on every rank")
    broadcast_into(leaves, shapes, bad, from_process, what="broadcast()", on_mismatch=mismatch)
    return tensor


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """accelerate's ``broadcast_object_list``: ``object_list`` replaced in place by ``from_process``'s, and returned."""
    if not group_exists("broadcast_object_list()"):
        return object_list
    object_list[:] = broadcast_object(list(object_list), from_process)
    return object_list


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """accelerate's ``reduce``: a new structure with each tensor summed over the ranks; ``"mean"`` divides.

    Any ``reduction`` other than ``"mean"`` sums, as accelerate (``"sum"``, ``"none"``); ``scale`` is
    accelerate's XLA-only factor and is not applied. A mean of integer tensors raises torch's
    ``RuntimeError`` (in-place true division), as accelerate; every rank alike.

    Raises:
        CollectiveTypeError: (a ``TypeError``) on every rank, when some rank's data holds a non-tensor leaf.
        CollectiveMismatchError: on every rank, when ranks pass different structures, dtypes or shapes.
    """
    checked = map_leaves(tensor, _unsupported("_reduce_across_processes"))
    if not group_exists("reduce()"):
        for leaf in flat_leaves(checked):
            if isinstance(leaf, Unreducible):
                raise leaf.error
        return map_leaves(tensor, lambda t: t.clone())
    summed = as_builtin(lambda: _reduce(checked, "sum"))
    world = get_world_size()

    def finish(t: torch.Tensor) -> torch.Tensor:
        if reduction == "mean":
            t /= world
        return t
    return map_leaves(summed, finish)


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """accelerate's ``pad_across_processes``: each tensor padded along ``dim`` to the largest size of any rank.

    A nested tensor is returned as it is with accelerate's :class:`CannotPadNestedTensorWarning`.
    """
    nested: dict[int, torch.Tensor] = {}
    count = iter(range(1 << 62))

    def hide(x: Any) -> Any:
        i = next(count)
        if getattr(x, "is_nested", False):
            warnings.warn("Cannot pad nested tensors without more information. Leaving unprocessed.",
                          CannotPadNestedTensorWarning, stacklevel=3)
            nested[i] = x
            return torch.zeros(())  # a 0-d stand-in: the padding leaves it alone, as accelerate the nested tensor
        return x
    shown = map_leaves(tensor, hide)
    if not group_exists("pad_across_processes()"):
        return tensor
    padded = as_builtin(lambda: _pad(shown, dim=dim, pad_index=pad_index, pad_first=pad_first))
    if not nested:
        return padded
    count = iter(range(1 << 62))
    return map_leaves(padded, lambda x: nested.get(next(count), x))


@contextlib.contextmanager
def split_between_processes(inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
    """``PartialState.split_between_processes``: this rank's share of a list, tuple, tensor or dict of them.

    The first ``len % world`` ranks get one more item; with ``apply_padding`` every rank's share is
    made as long as the longest with copies of the last item (tensors through
    :func:`pad_across_processes`, so every rank takes part). A dict is split value by value, in place.
    """
    world = get_world_size()
    if world == 1:
        yield inputs
        return
    rank = get_rank()
    length = len(inputs)
    if isinstance(inputs, dict):
        length = len(inputs[list(inputs.keys())[0]])
        if not all(len(v) == length for v in inputs.values()):
            raise ValueError("All values in the dictionary must have the same length")
    per, extras = divmod(length, world)
    start = rank * per + min(rank, extras)
    end = start + per + (1 if rank < extras else 0)

    def split(values: Any) -> Any:
        if isinstance(values, (list, tuple, torch.Tensor)):
            result = values[start:end]
            if apply_padding:
                if isinstance(result, torch.Tensor):
                    short = result.shape[0]
                    result = _pad(result, dim=0)
                    result[short:] = values[-1]
                else:
                    result += [values[-1]] * (per + (1 if extras > 0 else 0) - len(result))
            return result
        if isinstance(values, dict):
            for key in values.keys():
                values[key] = split(values[key])
            return values
        return values
    yield split(inputs)


def _decide(function: Optional[Callable[..., Any]], runs: Callable[[], bool]) -> Any:
    @functools.wraps(function)  # type: ignore[arg-type]
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if runs():
            return function(*args, **kwargs)  # type: ignore[misc]
        return None
    return wrapper


def on_main_process(function: Callable[..., Any]) -> Callable[..., Any]:
    """``PartialState.on_main_process``: ``function`` runs on the main process only (others return None)."""
    return _decide(function, is_rank_zero)


def on_local_main_process(function: Callable[..., Any]) -> Callable[..., Any]:
    """``PartialState.on_local_main_process``: ``function`` runs on each node's local rank 0 only."""
    return _decide(function, lambda: get_local_rank() == 0)


def on_last_process(function: Callable[..., Any]) -> Callable[..., Any]:
    """``PartialState.on_last_process``: ``function`` runs on the last rank only."""
    return _decide(function, lambda: get_rank() == get_world_size() - 1)


def on_process(function: Optional[Callable[..., Any]] = None, process_index: Optional[int] = None) -> Any:
    """``PartialState.on_process``: ``function`` runs on rank ``process_index`` only (``@on_process(process_index=1)``)."""
    if function is None:
        return functools.partial(on_process, process_index=process_index)
    return _decide(function, lambda: get_rank() == process_index)


_RNG_TYPES = ("torch", "cuda", "mlu", "sdaa", "musa", "npu", "xla", "xpu", "hpu", "generator")


def synchronize_rng_state(rng_type: Optional[str] = None, generator: Optional[torch.Generator] = None) -> None:
    """accelerate's ``synchronize_rng_state``: rank 0's random state on every rank (``torch``, ``cuda``, ``generator``)."""
    name = getattr(rng_type, "value", rng_type)
    if name not in _RNG_TYPES:
        raise ValueError(f"{rng_type!r} is not a valid RNGType; use one of {', '.join(_RNG_TYPES)}")
    if name == "torch":
        state = torch.get_rng_state()
    elif name == "cuda":
        state = torch.cuda.get_rng_state()
    elif name == "generator":
        assert generator is not None, "Need a generator to synchronize its seed."
        state = generator.get_state()
    else:
        raise NotImplementedError(f"synchronize_rng_state({name!r}): this device's random state is not supported here")
    if group_exists("synchronize_rng_state()"):
        state = broadcast_object(state, 0)
    if name == "torch":
        torch.set_rng_state(state)
    elif name == "cuda":
        torch.cuda.set_rng_state(state)
    else:
        generator.set_state(state)  # type: ignore[union-attr]


def synchronize_rng_states(rng_types: Sequence[str], generator: Optional[torch.Generator] = None) -> None:
    """accelerate's ``synchronize_rng_states``: :func:`synchronize_rng_state` for each of ``rng_types``."""
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator=generator)


_flag: Optional[torch.Tensor] = None


def set_trigger() -> None:
    """``Accelerator.set_trigger``: this rank asks every rank to stop at the next :func:`check_trigger`."""
    global _flag
    _flag = torch.tensor(1)


def check_trigger() -> bool:
    """``Accelerator.check_trigger``: True on every rank when any rank called :func:`set_trigger` since the last check.

    A collective: every rank must call it at the same point.
    """
    global _flag
    if _flag is None:
        _flag = torch.tensor(0)
    total = _reduce(_flag, "sum") if group_exists("check_trigger()") else _flag
    if total.item() >= 1:
        _flag = torch.tensor(0)
        return True
    return False


@contextlib.contextmanager
def join_uneven_inputs(joinables: Sequence[Any], even_batches: Optional[bool] = None) -> Iterator[None]:
    """``Accelerator.join_uneven_inputs``: torch's ``Join`` over ``joinables`` (DDP models), so ranks with fewer
    batches shadow the others' collectives instead of hanging them.

    Outside a distributed job it warns as accelerate and does nothing. ``even_batches`` changes
    accelerate's prepared data loaders, which do not exist here: it is accepted and ignored, with a warning.
    """
    if even_batches is not None:
        warnings.warn("join_uneven_inputs(even_batches=...) has no effect here: there are no accelerate data "
                      "loaders to change; build uneven DataLoaders yourself", UserWarning, stacklevel=3)
    if group_exists("join_uneven_inputs()") and get_world_size() > 1:
        from torch.distributed.algorithms.join import Join

        with Join(list(joinables), enable=True, throw_on_early_termination=False):
            yield
        return
    warnings.warn("Joining uneven inputs is only supported for multi-GPU training, as a result "
                  "`join_uneven_inputs` will have no effect.", UserWarning, stacklevel=3)
    yield


#: ``Accelerator.wait_for_everyone``.
wait_for_everyone = _barrier
