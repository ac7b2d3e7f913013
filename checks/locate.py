"""Check ``locate`` (on request, ``ddpdoctor locate``): which node, link or group makes the world slow.

Every rank runs the same plan (:mod:`ddpdoctor.locate.planner`) from the same readings: each round,
the ranks of each probe form a group of their own (members only, with the round's deadline as the
group's timeout, on a store prefix of its own), time an all_reduce of ``size`` bytes
and a small one for latency, and post the reading on the control store. Rank 0 reads every probe's
reading until the round's deadline and posts what it saw; every rank goes on with that, so the plans
never diverge and no rank starts a round while another still waits out the last one. A node none of
whose ranks posted in time is silent: the verdict names it, and the runner does not wait for it
(:meth:`LocateCheck.named_silent`). Hostnames go through the store the same way, with the same
deadline: a rank whose link died after the rendezvous cannot hold the others for the whole timeout.

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
from ddpdoctor.result import Outcome, Status, count, format_ranks

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
        judge = Judge(min_busbw=opts.get("min_busbw"), drop=float(opts.get("tolerance", 0.3)), size=size)
        start = time.perf_counter()
        # who is where, through the store with the round's deadline (a rank whose link is already down
        # must not hold the others for the process group's whole timeout); rank 0's view is everyone's
        ctx.store.set(f"locate/host/{ctx.rank}", ctx.hostname)
        hosts: list = _settle(ctx, "locate/hosts", lambda: _hostnames(ctx, round_timeout),
                              round_timeout + 10.0)
        unknown = [r for r, h in enumerate(hosts) if h is None]
        for r in unknown:  # a node of its own, named silent below
            hosts[r] = f"rank {r} (no answer)"
        names = sorted({h for r, h in enumerate(hosts) if r not in unknown}) + [hosts[r] for r in unknown]
        ranks = {n: [r for r in range(ctx.world_size) if hosts[r] == h] for n, h in enumerate(names)}
        node = names.index(ctx.hostname) if ctx.hostname in names else -1
        loc = Locator(len(names), judge, intra=all(len(rs) >= 2 for rs in ranks.values()))
        for r in unknown:
            loc.silent(names.index(hosts[r]),
                       f"rank {r} did not say who it is within {round_timeout:g}s, before the first round")
        delay = float(os.environ.get(DELAY_ENV, "0") or 0) / 1000
        while True:
            probes = loc.plan()
            if probes is None:
                break
            round_no = loc.rounds + 1
            began = time.monotonic()
            for i, probe in enumerate(probes):
                members = _members(probe, ranks)
                if ctx.rank in members:
                    reading = _measure(ctx, members, f"{round_no}/{i}", size, iters, round_timeout, delay)
                    ctx.store.set(f"locate/{round_no}/{i}/{ctx.rank}", json.dumps(reading))
            # every rank goes on with rank 0's readings: the same plan everywhere, and nobody starts the
            # next round while another still waits out this one's deadline
            seen = _settle(ctx, f"locate/{round_no}/readings",
                           lambda: _collect(ctx, probes, ranks, round_no, began + 2 * round_timeout + 5.0),
                           3 * round_timeout + 15.0)
            loc.record([Reading(p, r[0], r[1], silent=tuple(r[2]), error=r[3]) for p, r in zip(probes, seen)])
        verdict = loc.verdict()
        data = {"hosts": names, "ranks": {str(n): rs for n, rs in ranks.items()}, "node": node,
                "seconds": round(time.perf_counter() - start, 3), "size": size,
                "verdict": verdict.to_dict() if ctx.rank == 0 else None}
        return ctx.passed(count(verdict.rounds, "round"), data=data)

    def named_silent(self, outcomes: Sequence[Outcome]) -> frozenset:
        """The ranks of the nodes the verdict names silent: the runner need not wait for them."""
        lead = next((o for o in outcomes if o.data.get("verdict")), None)
        if lead is None:
            return frozenset()
        ranks = lead.data.get("ranks", {})
        return frozenset(r for s in lead.data["verdict"]["suspects"] if s["kind"] == "silent"
                         for n in s["nodes"] for r in ranks.get(str(n), ()))

    def merge(self, outcomes: Sequence[Outcome], world: WorldInfo) -> CheckResult:
        lead = next((o for o in outcomes if o.data.get("verdict")), None)
        if lead is None:
            return super().merge(outcomes, world)
        v, hosts = lead.data["verdict"], lead.data["hosts"]
        ranks = {int(k): rs for k, rs in lead.data["ranks"].items()}
        b = v.get("baseline") or {}
        base = f"median pair busbw {b['median_busbw']:.3g} GB/s" if b.get("count") else "no pair baseline"
        head = f"{len(hosts)} node{'s' if len(hosts) != 1 else ''}, {count(v['rounds'], 'round')} in {lead.data['seconds']:.1f}s; {base}"
        details = [f"round {r['round']} {r['kind']:6s} nodes {','.join(map(str, r['nodes']))}: "
                   + (f"{r['busbw']:.3g} GB/s, {r['latency_us']:.3g} us" if r["busbw"] is not None else
                      "no answer" + (f" ({r['error']})" if r.get("error") else ""))
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


def _probe_group(ctx: RankContext, members: list, tag: str, timeout: float) -> Any:
    """A process group of ``members`` alone (the backend's own object, not registered with torch).

    Not ``new_group(..., use_local_synchronization=True)``: torch names such a group by its ranks and by
    how many groups this rank has alive, so a set of ranks tested twice (a pair again among the halves)
    met the first group's keys in the store and connected to its closed sockets (gloo: "Connect
    timeout", at random), and keeping groups alive instead made ranks with different histories
    disagree on the name. Each probe has a store prefix of its own here (``tag``: round and probe).
    """
    import torch.distributed as dist

    store = dist.PrefixStore(f"locate/group/{tag}/", ctx.store)
    rank, size = members.index(ctx.rank), len(members)
    deadline = datetime.timedelta(seconds=timeout)
    if ctx.backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = deadline
        return dist.ProcessGroupNCCL(store, rank, size, opts)
    return dist.ProcessGroupGloo(store, rank, size, deadline)


def _shut(group: Any) -> None:
    """Free a probe's group (its connections, and NCCL's communicator) right away."""
    for name in ("shutdown", "_shutdown"):
        fn = getattr(group, name, None)
        if callable(fn):
            try:
                fn()
            except Exception:  # noqa: BLE001 - a group broken by a timeout may not tear down cleanly
                pass
            return


def _measure(ctx: RankContext, members: list, tag: str, size: int, iters: int, timeout: float,
             delay: float) -> dict:
    """Bus bandwidth and latency of an all_reduce among ``members``; an error or timeout is no answer.

    Past ``timeout`` seconds the timed calls stop and what was measured counts (a member that stops
    one call later than another waits that call out, then answers too).
    """
    import torch

    started = time.monotonic()
    group = None
    try:
        group = _probe_group(ctx, members, tag, timeout)
        big = torch.ones(max(1, size // 4), dtype=torch.float32, device=ctx.device)
        small = torch.ones(1, dtype=torch.float32, device=ctx.device)

        def call(t: Any) -> None:
            if delay:
                time.sleep(delay)
            group.allreduce([t]).wait()
            if ctx.backend == "nccl":
                torch.cuda.synchronize()

        def timed(t: Any, count: int, at: float) -> float:
            took = []
            for _ in range(count):
                took.append(_timed(call, t))
                if time.monotonic() - started > timeout:
                    break
            return sorted(took)[int(len(took) * at)]

        call(big)  # warm-up: connections, buffers
        seconds = timed(big, iters, 0.5)  # the median call
        # the lower quartile: a scheduling stall of a busy host delays a few small calls by milliseconds
        # (and a delay on the link delays every one)
        latency = timed(small, 9, 0.25) * 1e6
        n = len(members)
        algbw = big.numel() * 4 / seconds / 1e9
        return {"busbw": algbw * 2 * (n - 1) / n, "latency_us": latency}
    except Exception as exc:  # noqa: BLE001 - a timeout or a broken link is the reading
        return {"busbw": None, "latency_us": None, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    finally:
        if group is not None:
            _shut(group)  # one group per test: do not let them pile up


def _timed(call: Any, tensor: Any) -> float:
    t0 = time.perf_counter()
    call(tensor)
    return time.perf_counter() - t0


def _settle(ctx: RankContext, key: str, compute: Any, wait: float) -> Any:
    """Rank 0's value of ``compute()`` on every rank: rank 0 computes and posts it, the others read it
    (waiting up to ``wait`` seconds); only when rank 0 never posts does a rank use its own."""
    if ctx.rank == 0:
        value = compute()
        ctx.store.set(key, json.dumps(value))
        return value
    try:
        ctx.store.wait([key], datetime.timedelta(seconds=wait))
        return json.loads(ctx.store.get(key))
    except Exception:  # noqa: BLE001 - rank 0 is gone: go on with what this rank sees
        return compute()


def _hostnames(ctx: RankContext, timeout: float) -> list:
    """Every rank's hostname from the store, None for a rank that did not post it within ``timeout``."""
    deadline = time.monotonic() + timeout
    out = []
    for r in range(ctx.world_size):
        key = f"locate/host/{r}"
        try:
            ctx.store.wait([key], datetime.timedelta(seconds=max(0.05, deadline - time.monotonic())))
            out.append(ctx.store.get(key).decode())
        except Exception:  # noqa: BLE001 - not posted before the deadline
            out.append(None)
    return out


def _collect(ctx: RankContext, probes: list, ranks: dict, round_no: int, deadline: float) -> list:
    """Every probe's reading from the store (the lowest rank that posted) until ``deadline`` (monotonic):
    ``[busbw, latency_us, silent nodes, error]`` per probe, in JSON's terms."""
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
        silent = [n for n in probe.nodes if not any(r in posted for r in ranks[n])]
        first: Optional[dict] = posted[min(posted)] if posted else None
        if first is None or silent:
            out.append([None, None, silent, ""])
        else:
            out.append([first["busbw"], first["latency_us"], [], first.get("error", "")])
    return out
