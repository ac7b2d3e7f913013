"""The fault matrix: break a job in each known way, for real, and measure what ddpdoctor reports.

For every fault: the line ddpdoctor reported, the seconds from start to report, the processes left
behind (anything with "ddpdoctor" in its command line once the run returned) and the TCP ports left
listening (on this host and on every test host). Multi-host faults run on network-namespace hosts
(tests/netns.py; needs root and iproute2). Also times a 2-host check against the same check on one
host. Prints a Markdown table (pasted into README.md).

With --root-cause: the root-cause matrix instead (issue 13): every way a rank can fail (raises, returns
a failed result, os._exit(0), os._exit(3), sys.exit(2), SIGKILL, SIGSEGV) x before the others' rendezvous
completes or while they wait in all_reduce x 2, 3 and 4 ranks x local and torchrun worlds, each at
--timeout 30. For each cell: the verdict line's status and whether it names the cause first and every
other rank as left waiting (tests/rootcause.verify), and the seconds from the failure (the failing rank
writes the time) to the printed verdict. The largest must be within ddpdoctor's CAUSE_GRACE.

Usage: python benchmarks/fault_matrix.py [--timeout 3]
       python benchmarks/fault_matrix.py --root-cause [--modes local,torchrun] [--jobs 3]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
sys.path.insert(0, TESTS)

from netns import Hosts, netns_unavailable  # noqa: E402

PY = sys.executable
FOUNDATION = ["--only", "env,port,process-group"]


def base_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(
        ("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_", "DDPDOCTOR_"))}
    env.update(NO_COLOR="1", PYTHONPATH=TESTS + os.pathsep + env.get("PYTHONPATH", ""), DDPD_FAULT_MATRIX=TAG,
               CUDA_VISIBLE_DEVICES="")  # the faults are staged on CPU ranks (gloo), on a GPU machine too
    return env


TAG = f"{os.getpid()}-{time.time_ns()}"  # every process this script starts carries it in its environment


def ours() -> list[psutil.Process]:
    """Live processes started by this script (tagged environment), in any namespace."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get("DDPD_FAULT_MATRIX") == TAG and \
                    p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            pass
    return found


def leftovers() -> int:
    return len(ours())


def listening_ours() -> int:
    """TCP sockets listening in processes this script started (namespaced hosts included)."""
    n = 0
    for p in ours():
        try:
            n += sum(1 for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN)
        except psutil.Error:
            pass
    return n


def verdict(text: str, pattern: str) -> str:
    for line in text.splitlines():
        if re.search(pattern, line):
            return line.strip()
    return "(not found) " + text.strip().splitlines()[-1] if text.strip() else "(no output)"


