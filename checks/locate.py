"""Check ``locate`` (on request, ``ddpdoctor locate``): which node, link or group makes the world slow.

Every rank runs the same plan (:mod:`ddpdoctor.locate.planner`) from the same readings, so no rank
coordinates: each round, the ranks of each probe form a group of their own (members only, with the
round's deadline as the group's timeout), time an all_reduce of ``size`` bytes and a small one for
latency, and post the reading on the control store; every rank reads every probe's reading from the
store before the round's deadline. A node none of whose ranks posted is silent: the verdict names it.

Fault-injection seam for tests: ``DDPDOCTOR_LOCATE_DELAY_MS`` on a rank adds that delay before each
of its collective calls (a slow or lossy link, which the development machines' ``netem`` cannot make).
"""

from __future__ import annotations

import datetime
import json
import os
import time
from typing import Any, Optional, Sequence

from ddpdoctor.check import Check, CheckResult, RankContext, Requirements, WorldInfo
from ddpdoctor.locate.planner import Judge, Locator, Probe, Reading
from ddpdoctor.result import Outcome, Status, format_ranks

__all__ = ["LocateCheck", "describe_suspect"]

DELAY_ENV = "DDPDOCTOR_LOCATE_DELAY_MS"
FIX = {
    "node": "drain {host} and check its NIC, cable and GPU (ethtool, ibstat, nvidia-smi); "
            "run 'ddpdoctor check' on that host; with InfiniBand, pin the HCA with NCCL_IB_HCA",
    "link": "check the cable, port and route between {host} (ibstat, ethtool -S errors); "
            "until fixed, keep the two apart",
    "group": "{host} are slow together with any other nodes: check their switch, uplink or a setting "
             "they share (MTU, NCCL_SOCKET_IFNAME, firmware)",
    "cut": "the traffic between {host} is slow only at full scale: check the uplinks between those groups "
           "(oversubscription, routing, congestion control)",
    "silent": "{host} did not answer within the round's deadline: check it is up and reachable "
              "(interface down, firewall), then rerun",
    "all": "every node is below --min-busbw: a cause common to all (fabric, driver, NCCL settings); "
           "run 'ddpdoctor check' on one node",
}


def describe_suspect(suspect: dict, hosts: Sequence[str], ranks: dict) -> str:
    """``node host3 (ranks 6,7)`` for a suspect in the verdict's JSON form."""
    def who(nodes: Sequence[int]) -> str:
        names = [hosts[n] for n in nodes]
        rs = sorted(r for n in nodes for r in ranks.get(n, ()))
        return f"{', '.join(names[:6])}{', ...' if len(names) > 6 else ''} (rank{'s' if len(rs) != 1 else ''} {format_ranks(rs)})"
    text = f"{suspect['kind']} {who(suspect['nodes'])}"
    if suspect.get("other"):
        text += f" | {who(suspect['other'])}"
    return text


class LocateCheck(Check):
    """Pairs and halves of the nodes, round by round, until the slow or silent part is named."""

    name = "locate"
    description = "find the slow or dead node, link or group of nodes in a few rounds (ddpdoctor locate)"
    requires = Requirements(min_world_size=2, process_group=True)
    slow = True
    on_request = True

    def run(self, ctx: RankContext) -> Outcome:
        ctx.process_group()
        opts = dict(ctx.options.get("locate") or {})
        size = int(opts.get("size", 4 << 20))
        iters = int(opts.get("iters", 5))
        round_timeout = float(opts.get("round_timeout", max(2.0, min(10.0, ctx.timeout / 4))))
        judge = Judge(min_busbw=opts.get("min_busbw"), drop=float(opts.get("tolerance", 0.3)))
        from ddpdoctor.dist.gathering import gather_object  # torch's all_gather_object needs numpy

        hosts: list = gather_object(ctx.hostname)
        names = sorted(set(hosts))
        ranks = {n: [r for r in range(ctx.world_size) if hosts[r] == h] for n, h in enumerate(names)}
        node = names.index(ctx.hostname)
        loc = Locator(len(names), judge, intra=all(len(rs) >= 2 for rs in ranks.values()))
        start = time.perf_counter()
        delay = float(os.environ.get(DELAY_ENV, "0") or 0) / 1000
        while True:
            probes = loc.plan()
            if probes is None:
                break
            round_no = loc.rounds + 1
            for i, probe in enumerate(probes):
                members = _members(probe, ranks)
                if ctx.rank in members:
                    reading = _measure(ctx, members, size, iters, round_timeout, delay)
                    ctx.store.set(f"locate/{round_no}/{i}/{ctx.rank}", json.dumps(reading))
            loc.record(_collect(ctx, probes, ranks, round_no, round_timeout))
        verdict = loc.verdict()
        data = {"hosts": names, "ranks": {str(n): rs for n, rs in ranks.items()}, "node": node,
                "seconds": round(time.perf_counter() - start, 3), "size": size,
                "verdict": verdict.to_dict() if ctx.rank == 0 else None}
        return ctx.passed(f"{verdict.rounds} rounds", data=data)

    def merge(self, outcomes: Sequence[Outcome], world: WorldInfo) -> CheckResult:
        lead = next((o for o in outcomes if o.data.get("verdict")), None)
        if lead is None:
            return super().merge(outcomes, world)
        v, hosts = lead.data["verdict"], lead.data["hosts"]
        ranks = {int(k): rs for k, rs in lead.data["ranks"].items()}
        b = v.get("baseline") or {}
        base = f"median pair busbw {b['median_busbw']:.3g} GB/s" if b.get("count") else "no pair baseline"
        head = f"{len(hosts)} node{'s' if len(hosts) != 1 else ''}, {v['rounds']} rounds in {lead.data['seconds']:.1f}s; {base}"
        details = [f"round {r['round']} {r['kind']:6s} nodes {','.join(map(str, r['nodes']))}: "
                   + (f"{r['busbw']:.3g} GB/s, {r['latency_us']:.3g} us" if r["busbw"] is not None else "no answer")
                   for r in v["readings"]]
        details += [f"node {n}: {h} (ranks {format_ranks(ranks[n])})" for n, h in enumerate(hosts)]
        if v.get("stopped"):
            details.append(v["stopped"])
        suspects = v["suspects"]
        if not suspects:
            return CheckResult(self.name, Status.PASS, f"no suspect: {head}", details=tuple(details),
                               outcomes=tuple(outcomes), duration=max(o.duration for o in outcomes))
        texts = [f"{describe_suspect(s, hosts, ranks)}: {s['evidence'][0]}" for s in suspects]
        failing = any(s["kind"] in ("silent", "all") or any("--min-busbw" in e for e in s["evidence"]) for s in suspects)
        first = suspects[0]
        host = ", ".join(hosts[n] for n in first["nodes"] + first.get("other", []))
        return CheckResult(self.name, Status.FAIL if failing else Status.WARN,
                           f"{len(suspects)} suspect{'s' if len(suspects) != 1 else ''}: {'; '.join(texts)}  ({head})",
                           hint=FIX[first["kind"]].format(host=host), finding=f"locate-{first['kind']}",
                           ranks=tuple(sorted(r for s in suspects for n in s["nodes"] for r in ranks.get(n, ()))),
                           details=tuple(details), outcomes=tuple(outcomes),
                           duration=max(o.duration for o in outcomes))


