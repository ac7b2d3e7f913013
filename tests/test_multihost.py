"""Real multi-host runs: hosts are network namespaces on a private bridge (see tests/netns.py)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from netns import Hosts, netns_unavailable

pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))]

PY = sys.executable
TORCHRUN = [PY, "-m", "torch.distributed.run"]
CHECK = [PY, "-m", "ddpdoctor", "check", "--only", "env,port,process-group"]


def _finish(procs, timeout=90):
    out = []
    for p in procs:
        o, e = p.communicate(timeout=timeout)
        out.append((p.returncode, o, e))
    return out


def _joined_env(base, rank, world, master, port, local_world=1):
    return {**base, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % local_world),
            "LOCAL_WORLD_SIZE": str(local_world), "MASTER_ADDR": master, "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "eth0"}


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("rdzv", ["static", "c10d"])
def test_torchrun_two_nodes_one_report_covering_both(cli_env, tmp_path, rdzv):
    env = {**cli_env, "GLOO_SOCKET_IFNAME": "eth0"}
    with Hosts(2) as h:
        procs = []
        for i in range(2):
            if rdzv == "static":
                launch = ["--nnodes", "2", "--node-rank", str(i), "--master-addr", h.addrs[0], "--master-port", "29411"]
            else:
                launch = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{h.addrs[0]}:29412",
                          "--rdzv-id", "ddpd-test"]
            args = TORCHRUN + launch + ["--nproc-per-node", "2", "-m", "ddpdoctor", "check", "--timeout", "30",
                                        "--only", "env,port,process-group"]
            if i == 0 or rdzv == "c10d":
                args += ["--json", str(tmp_path / f"r{i}.json")]
            procs.append(h.popen(i, args, env))
        results = _finish(procs)
        assert [c for c, _, _ in results] == [0, 0], results
        reports = [o for _, o, _ in results if "torchrun job of" in o]
        assert len(reports) == 1, results  # exactly one rank 0 printed
        assert reports[0].splitlines()[0] == "ddpdoctor 0.1.0: torchrun job of 4 ranks (gloo) on 2 nodes"
        assert "4 ranks on 2 nodes joined in" in reports[0]
        doc = json.loads(next(p for p in tmp_path.glob("r*.json")).read_text())
        assert sorted(set(doc["world"]["hosts"].values())) == ["node0", "node1"]
        assert doc["world"]["nodes"] == 2
        assert h.listening(0) == [] and h.listening(1) == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_joined_without_an_agent_binds_only_the_master_address(cli_env):
    with Hosts(3) as h:
        port = 29413
        procs = [h.popen(i, CHECK + ["--timeout", "30"], _joined_env(cli_env, i, 3, h.addrs[0], port))
                 for i in range(3)]
        deadline = time.monotonic() + 30
        bound = []
        while time.monotonic() < deadline and not bound:
            bound = [line for line in h.listening(0) if f":{port} " in line + " "]
            time.sleep(0.05)
        results = _finish(procs)
        assert [c for c, _, _ in results] == [0, 0, 0], results
        assert bound and bound[0].split()[3] == f"{h.addrs[0]}:{port}"  # not 0.0.0.0
        assert "3 ranks on 3 nodes joined in" in results[0][1]
        assert all(h.listening(i) == [] for i in range(3))


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_master_up_but_nothing_listening_is_refused(cli_env):
    with Hosts(2) as h:
        t0 = time.monotonic()
        p = h.popen(1, CHECK + ["--timeout", "2"], _joined_env(cli_env, 1, 2, h.addrs[0], 29414))
        ((code, out, err),) = _finish([p])
        assert code == 1 and out == ""
        assert f"port: {h.addrs[0]}:29414 refused the connection for 2s" in err
        assert time.monotonic() - t0 < 15


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_master_that_drops_packets_does_not_answer(cli_env):
    with Hosts(2) as h:
        h.blackhole(1, 0)
        p = h.popen(1, CHECK + ["--timeout", "2"], _joined_env(cli_env, 1, 2, h.addrs[0], 29415))
        ((code, out, err),) = _finish([p])
        assert code == 1
        assert f"port: {h.addrs[0]}:29415 did not answer within 2s" in err
        assert "no firewall drops the port" in err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_socket_ifname_naming_a_missing_interface_is_named_with_the_ones_that_exist(cli_env):
    with Hosts(2) as h:
        envs = [_joined_env(cli_env, i, 2, h.addrs[0], 29416) for i in range(2)]
        envs[1]["GLOO_SOCKET_IFNAME"] = "eth9"
        procs = [h.popen(i, CHECK + ["--timeout", "5"], envs[i]) for i in range(2)]
        results = _finish(procs)
        out = results[0][1]
        assert [c for c, _, _ in results] == [1, 1], results
        assert "rank 1: GLOO_SOCKET_IFNAME=eth9: no interface eth9 on this host (it has: eth0, lo)" in out
        assert "fix: set GLOO_SOCKET_IFNAME to the interface of the network the nodes share: eth0" in out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_link_down_mid_check_names_the_ranks_that_lost_contact(cli_env, tmp_path):
    marker = str(tmp_path / "reached")
    with Hosts(2) as h:
        envs = [{**_joined_env(cli_env, i, 2, h.addrs[0], 29417), "DDPDOCTOR_PLUGINS": "faults",
                 "FAULT_MARKER": marker, "FAULT_DELAY": "1"} for i in range(2)]
        procs = [h.popen(i, [PY, "-m", "ddpdoctor", "check", "--timeout", "4", "--only",
                             "process-group,fault-mark-then-collective,fault-none"],
                         envs[i]) for i in range(2)]
        deadline = time.monotonic() + 60
        while not all(os.path.exists(f"{marker}.{r}") for r in range(2)):
            assert time.monotonic() < deadline, "ranks never reached the marker"
            time.sleep(0.02)
        h.link(1, up=False)
        t0 = time.monotonic()
        (c0, o0, e0), (c1, o1, e1) = _finish(procs)
        elapsed = time.monotonic() - t0
        assert c0 == 1 and c1 == 1, (o0, e0, o1, e1)
        assert "rank 1 on node1 lost contact (no answer on the control channel)" in o0, o0
        assert "rank 0 stuck in all_reduce, called from run (tests/faults.py:" in o0
        assert "fault-none" in o0 and "not run: ranks 0-1 hung during 'fault-mark-then-collective'" in o0
        assert "fix: check the network path to node1" in o0
        assert elapsed < 30
        assert "lost" in e1 or "control" in e1 or "no verdict" in e1, e1