def joined_env(base: dict, rank: int, world: int, addr: str, port: int) -> dict:
    return {**base, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": addr, "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "eth0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local(args: list, env: dict, timeout: float = 120) -> tuple[float, str]:
    t0 = time.monotonic()
    p = subprocess.run([PY, "-m", "ddpdoctor", "check"] + args, env=env, capture_output=True, text=True,
                       timeout=timeout)
    return time.monotonic() - t0, p.stdout + p.stderr


def scenarios(timeout: float):
    env = base_env()
    t = ["--timeout", str(timeout)]

    def port_taken():
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        try:
            secs, out = run_local(FOUNDATION + t + ["--master-port", str(holder.getsockname()[1])], env)
        finally:
            holder.close()
        return secs, verdict(out, r"\[FAIL\]\s+port")

    def unresolvable():
        e = joined_env(env, 1, 2, "no-such-host.invalid", 12345)
        secs, out = run_local(FOUNDATION + t, e)
        return secs, verdict(out, "does not resolve")

    def size_mismatch():
        port = free_port()
        t0 = time.monotonic()
        procs = [subprocess.Popen([PY, "-m", "ddpdoctor", "check"] + FOUNDATION + t,
                                  env={**joined_env(env, r, 3, "127.0.0.1", port), "GLOO_SOCKET_IFNAME": "lo"},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
        outs = [p.communicate(timeout=120)[0] for p in procs]
        return time.monotonic() - t0, verdict(outs[0], "never arrived")

    def killed_rank():
        e = {**env, "DDPDOCTOR_PLUGINS": "faults", "FAULT_RANK": "1"}
        proc = subprocess.Popen([PY, "-m", "ddpdoctor", "check", "--nproc", "3", "--timeout", "30", "--only",
                                 "process-group,fault-skip-collective"], env=e, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        while len(psutil.Process(proc.pid).children()) < 3:
            time.sleep(0.02)
        time.sleep(1.0)
        kids = sorted(psutil.Process(proc.pid).children(), key=lambda p: p.pid)
        killed_at = time.monotonic()
        kids[0].kill()
        out = proc.communicate(timeout=120)[0]
        return time.monotonic() - killed_at, verdict(out, "killed by")

    def ctrl_c():
        e = {**env, "DDPDOCTOR_PLUGINS": "faults", "FAULT_RANK": "0"}
        proc = subprocess.Popen([PY, "-m", "ddpdoctor", "check", "--timeout", "60", "--only", "env,fault-hang"],
                                env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        while len(psutil.Process(proc.pid).children()) < 2:
            time.sleep(0.02)
        time.sleep(1.0)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
        return time.monotonic() - t0, verdict(out, r"exit 130")

    def supervisor_killed():
        e = {**env, "DDPDOCTOR_PLUGINS": "faults", "FAULT_RANK": "0"}
        proc = subprocess.Popen([PY, "-m", "ddpdoctor", "check", "--timeout", "60", "--only", "fault-hang"],
                                env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while len(psutil.Process(proc.pid).children()) < 2:
            time.sleep(0.02)
        kids = psutil.Process(proc.pid).children()
        t0 = time.monotonic()
        proc.kill()
        proc.wait()
        gone, alive = psutil.wait_procs(kids, timeout=10)
        return time.monotonic() - t0, f"ddpdoctor SIGKILLed: {len(gone)} workers ended with it, {len(alive)} left"

    yield "master port taken", port_taken
    yield "MASTER_ADDR does not resolve", unresolvable
    yield "world size 3, 2 ranks arrive", size_mismatch
    yield "rank SIGKILLed mid-collective", killed_rank
    yield "Ctrl-C during a check", ctrl_c
    yield "ddpdoctor itself SIGKILLed", supervisor_killed

    if netns_unavailable() is not None:
        return

    def two_hosts(body):
        def run():
            with Hosts(2) as h:
                return body(h)
        return run

    def refused(h):
        t0 = time.monotonic()
        p = h.popen(1, [PY, "-m", "ddpdoctor", "check"] + FOUNDATION + t, joined_env(env, 1, 2, h.addrs[0], 29420))
        out = "".join(p.communicate(timeout=120))
        return time.monotonic() - t0, verdict(out, "refused")

    def dropped(h):
        h.blackhole(1, 0)
        t0 = time.monotonic()
        p = h.popen(1, [PY, "-m", "ddpdoctor", "check"] + FOUNDATION + t, joined_env(env, 1, 2, h.addrs[0], 29421))
        out = "".join(p.communicate(timeout=120))
        return time.monotonic() - t0, verdict(out, "did not answer")

    def bad_ifname(h):
        envs = [joined_env(env, i, 2, h.addrs[0], 29422) for i in range(2)]
        envs[1]["GLOO_SOCKET_IFNAME"] = "eth9"
        t0 = time.monotonic()
        ps = [h.popen(i, [PY, "-m", "ddpdoctor", "check"] + FOUNDATION + t, envs[i]) for i in range(2)]
        outs = ["".join(p.communicate(timeout=120)) for p in ps]
        return time.monotonic() - t0, verdict(outs[0], "eth9")

    def link_down(h):
        marker = tempfile.mktemp(prefix="ddpd-marker-")
        envs = [{**joined_env(env, i, 2, h.addrs[0], 29423), "DDPDOCTOR_PLUGINS": "faults", "FAULT_MARKER": marker,
                 "FAULT_DELAY": "1"} for i in range(2)]
        ps = [h.popen(i, [PY, "-m", "ddpdoctor", "check", "--timeout", str(timeout), "--only",
                          "process-group,fault-mark-then-collective"], envs[i]) for i in range(2)]
        while not all(os.path.exists(f"{marker}.{r}") for r in range(2)):
            time.sleep(0.02)
        h.link(1, up=False)
        t0 = time.monotonic()
        out = ps[0].communicate(timeout=120)[0]
        secs = time.monotonic() - t0
        ps[1].communicate(timeout=120)
        for r in range(2):
            os.unlink(f"{marker}.{r}")
        return secs, verdict(out, "lost contact")

    yield "MASTER_ADDR up, nothing listening", two_hosts(refused)
    yield "MASTER_ADDR drops packets", two_hosts(dropped)
    yield "GLOO_SOCKET_IFNAME names a missing interface", two_hosts(bad_ifname)
    yield "link down mid-check", two_hosts(link_down)


def two_host_timing(repeat: int = 3) -> tuple[float, float]:
    env = base_env()

    def one_host():
        port = free_port()
        t0 = time.monotonic()
        ps = [subprocess.Popen([PY, "-m", "ddpdoctor", "check"] + FOUNDATION,
                               env={**joined_env(env, r, 2, "127.0.0.1", port), "GLOO_SOCKET_IFNAME": "lo"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for r in range(2)]
        assert all(p.wait(timeout=120) == 0 for p in ps)
        return time.monotonic() - t0

    def across(h):
        t0 = time.monotonic()
        ps = [h.popen(i, [PY, "-m", "ddpdoctor", "check"] + FOUNDATION, joined_env(env, i, 2, h.addrs[0], 29424))
              for i in range(2)]
        for p in ps:
            p.communicate(timeout=120)
            assert p.returncode == 0
        return time.monotonic() - t0

    ones, twos = [], []
    with Hosts(2) as h:
        for _ in range(repeat):
            ones.append(one_host())
            twos.append(across(h))
    return sorted(ones)[len(ones) // 2], sorted(twos)[len(twos) // 2]


def root_cause_matrix(modes: list, jobs: int) -> None:
    """Run every cell; print one row per cell and the max/median time to verdict per mode."""
    from concurrent.futures import ThreadPoolExecutor

    from rootcause import FAULT_KINDS, Cell, cell_env, read_stamp, run_cli, torchrun_cmd, verdict_line, verify

    from ddpdoctor.runner.verdict import CAUSE_GRACE

    cells = [Cell(kind, when, n, (i + n) % n, mode) for mode in modes for n in (2, 3, 4)
             for i, (kind, when) in enumerate((k, w) for k in FAULT_KINDS for w in ("before", "during"))]
    workdir = tempfile.mkdtemp(prefix="ddpd-rootcause-")

    def one(args: tuple) -> tuple:
        i, cell = args
        stamp = os.path.join(workdir, f"stamp{i}")
        env = cell_env(base_env(), cell, stamp)
        cmd = torchrun_cmd(cell) if cell.mode == "torchrun" else \
            [PY, "-m", "ddpdoctor", "check", "--nproc", str(cell.nproc), "--timeout", "30", "--only",
             "fault-matrix,fault-none"]
        code, lines = run_cli(cmd, env, timeout=180)
        found = verdict_line(lines)
        if found is None or not os.path.exists(stamp):
            return cell, None, "(no verdict)", False
        at, status, summary = found
        try:
            verify(cell, status, summary)
            ok = True
        except AssertionError:
            ok = False
        secs = at - read_stamp(stamp)
        os.unlink(stamp)
        return cell, secs, f"[{status}] {summary}", ok

    print("| world | fault | when | ranks | cause rank | verdict right | failure to verdict | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    times: dict = {}
    bad = 0
    try:
        for mode in modes:
            mine = [(i, c) for i, c in enumerate(cells) if c.mode == mode]
            with ThreadPoolExecutor(jobs if mode == "torchrun" else 1) as pool:
                for cell, secs, line, ok in pool.map(one, mine):
                    bad += not ok
                    if secs is not None:
                        times.setdefault(mode, []).append(secs)
                    shown = f"{secs:.2f} s" if secs is not None else "n/a"
                    print(f"| {mode} | {cell.kind} | {cell.when} | {cell.nproc} | {cell.rank} | "
                          f"{'yes' if ok else 'NO'} | {shown} | `{line[:150]}` |", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    for mode, ts in times.items():
        ts = sorted(ts)
        print(f"{mode}: {len(ts)} cells, failure to verdict: median {ts[len(ts) // 2]:.2f} s, max {ts[-1]:.2f} s "
              f"(CAUSE_GRACE {CAUSE_GRACE:g} s: {'within' if ts[-1] <= CAUSE_GRACE else 'OVER'})")
    everything = sorted(t for ts in times.values() for t in ts)
    if everything:
        print(f"all: median {everything[len(everything) // 2]:.2f} s, max {everything[-1]:.2f} s; "
              f"wrong verdicts: {bad}; processes left: {leftovers()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=3.0, help="ddpdoctor's --timeout for each scenario")
    ap.add_argument("--root-cause", action="store_true", help="run the root-cause matrix (at --timeout 30)")
    ap.add_argument("--modes", default="local,torchrun", help="root-cause matrix worlds: local,torchrun")
    ap.add_argument("--jobs", type=int, default=3, help="torchrun cells run side by side")
    args = ap.parse_args()
    if args.root_cause:
        root_cause_matrix([m for m in args.modes.split(",") if m], args.jobs)
        return
    print("| fault | what ddpdoctor reported | time to report | processes left | ports left listening |")
    print("|---|---|---|---|---|")
    for name, run in scenarios(args.timeout):
        secs, line = run()
        time.sleep(0.3)
        print(f"| {name} | `{line}` | {secs:.1f} s | {leftovers()} | {listening_ours()} |", flush=True)
    if netns_unavailable() is None:
        one, two = two_host_timing()
        print(f"\n2-host `ddpdoctor check` (2 ranks, one per host): {two:.2f} s; the same on one host: {one:.2f} s "
              f"({two / one:.2f}x)")


if __name__ == "__main__":
    main()
