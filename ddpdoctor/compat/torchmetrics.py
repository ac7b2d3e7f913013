"""torchmetrics' ``gather_all_tensors``, with torchmetrics' semantics (torchmetrics 1.9).

A list with every rank's tensor, whose shapes may differ in any dimension; this rank's entry is its
own tensor (its gradient kept). Deliberately different: ranks with different dtypes or numbers of
dimensions raise the same error on every rank (torchmetrics hangs there).
"""

from __future__ import annotations

from ddpdoctor.training import gather_all_tensors

__all__ = ["gather_all_tensors"]
