"""The peers' names with the peers' semantics: ``from ddpdoctor.compat.lightning import all_gather``.

The peers disagree under the same names (``all_gather`` stacks in Lightning Fabric, returns one
object per rank in detectron2 and mmengine, and concatenates in ddpdoctor's top level). The top
level keeps ddpdoctor's documented semantics; each module here gives one peer's exact names,
signatures, defaults, return shapes, in-place behaviour and exception classes, so code moved from
that peer behaves as before: :mod:`.accelerate`, :mod:`.lightning`, :mod:`.mmengine`,
:mod:`.detectron2`, :mod:`.torchmetrics`. Every collective here takes ddpdoctor's agreement step
first, so where the peer would hang or pair mismatched calls, every rank raises instead.

Nothing here imports a peer. May import: ``ddpdoctor.training`` and the shared bottom.
"""

from __future__ import annotations

__all__: list[str] = []
