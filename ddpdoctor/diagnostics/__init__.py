"""The training-pitfall library in one import: ``from ddpdoctor.diagnostics import ...``.

Sampler epochs (:func:`guard_sampler`), parameter desync (:func:`assert_in_sync`) and BatchNorm
running statistics (:func:`bn_divergence`, :func:`sync_bn_stats`): the silent bugs of DDP training,
caught inside the training loop.

Also here, for the checks that train: the models they train (:mod:`.model_factory`), unwrapping a
DDP/FSDP-wrapped module (:mod:`.wrapped`) and the known-result collectives plan (:mod:`.collective_plan`).

May import: ``ddpdoctor.training``, ``ddpdoctor.system`` and the shared bottom (``check``, ``result``,
``errors``, ``exitcodes``).
"""

from __future__ import annotations

from ddpdoctor.diagnostics.batchnorm import bn_divergence, sync_bn_stats
from ddpdoctor.diagnostics.desync import DesyncError, TensorMismatch, assert_in_sync
from ddpdoctor.diagnostics.sampler_guard import (SamplerEpochWarning, SamplerMismatchWarning, SamplerWarning,
                                                 guard_sampler)
from ddpdoctor.training.teardown import exit_now  # importing it registers the library's exit hook

__all__ = [
    "DesyncError",
    "SamplerEpochWarning",
    "SamplerMismatchWarning",
    "SamplerWarning",
    "TensorMismatch",
    "assert_in_sync",
    "bn_divergence",
    "exit_now",
    "guard_sampler",
    "sync_bn_stats",
]
