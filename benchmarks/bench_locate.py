"""``ddpdoctor locate``: how well and how fast it names the fault, by simulation and for real.

1. Simulation (ddpdoctor/locate/simulation.py states the model): for each world size, random
   scenarios of every kind (none, one bad node, one bad switch, one fault that appears only at full
   scale, two and three simultaneous faults mixing those with dead nodes and slow links). Prints
   recall, precision, rounds (median and max, against the single-fault bound 2*ceil(log2 N)+3) and
   simulated time, beside what an all-pairs sweep (N-1 rounds) and two-round pairing (the plan cut
   after its re-pairing round, as DLRover's node check does) would have needed and found.
2. Real (root and iproute2): wall time of ``ddpdoctor locate`` on 4 and 8 network-namespace hosts,
   one rank each, against one full-world all_reduce sweep of the same size (``ddpdoctor bench --ops
   all_reduce``: sum, max, min, avg), medians of ``--repeat`` interleaved runs; both the whole command
   (start-up included) and the check's own time as its report states it.

Usage: python benchmarks/bench_locate.py [--trials 1000] [--sizes 8,64,512,4096] [--real] [--repeat 3]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
sys.path.insert(0, TESTS)

from ddpdoctor.locate.simulation import SCENARIOS, run_plan, scenario, score  # noqa: E402

PY = sys.executable


def simulate(sizes: list, trials: int, noise: float) -> None:
    print(f"# simulation: {trials} scenarios per world size (spread over the kinds), noise sigma {noise}")
    print("| N | scenario | recall | precision | clean worlds with a suspect | rounds median / max "
          "| bound | simulated s (median) | all-pairs rounds | two-round pairing recall |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        per_kind = max(1, trials // len(SCENARIOS))
        for kind in SCENARIOS:
            rng = random.Random(hash((n, kind)) & 0xFFFF)
            found = total = right = named = false_worlds = shallow_found = 0
            rounds, seconds = [], []
            for _ in range(per_kind):
                net, faults = scenario(kind, n, rng, noise=noise)
                seed = rng.random()
                verdict, secs = run_plan(net, random.Random(seed))
                shallow, _ = run_plan(net, random.Random(seed), deep=False)
                f, t, r, s = score(verdict, faults)
                found, total, right, named = found + f, total + t, right + r, named + s
                shallow_found += score(shallow, faults)[0]
                false_worlds += kind == "none" and s > 0
                rounds.append(verdict.rounds)
                seconds.append(secs)
            recall = f"{found / total:.3f}" if total else "-"
            precision = f"{right / named:.3f}" if named else "-"
            shallow = f"{shallow_found / total:.3f}" if total else "-"
            print(f"| {n} | {kind} | {recall} | {precision} | {false_worlds}/{per_kind if kind == 'none' else 0} "
                  f"| {statistics.median(rounds):g} / {max(rounds)} | {2 * math.ceil(math.log2(n)) + 3} "
                  f"| {statistics.median(seconds):.2f} | {n - 1} | {shallow} |", flush=True)


def real(hosts_list: list, repeat: int) -> None:
    from netns import Hosts, netns_unavailable

    why = netns_unavailable()
    if why:
        print(f"# real: skipped ({why})")
        return
    base = {k: v for k, v in os.environ.items() if not k.startswith(
        ("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_", "DDPDOCTOR_"))}
    print(f"# real: network-namespace hosts, one rank each, 1 MiB all_reduce, medians of {repeat} interleaved runs; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("# whole command: start-up (Python, torch, rendezvous) included; check: the check's own time as reported")
    print("| hosts | locate: command s | locate: check s | rounds | sweep: command s | sweep: check s "
          "| ratio, command | ratio, check |")
    print("|---|---|---|---|---|---|---|---|")
    own = re.compile(r"^\[\w+\]\s+(?:locate|collectives-bench)\s.*\((\d+(?:\.\d+)?)s\)\s*$", re.M)
    for n in hosts_list:
        with Hosts(n) as h:
            times: dict = {"locate": [], "sweep": []}
            checks: dict = {"locate": [], "sweep": []}
            rounds = []
            for i in range(repeat):
                order = ("locate", "sweep") if i % 2 == 0 else ("sweep", "locate")
                for what in order:
                    port = 29450 + 2 * i + (what == "sweep")
                    args = (["locate", "--size", "1M", "--iters", "5", "--tolerance", "0.9"] if what == "locate" else
                            ["bench", "--ops", "all_reduce", "--min-bytes", "1M", "--max-bytes", "1M", "--iters", "5",
                             "--warmup", "1"])
                    t0 = time.perf_counter()
                    procs = [h.popen(r, [PY, "-m", "ddpdoctor", *args],
                                     {**base, "RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": "0",
                                      "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": h.addrs[0], "MASTER_PORT": str(port),
                                      "GLOO_SOCKET_IFNAME": "eth0", "NO_COLOR": "1"}) for r in range(n)]
                    outs = [p.communicate(timeout=300) for p in procs]
                    times[what].append(time.perf_counter() - t0)
                    report = next((o for o, _ in outs if own.search(o)), "")
                    if not report or any(p.returncode != 0 for p in procs):
                        raise SystemExit(f"{what} on {n} hosts failed: {[p.returncode for p in procs]}\n{report}"
                                         f"{outs[0][1][-2000:]}")
                    checks[what].append(float(own.search(report).group(1)))
                    if what == "locate":
                        found = re.search(r"(\d+) rounds in", report)
                        rounds += [int(found.group(1))] if found else []
            loc, sweep = statistics.median(times["locate"]), statistics.median(times["sweep"])
            cloc, csweep = statistics.median(checks["locate"]), statistics.median(checks["sweep"])
            print(f"| {n} | {loc:.2f} | {cloc:.2f} | {max(rounds) if rounds else '?'} | {sweep:.2f} | {csweep:.2f} "
                  f"| {loc / sweep:.2f}x | {cloc / csweep:.2f}x |", flush=True)
    print(f"# load average after: {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000, help="0: no simulation (with --real: only the real runs)")
    ap.add_argument("--sizes", default="8,64,512,4096")
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--real", action="store_true", help="also time locate on 4 and 8 namespace hosts")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"# load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.trials > 0:
        simulate([int(s) for s in args.sizes.split(",")], args.trials, args.noise)
    if args.real:
        real([4, 8], args.repeat)


if __name__ == "__main__":
    main()