def _members(probe: Probe, ranks: dict) -> list:
    """The ranks of a probe: every rank of the node for INTRA, the node's first rank otherwise."""
    if probe.kind == "intra":
        return sorted(ranks[probe.nodes[0]])
    return sorted(ranks[n][0] for n in probe.nodes)


def _measure(ctx: RankContext, members: list, size: int, iters: int, timeout: float, delay: float) -> dict:
    """Bus bandwidth and latency of an all_reduce among ``members``; an error or timeout is no answer."""
    import torch
    import torch.distributed as dist

    group = None
    try:
        group = dist.new_group(members, timeout=datetime.timedelta(seconds=timeout), use_local_synchronization=True)
        big = torch.ones(max(1, size // 4), dtype=torch.float32, device=ctx.device)
        small = torch.ones(1, dtype=torch.float32, device=ctx.device)

        def call(t: Any) -> None:
            if delay:
                time.sleep(delay)
            dist.all_reduce(t, group=group)
            if ctx.backend == "nccl":
                torch.cuda.synchronize()

        call(big)  # warm-up: connections, buffers
        seconds = sorted(_timed(call, big) for _ in range(iters))[iters // 2]  # the median call
        latency = sorted(_timed(call, small) for _ in range(9))[4] * 1e6
        n = len(members)
        algbw = big.numel() * 4 / seconds / 1e9
        return {"busbw": algbw * 2 * (n - 1) / n, "latency_us": latency}
    except Exception as exc:  # noqa: BLE001 - a timeout or a broken link is the reading
        return {"busbw": None, "latency_us": None, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    finally:
        if group is not None:
            try:
                dist.destroy_process_group(group)  # one group per test: do not let them pile up
            except Exception:  # noqa: BLE001 - a group broken by a timeout may not tear down cleanly
                pass


def _timed(call: Any, tensor: Any) -> float:
    t0 = time.perf_counter()
    call(tensor)
    return time.perf_counter() - t0


def _collect(ctx: RankContext, probes: list, ranks: dict, round_no: int, timeout: float) -> list:
    """Every probe's reading from the store (the lowest rank that posted), within the round's deadline."""
    deadline = time.monotonic() + timeout + 5.0
    out = []
    for i, probe in enumerate(probes):
        members = _members(probe, ranks)
        posted: dict = {}
        for r in members:
            key = f"locate/{round_no}/{i}/{r}"
            left = deadline - time.monotonic()
            try:
                ctx.store.wait([key], datetime.timedelta(seconds=max(0.05, left)))
                posted[r] = json.loads(ctx.store.get(key))
            except Exception:  # noqa: BLE001 - not posted before the deadline
                continue
        silent = tuple(n for n in probe.nodes if not any(r in posted for r in ranks[n]))
        first: Optional[dict] = posted[min(posted)] if posted else None
        if first is None or silent:
            out.append(Reading(probe, None, None, silent=silent))
        else:
            out.append(Reading(probe, first["busbw"], first["latency_us"]))
    return out

