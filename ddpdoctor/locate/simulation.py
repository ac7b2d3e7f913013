"""A modelled network to run the locating plan against at scales no test machine has.

The model (stated so its numbers can be argued with):
- ``nodes`` nodes, one rank each, in switches of ``switch_size`` consecutive nodes.
- A collective over a set of nodes is a ring in node order; its bus bandwidth is the slowest edge's:
  ``nic_gbps`` times the smaller NIC factor of the two ends, times the factor of each end's switch
  (a bad switch slows every flow that touches one of its nodes, inside the switch or out).
- A congested uplink (a fault that appears only at scale) carries ``capacity`` flows at full speed:
  a collective that spans the switch and the rest of the world pushes one flow per member inside the
  switch through it, so with k members inside, the whole ring runs at ``min(1, capacity / k)``.
  A pair (k = 1) never sees it; the whole world does.
- Latency: ``latency_us`` per message plus the largest extra latency of a member (a node with a bad
  link or a delay); a dead node never answers.
- Noise: every reading is multiplied by a log-normal factor with sigma ``noise`` (0.05: the spread of
  repeated pair tests between network-namespace hosts on the development machine was under 5%).
- Time: a probe moves ``size`` bytes ``iters`` times at its algorithm bandwidth, plus the latency of
  each call; a round takes its slowest probe plus ``round_overhead_s`` (forming the groups, sharing
  the readings).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Optional

from ddpdoctor.locate.planner import Judge, Locator, Probe, Reading, Verdict

__all__ = ["Network", "Fault", "scenario", "run_plan", "score", "SCENARIOS"]

SCENARIOS = ("none", "node", "switch", "scale", "two", "three")


@dataclass(frozen=True)
class Fault:
    """A fault the simulator planted: ``kind`` is node, slow-link, dead, switch or scale."""

    kind: str
    nodes: tuple


@dataclass
class Network:
    nodes: int
    switch_size: int = 16
    nic_gbps: float = 25.0
    latency_us: float = 8.0
    noise: float = 0.05
    size: int = 64 << 20
    iters: int = 5
    round_overhead_s: float = 0.05
    nic: dict = field(default_factory=dict)  # node -> factor
    extra_latency: dict = field(default_factory=dict)  # node -> us
    switch_factor: dict = field(default_factory=dict)  # switch -> factor
    congested: dict = field(default_factory=dict)  # switch -> capacity in flows
    dead: set = field(default_factory=set)

    def switch(self, node: int) -> int:
        return node // self.switch_size

    def switch_nodes(self, s: int) -> tuple:
        return tuple(range(s * self.switch_size, min(self.nodes, (s + 1) * self.switch_size)))

    def measure(self, probe: Probe, rng: random.Random) -> tuple:
        """(reading, seconds) for one probe."""
        members = probe.nodes
        silent = tuple(n for n in members if n in self.dead)
        if silent:
            return Reading(probe, None, None, silent=silent), 30.0
        if len(members) == 1:
            return Reading(probe, self.nic_gbps * rng.lognormvariate(0, self.noise), self.latency_us), 0.01
        ring = list(zip(members, members[1:] + members[:1])) if len(members) > 2 else [tuple(members)]
        edge = min(min(self.nic.get(u, 1.0), self.nic.get(v, 1.0),
                       self.switch_factor.get(self.switch(u), 1.0), self.switch_factor.get(self.switch(v), 1.0))
                   for u, v in ring)
        spans = {self.switch(n) for n in members}
        for s, capacity in self.congested.items():
            inside = sum(1 for n in members if self.switch(n) == s)
            if inside and len(spans) > 1 and inside > capacity:
                edge = min(edge, capacity / inside)
        busbw = self.nic_gbps * edge * rng.lognormvariate(0, self.noise)
        lat = (self.latency_us + max(self.extra_latency.get(n, 0.0) for n in members)) * rng.lognormvariate(0, self.noise)
        k = len(members)
        algbw = busbw / (2 * (k - 1) / k)
        seconds = self.iters * (self.size / (algbw * 1e9) + lat * 1e-6 * 2 * (k - 1))
        return Reading(probe, busbw, lat), seconds


def scenario(kind: str, nodes: int, rng: random.Random, switch_size: int = 16, noise: float = 0.05) -> tuple:
    """A network with the faults of one scenario kind planted at random, and the faults."""
    if nodes < 4 * switch_size:  # small worlds: at least 4 switches, of a power-of-two size
        switch_size = max(2, 1 << max(0, (nodes // 4).bit_length() - 1))
    net = Network(nodes, switch_size=switch_size, noise=noise)
    count = {"none": 0, "node": 1, "switch": 1, "scale": 1, "two": 2, "three": 3}[kind]
    faults: list = []
    used: set = set()
    switches = math.ceil(nodes / net.switch_size)
    for i in range(count):
        what = kind if kind in ("node", "switch", "scale") else rng.choice(("node", "slow-link", "dead", "switch", "scale"))
        if what in ("switch", "scale"):
            free = [s for s in range(switches) if not set(net.switch_nodes(s)) & used and len(net.switch_nodes(s)) >= 2]
            if switches < 2 or not free:
                what = "node"
            else:
                s = rng.choice(free)
                used |= set(net.switch_nodes(s))
                if what == "switch":
                    net.switch_factor[s] = rng.uniform(0.05, 0.5)
                else:
                    # fine for a pair, slow for the whole switch at once
                    net.congested[s] = rng.choice([c for c in (1, 2) if c < len(net.switch_nodes(s))])
                faults.append(Fault(what, net.switch_nodes(s)))
                continue
        free = [x for x in range(nodes) if x not in used]
        if not free:
            break
        n = rng.choice(free)
        used.add(n)
        if what == "dead":
            net.dead.add(n)
        elif what == "slow-link":
            net.extra_latency[n] = net.latency_us * rng.uniform(5, 50)
        else:
            what = "node"
            net.nic[n] = rng.uniform(0.05, 0.5)
        faults.append(Fault(what, (n,)))
    return net, faults


def run_plan(net: Network, rng: random.Random, judge: Optional[Judge] = None, deep: bool = True) -> tuple:
    """Run the locating plan on ``net``: (verdict, simulated seconds)."""
    loc = Locator(net.nodes, judge or Judge(), deep=deep)
    seconds = 0.0
    while True:
        probes = loc.plan()
        if probes is None:
            break
        got = [net.measure(p, rng) for p in probes]
        seconds += max(s for _, s in got) + net.round_overhead_s
        loc.record([r for r, _ in got])
    return loc.verdict(), seconds


def score(verdict: Verdict, faults: list) -> tuple:
    """(faults found, faults, suspects that match a fault, suspects) for recall and precision.

    A node fault is found when a suspect names exactly that node; a switch or scale fault when the
    suspects that touch the switch name exactly its nodes (as one group, or node by node).
    """
    found = 0
    for f in faults:
        if len(f.nodes) == 1:
            found += any(s.nodes == f.nodes and s.kind in ("node", "silent", "link") for s in verdict.suspects)
        else:
            touching = [s for s in verdict.suspects if set(s.nodes) & set(f.nodes)]
            covered = {n for s in touching for n in s.nodes}
            found += bool(touching) and covered == set(f.nodes)
    fault_sets = [set(f.nodes) for f in faults]
    right = sum(1 for s in verdict.suspects if any(set(s.nodes) <= fs for fs in fault_sets))
    return found, len(faults), right, len(verdict.suspects)
