"""Ports and addresses: bind the rendezvous port, find who holds one, connect to the master within a deadline."""

from __future__ import annotations

import errno
import socket
import time
from dataclasses import dataclass
from typing import Optional

from ddpdoctor.result import Outcome, Status
from ddpdoctor.system.redact import redact_argv, shorten

__all__ = ["BindProbe", "bind_master", "probe_connect", "port_holder", "free_port"]

@dataclass
class BindProbe:
    """The result of binding the master's port: the outcome and, on success, the listening socket."""

    outcome: Outcome
    sock: Optional[socket.socket]



def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET



def free_port(addr: str = "127.0.0.1") -> Optional[int]:
    """A port the OS says is free on ``addr`` right now (a suggestion, not a reservation)."""
    try:
        with socket.socket(_family(addr), socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
            return int(s.getsockname()[1])
    except OSError:
        return None



def one_line(text: str) -> str:
    """``text`` on one line: newlines, tabs and other control characters become single spaces."""
    return " ".join("".join(" " if (ord(c) < 32 or 127 <= ord(c) < 160) else c for c in text).split())


def port_holder(port: int) -> Optional[str]:
    """``"pid 1234 (python train.py)"`` for the process listening on ``port``, or None if unknown.

    The command line is redacted before it is cut (``--password VALUE``, ``--api-key=...``, tokens):
    a cut first could leave a fragment of a secret that nothing recognises."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                proc = psutil.Process(conn.pid)
                cmd = " ".join(redact_argv(proc.cmdline())[:4]) or proc.name()
                return f"pid {conn.pid} ({shorten(one_line(cmd), 80)})"
    except Exception:  # AccessDenied, a process that just exited, no psutil support
        return None
    return None



def bind_master(addr: str, port: int, rank: int = 0, backlog: int = 1024) -> BindProbe:
    """Bind and listen on ``addr:port`` (port 0: the OS picks) for the rendezvous store.

    Returns the outcome for this rank and the listening socket (caller owns and closes it).
    """
    start = time.perf_counter()
    sock = socket.socket(_family(addr), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        return BindProbe(_bind_failure(addr, port, exc, rank, time.perf_counter() - start), None)
    except OverflowError:
        sock.close()
        return BindProbe(Outcome(rank, Status.FAIL, f"port {port} is out of range",
                                 hint="choose a port in 1-65535", finding="bad-port"), None)
    bound = sock.getsockname()[1]
    how = "free (picked by the OS)" if port == 0 else "free"
    return BindProbe(
        Outcome(rank, Status.PASS, f"{addr}:{bound} is {how} and bound on the master",
                data={"addr": addr, "port": bound, "role": "master"}, duration=time.perf_counter() - start),
        sock,
    )



def _bind_failure(addr: str, port: int, exc: OSError, rank: int, duration: float) -> Outcome:
    data = {"addr": addr, "port": port, "role": "master", "errno": exc.errno}
    if exc.errno == errno.EADDRINUSE:
        holder = port_holder(port)
        suggestion = free_port(addr)
        who = f"held by {holder}" if holder else "held by another process"
        hint = f"pick a free port: --master-port {suggestion} (or export MASTER_PORT={suggestion})" if suggestion \
            else "pick another MASTER_PORT"
        if holder:
            hint += f", or stop {holder.split(' (')[0]}"
        data["holder"] = holder
        return Outcome(rank, Status.FAIL, f"port {port} on {addr} is {who}", hint=hint,
                       finding="port-in-use", data=data, duration=duration)
    if exc.errno == errno.EADDRNOTAVAIL:
        return Outcome(rank, Status.FAIL, f"{addr} is not an address of this host ({exc.strerror})",
                       hint="set MASTER_ADDR (--master-addr) to this host's address or name",
                       finding="master-addr-not-local", data=data, duration=duration)
    if exc.errno == errno.EACCES:
        return Outcome(rank, Status.FAIL, f"no permission to bind port {port} on {addr}",
                       hint="use a port above 1023", finding="port-permission", data=data, duration=duration)
    return Outcome(rank, Status.FAIL, f"cannot bind {addr}:{port}: {exc.strerror or exc}",
                   hint="choose another MASTER_ADDR/MASTER_PORT", finding="port-bind-failed", data=data,
                   duration=duration)



def probe_connect(addr: str, port: int, timeout: float, rank: int) -> Outcome:
    """Resolve ``addr`` and connect to ``addr:port`` within ``timeout`` seconds (then close)."""
    start = time.perf_counter()
    data = {"addr": addr, "port": port, "role": "client"}
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return Outcome(rank, Status.FAIL, f"MASTER_ADDR {addr!r} does not resolve ({exc.strerror})",
                       hint="set MASTER_ADDR to the master node's hostname or IP as this node can resolve it",
                       finding="master-addr-unresolvable", data=data, duration=time.perf_counter() - start)
    last: Optional[BaseException] = None
    deadline = start + timeout
    while time.perf_counter() < deadline:
        for family, kind, proto, _, sockaddr in infos:
            s = socket.socket(family, kind, proto)
            s.settimeout(max(0.05, deadline - time.perf_counter()))
            try:
                s.connect(sockaddr)
            except OSError as exc:
                last = exc
            else:
                elapsed = time.perf_counter() - start
                data["connect_ms"] = round(elapsed * 1000, 2)
                return Outcome(rank, Status.PASS, f"{addr}:{port} accepted a connection in {elapsed * 1000:.1f} ms",
                               data=data, duration=elapsed)
            finally:
                s.close()
        if isinstance(last, socket.timeout):
            break
        time.sleep(0.1)
    elapsed = time.perf_counter() - start
    if isinstance(last, socket.timeout) or last is None:
        return Outcome(rank, Status.FAIL, f"{addr}:{port} did not answer within {timeout:g}s",
                       hint="check that MASTER_ADDR is the master's address on a network this node reaches "
                            "and that no firewall drops the port",
                       finding="master-unreachable", data=data, duration=elapsed)
    return Outcome(rank, Status.FAIL, f"{addr}:{port} refused the connection for {timeout:g}s ({last})",
                   hint="start rank 0 first or make MASTER_PORT the same on every node; check that "
                        "MASTER_ADDR names the master node",
                   finding="master-refused", data=data, duration=elapsed)
