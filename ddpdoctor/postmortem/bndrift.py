"""``bn-drift`` on run's side: BatchNorm running statistics that differ across ranks where it matters.

Each rank's hook (:class:`_ddpdoctor_watches._BnDrift`) writes the running statistics of the layers whose
drift survives (``bn-<pid>-<kind>-<step>-<owner>.json``): evaluated outside a forward through a DDP model
that broadcasts its buffers (``eval``: through ``model.module``, with the broadcast off, or with no DDP;
named by the optimizer step count, the same on every rank), and at the end (``final``) the layers trained
outside such a forward. Once every rank's record of one moment is in, the layers are compared here; a
layer whose ranks differ by more than :data:`THRESHOLD` is a finding, named once per reason and line,
with the size of the drift. A moment only some ranks recorded (rank 0 evaluating alone) is skipped.

The size of a layer's drift is the largest change it makes to the layer's output at evaluation: over the
channels and the ranks against the lowest, ``|mean_a - mean_b| / sqrt(max(var_a, var_b) + eps)`` (a shift
in units of the channel's standard deviation) and ``|var_a - var_b| / max(var_a, var_b)``.
"""

from __future__ import annotations

import math
from typing import Callable

from ddpdoctor.postmortem.rundir import take_records

__all__ = ["BnDrift", "THRESHOLD", "layer_drift"]

THRESHOLD = 0.01  # a layer is named when its ranks' statistics differ by more than 1%

FIX = ("call ddpdoctor.sync_bn_stats(model) on every rank before evaluation and checkpointing (CPU and GPU), or "
       "on GPU convert with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP")

REASONS = {
    "sync-off": ("DistributedDataParallel was built with its buffer broadcast off (broadcast_buffers=False or "
                 "forward_sync_buffers=False, at {where}): each rank's BatchNorm statistics follow its own data "
                 "and nothing makes them equal again, so every rank evaluates and checkpoints its own", ""),
    "no-ddp": ("the model is never wrapped in DistributedDataParallel (trained at {where}): each rank's BatchNorm "
               "statistics follow its own data, so every rank evaluates and checkpoints its own", ""),
    "module-train": ("the model is trained through model.module (at {where}), which skips DDP's broadcast of "
                     "rank 0's buffers: each rank's BatchNorm statistics follow its own data", ""),
    "module-eval": ("the model is evaluated through model.module (at {where}), which skips DDP's broadcast of rank "
                    "0's buffers at the start of a forward: each rank evaluates with the statistics its own last "
                    "training batches left", "evaluate through the DDP model (model(x), not model.module(x)), or "),
}


def layer_drift(a: list, b: list) -> float:
    """The drift between two ranks' records of one layer (``[name, eps, mean, var, ...]``): see above."""
    eps, worst = float(a[1]), 0.0
    for ma, mb, va, vb in zip(a[2], b[2], a[3], b[3]):
        top = max(va, vb)
        shift = abs(ma - mb) / math.sqrt(max(top, 0.0) + eps)
        scale = abs(va - vb) / top if top > 0 else 0.0
        worst = max(worst, shift, scale)
    if len(a[2]) != len(b[2]):
        worst = math.inf
    return worst


class BnDrift:
    """Reads the ranks' ``bn-*.json`` records every poll; a complete set is compared once."""

    def __init__(self, run_dir: str, window: float) -> None:
        self.run_dir = run_dir
        self.window = window
        self.groups: dict = {}  # (kind, step, owner) -> {pid: record}
        self.group_at: dict = {}

    def read(self, ranks: dict, now: float, end: bool, rank_of: Callable, add: Callable) -> None:
        """Read new records; compare every moment all ``ranks`` (pid -> run's record) wrote; findings go
        to ``add(watch, key, what, fix, where, rank, now, when)``."""
        for record in take_records(self.run_dir, "bn-[0-9]*-*.json"):
            pid = int(record.get("pid", 0))
            record["rank"] = rank_of(ranks, pid, record)
            key = (record.get("kind", ""), int(record.get("step", 0)), str(record.get("owner", "")))
            self.groups.setdefault(key, {})[pid] = record
            self.group_at.setdefault(key, now)
        expected = set(ranks)
        for key in sorted(self.groups, key=lambda k: (k[1], k[0], k[2])):
            group = self.groups[key]
            if len(expected) < 2 or not expected <= set(group):
                if end or now - self.group_at.get(key, now) > 2 * self.window + 10:
                    self.groups.pop(key, None)  # a rank never wrote it (gone, or it evaluated alone): skipped
                continue
            self.groups.pop(key)
            self._compare(key, sorted(group.values(), key=lambda r: str(r["rank"])), now, add)

    def _compare(self, key: tuple, records: list, now: float, add: Callable) -> None:
        kind, step, _ = key
        ref = records[0]
        by_reason: dict = {}  # (why, where) -> [(drift, layer name, rank)], the worst rank per layer
        odd: dict = {}  # (why, where) -> every rank that differs from the reference by more than the threshold
        for i, row in enumerate(ref.get("layers", [])):
            worst, who = 0.0, None
            for rec in records[1:]:
                rows = rec.get("layers", [])
                if i >= len(rows) or rows[i][0] != row[0]:
                    continue
                d = layer_drift(row, rows[i])
                if d > THRESHOLD:
                    odd.setdefault((row[4], row[5]), set()).add(rec["rank"])
                if d > worst:
                    worst, who = d, rec["rank"]
            if worst > THRESHOLD:
                by_reason.setdefault((row[4], row[5]), []).append((worst, row[0], who))
        when = {"final": f"at the end (after {step} optimizer steps)", "eval": f"at the evaluation after {step} "
                f"optimizer steps"}.get(kind, f"at optimizer step {step}")
        for (why, where), layers in by_reason.items():
            reason, fix_first = REASONS.get(why, REASONS["no-ddp"])
            shown = ", ".join(f"{name} by {_percent(d)} (rank {who} against rank {ref['rank']})"
                              for d, name, who in layers[:4])
            more = f" and {len(layers) - 4} more" if len(layers) > 4 else ""
            what = (f"BatchNorm running statistics differ across ranks {when}: {len(layers)} layer"
                    f"{'s' if len(layers) != 1 else ''} by more than {_percent(THRESHOLD)}: {shown}{more}; "
                    + reason.format(where=where or "an unknown line"))
            ranks = [ref["rank"]] + sorted(odd[(why, where)], key=str)
            f = add("bn-drift", f"{why}:{where}", what, fix_first + FIX, where, ranks[0], now, when)
            for r in ranks[1:]:
                if r not in f.ranks:
                    f.ranks.append(r)


def _percent(x: float) -> str:
    if math.isinf(x):
        return "a different shape"
    return f"{x * 100:.3g}%"
