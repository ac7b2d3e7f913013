"""Two ranks on one GPU are named even when NCCL's own message does not say so (NCCL 2.28: "invalid usage").

The GPU identities go through the control store before NCCL's init; this tests that seam with a real
store (the NCCL init itself runs in tests/test_first_contact.py's `gpu` tests).
"""

from __future__ import annotations

import json
import time

import torch.distributed as dist

from ddpdoctor.checks.process_group import _GPU_OWNER_KEY, gpu_sharers


def _publish(store, rank, host, uuid):
    store.set(_GPU_OWNER_KEY.format(rank), json.dumps({"host": host, "uuid": uuid}))


def test_ranks_sharing_a_gpu_on_one_host_are_named_and_a_dead_rank_costs_the_wait_only():
    store = dist.HashStore()
    _publish(store, 0, "node1", "GPU-aaaa")
    _publish(store, 1, "node1", "GPU-aaaa")
    _publish(store, 2, "node1", "GPU-bbbb")
    _publish(store, 4, "node2", "GPU-aaaa")  # same UUID string on another host: another GPU
    # rank 3 died before publishing: counted as absent after the wait
    start = time.monotonic()
    assert gpu_sharers(store, 0, 5, "node1", "GPU-aaaa", wait=0.5) == [0, 1]
    assert 0.4 <= time.monotonic() - start < 5
    assert gpu_sharers(store, 2, 5, "node1", "GPU-bbbb", wait=0.1) == []
    assert gpu_sharers(store, 4, 5, "node2", "GPU-aaaa", wait=0.1) == []


def test_no_wait_when_every_rank_published():
    store = dist.HashStore()
    for r in range(3):
        _publish(store, r, "n", f"GPU-{r}")
    start = time.monotonic()
    assert gpu_sharers(store, 1, 3, "n", "GPU-1", wait=10) == []
    assert time.monotonic() - start < 2
