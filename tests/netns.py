"""Several hosts on one machine: Linux network namespaces joined by veth pairs through a bridge.

Each host is a namespace with its own loopback, an ``eth0`` on the 10.213.<net>.0/24 test network
(addresses of our own test hosts only) and its own hostname (a UTS namespace per command). Used by
tests/test_multihost.py, tests/test_locate.py, benchmarks/fault_matrix.py and bench_locate.py; needs
root and iproute2. Every host is a fresh namespace, so a port chosen inside one cannot collide with
anything else on the machine.

``Hosts(n, switches=(2, 2))`` puts the hosts behind several switches (one bridge each, hosts in order),
every switch after the first joined to the first by an uplink (a veth pair): ``slow_uplink`` rate-limits
one with ``tc tbf``, a switch whose uplink is congested. :class:`CpuQuota` starves a process of CPU
with a cgroup quota (v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from typing import Optional, Sequence

__all__ = ["Hosts", "CpuQuota", "netns_unavailable"]


def netns_unavailable() -> Optional[str]:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 (ip) and util-linux (unshare)"
    probe = f"ddpd-probe-{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        return f"cannot create a network namespace: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    p = subprocess.run(["ip", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")


class Hosts:
    """``n`` test hosts on a private bridge (or on ``switches``: how many hosts behind each bridge, in
    host order); use as a context manager (everything is removed on exit)."""

    def __init__(self, n: int, switches: Optional[Sequence[int]] = None) -> None:
        self.n = n
        self.switches = list(switches or [n])
        if sum(self.switches) != n or min(self.switches) < 1:
            raise ValueError(f"switches={switches}: one or more hosts behind each, {n} in all")
        self.tag = uuid.uuid4().hex[:6]
        self.net = 1 + int(self.tag, 16) % 250
        self.switch = f"ddpd-{self.tag}-sw"
        self.names = [f"ddpd-{self.tag}-h{i}" for i in range(n)]
        self.hostnames = [f"node{i}" for i in range(n)]
        self.addrs = [f"10.213.{self.net}.{i + 1}" for i in range(n)]
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "Hosts":
        try:
            _ip("netns", "add", self.switch)
            for k in range(len(self.switches)):
                _ip("-n", self.switch, "link", "add", f"br{k}", "type", "bridge")
                _ip("-n", self.switch, "link", "set", f"br{k}", "up")
            for k in range(1, len(self.switches)):  # switch k's uplink to switch 0: up{k} on br0, dn{k} on br{k}
                _ip("-n", self.switch, "link", "add", f"up{k}", "type", "veth", "peer", "name", f"dn{k}")
                for end, br in ((f"up{k}", "br0"), (f"dn{k}", f"br{k}")):
                    _ip("-n", self.switch, "link", "set", end, "master", br)
                    _ip("-n", self.switch, "link", "set", end, "up")
            behind = [k for k, count in enumerate(self.switches) for _ in range(count)]
            for i, ns in enumerate(self.names):
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("link", "add", f"d{self.tag}h{i}", "type", "veth", "peer", "name", f"d{self.tag}s{i}")
                _ip("link", "set", f"d{self.tag}h{i}", "netns", ns)
                _ip("link", "set", f"d{self.tag}s{i}", "netns", self.switch)
                _ip("-n", ns, "link", "set", f"d{self.tag}h{i}", "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.addrs[i]}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", self.switch, "link", "set", f"d{self.tag}s{i}", "master", f"br{behind[i]}")
                _ip("-n", self.switch, "link", "set", f"d{self.tag}s{i}", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run on host ``i`` (its namespace, its hostname, /etc/hosts naming every host)."""
        script = ('hostname "$1"; shift; '
                  'h="${TMPDIR:-/tmp}/hosts-$$"; printf "127.0.0.1 localhost\\n%s\\n" "$HOSTS_LINE" | tr "|" "\\n" > "$h"; '
                  'mount --bind "$h" /etc/hosts 2>/dev/null; rm -f "$h"; exec "$@"')
        line = "|".join(f"{a} {h}" for a, h in zip(self.addrs, self.hostnames))
        return ["ip", "netns", "exec", self.names[i], "unshare", "--uts", "--mount", "env", f"HOSTS_LINE={line}",
                "sh", "-c", script, "sh", self.hostnames[i], *argv]

    def popen(self, i: int, argv: Sequence[str], env: dict, **kw: object) -> subprocess.Popen:
        p = subprocess.Popen(self.command(i, argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def link(self, i: int, up: bool) -> None:
        """Take host ``i``'s cable out (or put it back): its switch port goes down."""
        _ip("-n", self.switch, "link", "set", f"d{self.tag}s{i}", "up" if up else "down")

    def slow_uplink(self, k: int, rate: str = "40mbit") -> None:
        """Switch ``k``'s uplink (k >= 1) carries at most ``rate`` each way (token bucket on both ends)."""
        for end in (f"up{k}", f"dn{k}"):
            p = subprocess.run(["ip", "netns", "exec", self.switch, "tc", "qdisc", "add", "dev", end, "root", "tbf",
                                "rate", rate, "burst", "32kb", "latency", "400ms"], capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"tc on {end}: {p.stderr.strip()}")

    def slow_host(self, i: int, rate: str = "40mbit") -> None:
        """Host ``i``'s own cable carries at most ``rate`` out of it (token bucket on its eth0)."""
        subprocess.run(["ip", "netns", "exec", self.names[i], "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                        "rate", rate, "burst", "32kb", "latency", "400ms"], check=True)

    def established(self, i: int) -> int:
        """How many TCP connections host ``i`` has established (``ss -Htn``)."""
        p = subprocess.run(["ip", "netns", "exec", self.names[i], "ss", "-Htn", "state", "established"],
                           capture_output=True, text=True)
        return len([line for line in p.stdout.splitlines() if line.strip()])

    def blackhole(self, src: int, dst: int) -> None:
        """Frames from host ``src`` to host ``dst`` vanish (a static neighbour with a MAC nobody has):
        ``dst`` looks up but silently drops every packet."""
        _ip("-n", self.names[src], "neigh", "replace", self.addrs[dst], "lladdr", "02:00:00:de:ad:01",
            "dev", "eth0", "nud", "permanent")

    def listening(self, i: int) -> list[str]:
        """TCP sockets listening on host ``i`` (``ss -ltn``), excluding the header."""
        p = subprocess.run(["ip", "netns", "exec", self.names[i], "ss", "-Hltn"], capture_output=True, text=True)
        return [line for line in p.stdout.splitlines() if line.strip()]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
            for pipe in (p.stdin, p.stdout, p.stderr):  # a host killed here was never read to the end
                if pipe is not None and not pipe.closed:
                    pipe.close()
        for ns in self.names + [self.switch]:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        time.sleep(0.05)


class CpuQuota:
    """A cgroup whose processes share at most ``fraction`` of one CPU; a context manager that puts the
    processes back in the root group and removes itself on exit.

    cgroup v2 (``cpu.max``) where ``/sys/fs/cgroup`` is cgroup2 with the cpu controller enabled for its
    children, else the v1 cpu controller (``/sys/fs/cgroup/cpu``, ``cpu.cfs_quota_us``).
    """

    PERIOD_US = 100_000

    def __init__(self) -> None:
        self.root, self.v2 = _cpu_cgroup_root()
        if self.root is None:
            raise RuntimeError(str(self.v2))
        self.path = os.path.join(self.root, f"ddpd-cpu-{os.getpid()}-{uuid.uuid4().hex[:6]}")

    @staticmethod
    def unavailable() -> Optional[str]:
        """Why a CPU quota cannot be set here, or None when it can."""
        root, why = _cpu_cgroup_root()
        return None if root is not None else str(why)

    def __enter__(self) -> "CpuQuota":
        os.mkdir(self.path)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group; its later children are born in it."""
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def limit(self, fraction: Optional[float]) -> None:
        """At most ``fraction`` of one CPU from now on (None: no limit)."""
        quota = None if fraction is None else max(1000, int(self.PERIOD_US * fraction))
        if self.v2:
            with open(os.path.join(self.path, "cpu.max"), "w") as f:
                f.write(f"{'max' if quota is None else quota} {self.PERIOD_US}")
        else:
            with open(os.path.join(self.path, "cpu.cfs_period_us"), "w") as f:
                f.write(str(self.PERIOD_US))
            with open(os.path.join(self.path, "cpu.cfs_quota_us"), "w") as f:
                f.write(str(-1 if quota is None else quota))

    def close(self) -> None:
        if not os.path.isdir(self.path):
            return
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                pids = f.read().split()
        except OSError:
            pids = []
        for pid in pids:  # back to the root group, so the group can be removed even if they live on
            try:
                with open(os.path.join(self.root, "cgroup.procs"), "w") as f:
                    f.write(pid)
            except OSError:
                pass
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def _cpu_cgroup_root() -> tuple:
    """(the cgroup folder to make a child in, True for v2) or (None, why not)."""
    if os.geteuid() != 0:
        return None, "needs root to make a cgroup"
    base = "/sys/fs/cgroup"
    try:
        with open(os.path.join(base, "cgroup.subtree_control")) as f:
            if "cpu" in f.read().split() and os.access(base, os.W_OK):
                return base, True
    except OSError:
        pass
    v1 = os.path.join(base, "cpu")
    if os.path.isfile(os.path.join(v1, "cpu.cfs_quota_us")) and os.access(v1, os.W_OK):
        return v1, False
    return None, ("no writable cgroup with a cpu controller (neither cgroup2 /sys/fs/cgroup with cpu in "
                  "cgroup.subtree_control nor cgroup v1 /sys/fs/cgroup/cpu)")
