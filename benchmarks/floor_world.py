"""The floor for bench_check.py: import torch once, fork N ranks, init gloo, one all_reduce, exit.

Usage: python benchmarks/floor_world.py N
"""

from __future__ import annotations

import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist


def main() -> None:
    n = int(sys.argv[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pids = []
    for rank in range(n):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                store = dist.TCPStore("127.0.0.1", port, n, rank == 0, timeout=datetime.timedelta(seconds=60))
                dist.init_process_group("gloo", store=store, rank=rank, world_size=n)
                t = torch.ones(1)
                dist.all_reduce(t)
                assert t.item() == n
                dist.destroy_process_group()
            except BaseException:
                code = 1
            os._exit(code)
        pids.append(pid)
    bad = sum(os.waitpid(p, 0)[1] != 0 for p in pids)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
