"""Several hosts on one machine: Linux network namespaces joined by veth pairs through a bridge.

Each host is a namespace with its own loopback, an ``eth0`` on the 10.213.<net>.0/24 test network
(addresses of our own test hosts only) and its own hostname (a UTS namespace per command). Used by
tests/test_multihost.py and benchmarks/fault_matrix.py; needs root and iproute2. Every host is a
fresh namespace, so a port chosen inside one cannot collide with anything else on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from typing import Optional, Sequence

__all__ = ["Hosts", "netns_unavailable"]


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
    """``n`` test hosts on a private bridge; use as a context manager (everything is removed on exit)."""

    def __init__(self, n: int) -> None:
        self.n = n
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
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i, ns in enumerate(self.names):
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("link", "add", f"d{self.tag}h{i}", "type", "veth", "peer", "name", f"d{self.tag}s{i}")
                _ip("link", "set", f"d{self.tag}h{i}", "netns", ns)
                _ip("link", "set", f"d{self.tag}s{i}", "netns", self.switch)
                _ip("-n", ns, "link", "set", f"d{self.tag}h{i}", "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.addrs[i]}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", self.switch, "link", "set", f"d{self.tag}s{i}", "master", "br0")
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
        for ns in self.names + [self.switch]:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        time.sleep(0.05)
