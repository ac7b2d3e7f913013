"""What lets the default check scale (issue 18): the world's facts travel with the run directives,
deadlines scale with a slow world (never without bound), the checks' exchanges are batched, and the
command exits without the interpreter's teardown. Nothing here times its subject."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from ddpdoctor.checks.collectives import CROWDED, PACKED, SIZES, CollectivesCheck
from worlds import run_world

from ddpdoctor.check import RankContext, WorldInfo
from ddpdoctor.diagnostics import fingerprint as fp
from ddpdoctor.diagnostics.collective_plan import Group
from ddpdoctor.result import CheckResult, Outcome, Status
from ddpdoctor.runner.channel import pack_hosts, unpack_hosts
from ddpdoctor.runner.lockstep import MAX_SCALE, Coordinator
from ddpdoctor.runner.worker import _learn


@pytest.mark.timeout(10)
def test_hosts_pack_to_runs_and_back():
    hosts = {r: "a" if r < 64 else "b" for r in range(128)}
    packed = pack_hosts(hosts, 128)
    assert packed == {"names": ["a", "b"], "runs": [[0, 64], [1, 64]]}  # constant size for one host per node
    assert unpack_hosts(packed) == tuple(hosts[r] for r in range(128))
    gappy = {0: "x", 2: "y", 3: "x"}  # rank 1 never arrived
    assert unpack_hosts(pack_hosts(gappy, 4)) == ("x", "", "y", "x")
    assert unpack_hosts(None) == ()


@pytest.mark.timeout(10)
def test_a_run_directive_tells_the_rank_its_deadline_and_the_world():
    ctx = RankContext(rank=1, world_size=3, local_rank=1, local_world_size=3, node_rank=0, backend="gloo",
                      timeout=30.0, store=None)
    assert ctx.deadline == 30.0 and ctx.hosts == () and ctx.ranks_per_core is None
    _learn(ctx, {"action": "run", "deadline": 120.0,
                 "world": {"hosts": pack_hosts({0: "n0", 1: "n0", 2: "n1"}, 3), "ranks_per_core": 1.5}})
    assert ctx.deadline == 120.0 and ctx.hosts == ("n0", "n0", "n1") and ctx.ranks_per_core == 1.5
    _learn(ctx, {"action": "run"})  # an older coordinator: the rank's own timeout, facts kept
    assert ctx.deadline == 30.0


class _Quiet:
    def poll(self, now: bool = False) -> None:
        pass


def _coordinator(ranks: int, cpus: int, hosts: int = 1) -> Coordinator:
    c = Coordinator(channel=None, checks=(), world=WorldInfo(world_size=ranks, backend="gloo"),  # type: ignore[arg-type]
                    supervisor=_Quiet(), timeout=30.0)  # type: ignore[arg-type]
    c.hellos = {r: {"host": f"h{r * hosts // ranks}", "cpus": cpus} for r in range(ranks)}
    # greet() without a channel: the same computation as at the end of greet
    per_host: dict = {}
    for h in c.hellos.values():
        per_host.setdefault(h["host"], []).append(h)
    c.ranks_per_core = max(len(hs) / min(h["cpus"] for h in hs) for hs in per_host.values())
    return c


def _measured(c: Coordinator, seconds: float) -> None:
    c._measured(CheckResult("x", Status.PASS, "", outcomes=(
        Outcome(0, Status.PASS, "", data={"collective_seconds": seconds / 3}),
        Outcome(1, Status.PASS, "", data={"collective_seconds": seconds}))))


@pytest.mark.timeout(10)
def test_deadlines_scale_with_a_slow_world_and_never_without_bound():
    small = _coordinator(8, cpus=2)  # 4 ranks per core: as given
    assert small.deadline == 30.0
    _measured(small, 0.02)
    assert small.deadline == 30.0
    crowded = _coordinator(128, cpus=2)  # 64 per core: scaled before anything is measured
    assert crowded.deadline == 30.0 * 64 / 16
    _measured(crowded, 2.0)  # the slowest rank's measured seconds per collective count
    assert crowded.deadline == pytest.approx(30.0 * 2.0 / 0.25)
    _measured(crowded, 1.0)  # a faster later measurement does not shrink it
    assert crowded.deadline == pytest.approx(30.0 * 2.0 / 0.25)
    _measured(crowded, 1e6)
    assert crowded.deadline == 30.0 * MAX_SCALE
    spread = _coordinator(128, cpus=16, hosts=8)  # 16 ranks on each of 8 nodes of 16 cores
    assert spread.ranks_per_core == 1.0 and spread.deadline == 30.0


@pytest.mark.timeout(10)
def test_a_timeout_in_a_crowded_world_says_it_may_only_be_slow():
    c = _coordinator(128, cpus=2)
    hung = CheckResult("param-sync", Status.TIMEOUT, "ranks 0-127 stuck in all_gather", hint="find why",
                       finding="rank-hung")
    r = c._with_deadline(hung, c.deadline, trouble=True)
    assert r.status == Status.TIMEOUT and r.finding == "world-too-slow"
    assert r.summary.startswith("too slow to finish within 120s, perhaps not hung: 128 ranks share about 2 CPU "
                                "cores (64 per core)")
    assert r.summary.endswith("ranks 0-127 stuck in all_gather")
    assert "fewer ranks per core" in r.hint and r.hint.endswith("find why")
    assert any(line.startswith("deadline 120s: --timeout 30s scaled 4.0x") for line in r.details)
    small = _coordinator(2, cpus=2)
    assert small._with_deadline(hung, 30.0, trouble=True) == hung  # a small world's hang is a hang


@pytest.mark.timeout(10)
def test_crowded_worlds_check_every_operation_first_then_more_in_tiers():
    check = CollectivesCheck()
    world = Group(tuple(range(8)), 0)
    check.shrink = 1.0
    assert check.tiers(check.cases(world)) == [check.cases(world)]  # an uncrowded world: one tier, as listed
    for shrink in (CROWDED, PACKED):
        check.shrink = shrink
        cases = check.cases(world)
        tiers = check.tiers(cases)
        assert sorted(c for t in tiers for c in t) == sorted(cases)
        first = tiers[0]
        assert {op for op, _, _ in first} == {op for op, _, _ in cases}  # every operation in the first tier
        assert all(dtype == "float32" and count in (SIZES[1], 0) for _, dtype, count in first)
    check.shrink = CROWDED
    large = {op for op, dtype, count in check.cases(world) if dtype == "float32" and count > SIZES[1]}
    assert large == {"all_reduce(sum)", "all_gather(tensor)", "reduce_scatter"}


@pytest.mark.timeout(20)
def test_fingerprint_keys_computed_as_needed_equal_the_whole_table():
    device = torch.device("cpu")
    saved = dict(fp._keys)
    fp._keys.clear()
    try:
        first = fp._block_keys(0, 1, device).clone()
        assert fp._keys[device].shape[0] == 1  # a small tensor computes one block's keys
        later = fp._block_keys(5, 3, device).clone()
        assert fp._keys[device].shape[0] == 8
        index = torch.arange(8 * fp.COLS, dtype=torch.int64)
        whole = (fp._mix(index + fp._KEY_SALT) | 1).view(8, fp.COLS)
        assert torch.equal(first, whole[:1]) and torch.equal(later, whole[5:8])
        fp._keys.clear()
        t = torch.randn(3 * fp.BLOCK_WORDS + 17)
        lazily = fp.fingerprint(t)
        fp._block_keys(0, fp.GROUP_BLOCKS, device)  # the whole cache, as before the change
        assert fp.fingerprint(t) == lazily
    finally:
        fp._keys.clear()
        fp._keys.update(saved)


def _differences(rank: int, world: int) -> list:
    from ddpdoctor.diagnostics.desync import DesyncError, assert_in_sync

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    with torch.no_grad():
        if rank == 1:
            model[0].weight[0, 0] += 0.5
            model[0].bias[3] -= 2.0
            model[1].weight[1, 7] = float("nan")
    try:
        assert_in_sync(model)
    except DesyncError as exc:
        return [(m.name, m.max_abs_diff) for m in exc.mismatches]
    return []


@pytest.mark.timeout(60)
def test_the_differences_of_several_tensors_come_from_one_stream():
    for got in run_world(_differences, 2):
        names = [n for n, _ in got]
        assert names == ["param:0.weight", "param:0.bias", "param:1.weight"]
        diffs = dict(got)
        assert diffs["param:0.weight"] == pytest.approx(0.5) and diffs["param:0.bias"] == pytest.approx(2.0)
        assert diffs["param:1.weight"] != diffs["param:1.weight"]  # NaN on one rank only


@pytest.mark.timeout(10)
def test_torch_version_is_read_without_importing_torch_or_metadata():
    code = textwrap.dedent("""
        import sys
        from ddpdoctor.postmortem.jobrun import _torch_version
        v = _torch_version()
        print(v, "torch" in sys.modules, "importlib.metadata" in sys.modules, "psutil" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=8, check=False).stdout.split(")")
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    assert out[0] == f"({major}, {minor}"
    assert out[1].split() == ["False", "False", "False"]


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_the_command_exits_with_its_code_after_the_exit_handlers(tmp_path):
    plugin = tmp_path / "exit_probe.py"
    plugin.write_text(textwrap.dedent(f"""
        import atexit
        atexit.register(lambda: open({str(tmp_path / 'ran')!r}, "w").close())
        CHECKS = []
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "DDPDOCTOR_PLUGINS": "exit_probe"}
    p = subprocess.run([sys.executable, "-m", "ddpdoctor", "check", "--only", "nope"], env=env,
                       capture_output=True, text=True, timeout=25, check=False)
    assert p.returncode == 2 and "no check named 'nope'" in p.stderr
    assert (tmp_path / "ran").exists()


@pytest.mark.timeout(20)
def test_a_crowded_cpu_node_pins_each_rank_to_one_core():
    code = textwrap.dedent("""
        import os, sys
        from ddpdoctor.runner.worker import pin_crowded
        cores = [0, 1]  # as if the node had two cores
        os.sched_setaffinity(0, {0})  # every test machine has core 0
        print(pin_crowded(0, 4, "gloo", cores), pin_crowded(0, 16, "nccl", cores), pin_crowded(2, 16, "gloo", [0]),
              sorted(os.sched_getaffinity(0)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=15, check=False)
    # 2 ranks per core: left alone; NCCL ranks: left alone; 16 on one core: pinned to it
    assert out.stdout.split() == ["False", "False", "True", "[0]"], out.stderr
