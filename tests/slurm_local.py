"""A real single-node Slurm (munged, slurmctld, slurmd from Debian's packages) in a temporary dir.

Everything runs in the foreground as children of the test process, with its own munge key and
socket and ports the OS picks, and is stopped on exit. Used by tests/test_slurm.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional

__all__ = ["LocalSlurm", "slurm_unavailable"]

BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sinfo")


def slurm_unavailable() -> Optional[str]:
    """Why a local Slurm cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root to run slurmctld/slurmd"
    missing = [b for b in BINARIES if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]
    if missing:
        return f"needs Debian's slurm-wlm and munge ({', '.join(missing)} not found)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class LocalSlurm:
    """Context manager: a one-node cluster whose ``env`` (SLURM_CONF) points srun at it."""

    def __init__(self, cpus: int = 4) -> None:
        self.cpus = cpus
        self.dir = tempfile.mkdtemp(prefix="ddpdoctor-slurm-")
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ)

    def __enter__(self) -> "LocalSlurm":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        d = self.dir
        for sub in ("state", "spool", "log"):
            os.makedirs(os.path.join(d, sub))
        key = os.path.join(d, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        sock = os.path.join(d, "munge.sock")
        self.procs.append(subprocess.Popen(
            [_bin("munged"), "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
             f"--pid-file={d}/munged.pid", f"--log-file={d}/log/munged.log", f"--seed-file={d}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        host = socket.gethostname()
        conf = os.path.join(d, "slurm.conf")
        with open(conf, "w") as f:
            f.write(f"""ClusterName=ddpd
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/ctld.log
SlurmdLogFile={d}/log/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
NodeName={host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
        self.env["SLURM_CONF"] = conf
        self._wait_for(lambda: os.path.exists(sock), "munged")
        for daemon in ("slurmctld", "slurmd"):
            self.procs.append(subprocess.Popen([_bin(daemon), "-D", "-f", conf] + (["-c"] if daemon == "slurmctld" else []),
                                               env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._wait_for(self._idle, "slurmd to register with slurmctld")

    def _idle(self) -> bool:
        p = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True, timeout=10)
        return p.stdout.strip() == "idle"

    def _wait_for(self, ready, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode} while waiting for {what}; "
                                       f"logs in {self.dir}/log")
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}; logs in {self.dir}/log")

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
