"""Check ``port``: the rendezvous port is free on the master and reachable from every other rank.

This check runs in the supervising process before the world forms: on the master it binds
MASTER_ADDR:MASTER_PORT (the bound socket is then handed to the rendezvous store, so there is no
window for another process to take the port); on other ranks it resolves MASTER_ADDR and connects
within the deadline. Nothing stays listening after ddpdoctor exits.
"""

from __future__ import annotations


from typing import Sequence

from ddpdoctor.check import Check, CheckResult, WorldInfo
from ddpdoctor.result import Outcome, Status, merge_outcomes, rank_label

__all__ = ["PortCheck"]


class PortCheck(Check):
    """Is the rendezvous port usable? (computed by the supervisor, see :func:`bind_master`)."""

    name = "port"
    description = "MASTER_PORT is free on the master (else who holds it) and reachable from every rank"
    runs_in = "supervisor"

    def merge(self, outcomes: Sequence[Outcome], world: WorldInfo) -> CheckResult:
        merged = merge_outcomes(self.name, outcomes)
        if merged.status != Status.PASS or len(outcomes) < 2:
            return merged
        master = [o for o in outcomes if o.data.get("role") == "master"]
        clients = [o for o in outcomes if o.data.get("role") == "client"]
        parts = [master[0].summary] if master else []
        if clients:
            slowest = max(o.data.get("connect_ms", 0.0) for o in clients)
            where = "" if master else f"{clients[0].data.get('addr')}:{clients[0].data.get('port')}" + (
                " (torchrun's store) " if clients[0].data.get("agent_store") else " ")
            parts.append(f"{where}reachable from {rank_label(o.rank for o in clients)} "
                         f"(slowest connect {slowest:.1f} ms)")
        return CheckResult(self.name, Status.PASS, "; ".join(parts), outcomes=merged.outcomes,
                           duration=merged.duration)


