"""The real DistributedDataParallel, without importing ``torch._dynamo`` (for param-sync, bn-sync).

Importing ``torch._dynamo`` costs about as much as importing torch itself (seconds), and it happened
on every rank, on the check's critical path (issue 18): ``DistributedDataParallel.__init__`` reads
one dynamo setting (``torch._dynamo.utils.get_optimize_ddp_mode()``), DDP's forward passes through
``torch._disable_dynamo``, which imports dynamo on its first call, and so does every
``torch.optim`` optimizer. In eager mode none of it changes what runs: the setting's default selects
the C++ Reducer, and "disable dynamo" around an eager call is the call itself.

So the checks still construct the real ``DistributedDataParallel`` (the real broadcast of rank 0's
state, the real C++ Reducer: gradient buckets, averaging, unused-parameter detection, buffer
broadcast in forward), with three differences that do not change eager behaviour:

- during ``__init__`` only, ``sys.modules["torch._dynamo"]`` is a placeholder that answers that one
  setting with dynamo's default and raises on anything else; if a future torch asks it for more,
  the placeholder is removed and the construction runs again with the real module (the question is
  the first statement of ``__init__``, before any collective);
- the ``_disable_dynamo`` wrappers on DDP's methods are told their plain function is already
  resolved (what they would cache after importing dynamo when nothing is being compiled);
- :func:`sgd_step` is plain SGD with momentum, the arithmetic of ``torch.optim.SGD``'s defaults.

When ``torch._dynamo`` is already imported (a ``--model`` factory imported it), nothing is replaced.
``tests/test_ddp_eager.py`` runs this and the stock path on the same models in a gloo world and
compares parameters after construction, gradients, buffers, unused-parameter behaviour and the
parameters after SGD steps, bit for bit.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Iterable, Optional

import torch
from torch.nn.parallel import DistributedDataParallel

__all__ = ["wrap_ddp", "sgd_step", "zero_grad", "dynamo_imported"]

_DYNAMO = "torch._dynamo"
_DDP_MODE = "ddp_optimizer"  # what get_optimize_ddp_mode() returns for dynamo's default config


class _NotInPlaceholder(AttributeError):
    """The placeholder was asked for something other than the one setting DDP reads."""


def _placeholder() -> types.ModuleType:
    mod = types.ModuleType(_DYNAMO, "ddpdoctor's stand-in while DistributedDataParallel is constructed")
    mod.utils = types.SimpleNamespace(get_optimize_ddp_mode=lambda: _DDP_MODE)  # type: ignore[attr-defined]

    def missing(name: str) -> Any:
        raise _NotInPlaceholder(f"torch._dynamo.{name} (ddpdoctor's placeholder has only utils.get_optimize_ddp_mode)")

    mod.__getattr__ = missing  # type: ignore[attr-defined]
    return mod


def dynamo_imported() -> bool:
    """Whether the real ``torch._dynamo`` is loaded in this process."""
    return _DYNAMO in sys.modules


def _resolve_disable_wrappers(cls: type) -> None:
    """Give each ``torch._disable_dynamo`` wrapper on ``cls`` its plain function as the cached result.

    The wrapper (torch/_compile.py) looks up ``fn.__dynamo_disable`` and only imports dynamo to
    create it when missing; when nothing is compiled, the disabled function runs ``fn`` unchanged.
    """
    probe = torch._disable_dynamo(lambda: None)
    inner_code = getattr(probe, "__code__", None)
    for value in vars(cls).values():
        fn = value
        for _ in range(4):  # e.g. contextmanager(_disable_dynamo(fn)): follow the __wrapped__ chain
            if getattr(fn, "__code__", None) is inner_code and inner_code is not None:
                plain = getattr(fn, "__wrapped__", None)
                if plain is not None and getattr(plain, "__dynamo_disable", None) is None:
                    setattr(plain, "__dynamo_disable", plain)
                break
            fn = getattr(fn, "__wrapped__", None)
            if fn is None:
                break


def wrap_ddp(model: torch.nn.Module, device_ids: Optional[list] = None,
             find_unused_parameters: bool = False) -> DistributedDataParallel:
    """``DistributedDataParallel(model, device_ids, find_unused_parameters)`` without importing dynamo."""
    kwargs: dict[str, Any] = {"find_unused_parameters": find_unused_parameters}
    if device_ids is not None:
        kwargs["device_ids"] = device_ids
    if dynamo_imported():
        return DistributedDataParallel(model, **kwargs)
    stub = _placeholder()
    sys.modules[_DYNAMO] = stub
    try:
        ddp: Optional[DistributedDataParallel] = DistributedDataParallel(model, **kwargs)
    except _NotInPlaceholder:
        ddp = None
    finally:
        if sys.modules.get(_DYNAMO) is stub:
            del sys.modules[_DYNAMO]
        if vars(torch).get("_dynamo") is stub:  # never leave the placeholder reachable as torch._dynamo
            delattr(torch, "_dynamo")
    if ddp is None:  # a torch that asks dynamo for more: the stock construction
        return DistributedDataParallel(model, **kwargs)
    _resolve_disable_wrappers(DistributedDataParallel)
    return ddp


def zero_grad(params: Iterable[torch.nn.Parameter]) -> None:
    """``optimizer.zero_grad(set_to_none=True)``."""
    for p in params:
        p.grad = None


@torch.no_grad()
def sgd_step(params: Iterable[torch.nn.Parameter], state: dict, lr: float, momentum: float = 0.0) -> None:
    """One step of ``torch.optim.SGD(params, lr, momentum)`` (no dampening, weight decay or nesterov).

    ``state`` maps each parameter to its momentum buffer (keep one dict per optimizer).
    """
    for p in params:
        if p.grad is None:
            continue
        grad = p.grad
        if momentum != 0.0:
            buf = state.get(p)
            if buf is None:
                buf = state[p] = torch.clone(grad).detach()
            else:
                buf.mul_(momentum).add_(grad)
            grad = buf
        p.add_(grad, alpha=-lr)
