"""The checks sampler, param-sync and bn-sync, run on every rank of real gloo worlds and merged."""

from __future__ import annotations

import textwrap

import pytest
import torch.distributed as dist

from ddpdoctor.check import Requirements
from ddpdoctor.result import Status
from diag_support import load_check_module, rank_context, world_info
from worlds import run_world

sampler_mod = load_check_module("sampler")
param_mod = load_check_module("param_sync")
bn_mod = load_check_module("bn_sync")
ALL = (sampler_mod.SamplerCheck, param_mod.ParamSyncCheck, bn_mod.BnSyncCheck)


def _run_checks(rank: int, world: int, options: dict, classes=ALL) -> list:
    ctx = rank_context(rank, world, options)
    return [cls().run(ctx) for cls in classes]


def _merged(results: list, world: int, options: dict, classes=ALL) -> dict:
    return {cls.name: cls().merge([per_rank[i] for per_rank in results], world_info(world, options))
            for i, cls in enumerate(classes)}


def test_check_declarations():
    assert [c.name for c in ALL] == ["sampler", "param-sync", "bn-sync"]
    for cls in ALL:
        assert cls.requires == Requirements(min_world_size=2, process_group=True)
        assert cls.description and cls.requires.unmet(world_info(1)) == "needs 2 ranks, found 1"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_builtin_model_and_dataset_pass_and_explain_the_pitfalls(world):
    merged = _merged(run_world(_run_checks, world, {}, timeout=80), world, {})
    for name, result in merged.items():
        assert result.status == Status.PASS, (name, result.summary, result.outcomes)
        assert len(result.outcomes) == world
    n = 5 * world + 1
    sampler = merged["sampler"]
    assert sampler.summary.startswith(f"built-in dataset on this world: {n} samples over {world} ranks: shards "
                                      "disjoint and complete")
    assert sampler.summary.endswith("(your job's own sampler: run it under ddpdoctor run)")
    assert "set_epoch(epoch)" in sampler.summary and sampler.hint.startswith("call sampler.set_epoch(epoch)")
    details = sampler.outcomes[0].details
    assert any("repeats the first pass's order; after set_epoch(1) it changes" in d for d in details)
    assert any(d.startswith("ddpdoctor.guard_sampler(sampler) warned") for d in details)
    data = sampler.outcomes[0].data
    assert data["padding"] == world - 1 and data["dropped"] == 1 and data["repeats_without_set_epoch"]

    param = merged["param-sync"]
    assert param.summary == ("built-in model on this world: rank-dependent init caught (4 tensors differ, e.g. param:conv1.weight); "
                             "DDP construction synced them; in sync after 2 optimizer steps, "
                             "gradients match")
    # BatchNorm weights start at 1 and biases at 0 whatever the seed: only these four differ
    assert param.outcomes[0].data["init_desync"] == ["param:conv1.weight", "param:conv2.weight",
                                                     "param:head.weight", "param:head.bias"]
    assert param.outcomes[0].data["unused"] == []

    bn = merged["bn-sync"]
    assert bn.summary.startswith("built-in model on this world: 2 BatchNorm layers not SyncBatchNorm; running "
                                 "stats diverge up to")
    assert "sync_bn_stats equalized them" in bn.summary and "convert_sync_batchnorm" in bn.hint
    assert set(bn.outcomes[0].data["divergence"]) == {"bn1", "bn2"}
    assert bn.outcomes[0].data["divergence_after_sync"] == 0.0


USER_MODELS = """
import torch
import torch.distributed as dist

class WithUnused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.norm = torch.nn.BatchNorm1d(6)
        self.spare = torch.nn.Linear(6, 3)  # never called in forward
    def forward(self, x):
        return self.norm(self.fc(x))

class Drifts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 2)
    def forward(self, x):
        if dist.get_rank() == 1:
            with torch.no_grad():
                self.fc.weight.add_(1e-3)  # a rank-dependent in-place update: silent desync
        return self.fc(x)

def with_unused():
    return WithUnused()

def no_batchnorm():
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))

def drifts():
    return Drifts()

def broken():
    raise RuntimeError("checkpoint not found: /nope.pt")

def breaks_on_rank_one():
    if dist.get_rank() == 1:
        raise FileNotFoundError("weights.pt")
    return torch.nn.Linear(3, 3)

def wider_on_rank_one():
    return torch.nn.Linear(3, 4 if dist.get_rank() == 1 else 3)

class ForwardBreaksOnRankOne(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.bn = torch.nn.BatchNorm1d(3)
    def forward(self, x):
        if dist.get_rank() == 1:
            raise ValueError("shape mismatch on this node")
        return self.bn(self.fc(x))
"""


def _user_world(rank: int, world: int) -> dict:
    out = {}
    out["unused"] = _run_checks(rank, world, {"model": "diag_check_models:with_unused"},
                                (param_mod.ParamSyncCheck, bn_mod.BnSyncCheck))
    out["plain"] = _run_checks(rank, world, {"model": "diag_check_models:no_batchnorm",
                                             "input_shape": "4,4"},
                               (param_mod.ParamSyncCheck, bn_mod.BnSyncCheck))
    out["drifts"] = _run_checks(rank, world, {"model": "diag_check_models:drifts"},
                                (param_mod.ParamSyncCheck,))
    out["broken"] = _run_checks(rank, world, {"model": "diag_check_models:broken"},
                                (param_mod.ParamSyncCheck, bn_mod.BnSyncCheck))
    out["one_rank"] = _run_checks(rank, world, {"model": "diag_check_models:breaks_on_rank_one"},
                                  (param_mod.ParamSyncCheck, bn_mod.BnSyncCheck))
    out["one_forward"] = _run_checks(rank, world, {"model": "diag_check_models:ForwardBreaksOnRankOne"},
                                     (param_mod.ParamSyncCheck, bn_mod.BnSyncCheck))
    out["wider"] = _run_checks(rank, world, {"model": "diag_check_models:wider_on_rank_one"},
                               (param_mod.ParamSyncCheck,))
    out["bad_shape"] = _run_checks(rank, world, {"model": "diag_check_models:no_batchnorm",
                                                 "input_shape": "4,x"}, (param_mod.ParamSyncCheck,))

    # A sampler built with a rank-dependent seed: the sampler check must fail and say why.
    real = sampler_mod.DistributedSampler

    class SeededByRank(real):
        def __init__(self, *args, **kwargs):
            kwargs["seed"] = kwargs.get("seed", 0) + rank
            super().__init__(*args, **kwargs)

    sampler_mod.DistributedSampler = SeededByRank
    try:
        out["sampler"] = _run_checks(rank, world, {}, (sampler_mod.SamplerCheck,))
    finally:
        sampler_mod.DistributedSampler = real
    return out


@pytest.mark.timeout(90)
def test_user_models_and_broken_setups_are_caught_and_named(tmp_path, monkeypatch):
    (tmp_path / "diag_check_models.py").write_text(textwrap.dedent(USER_MODELS))
    monkeypatch.syspath_prepend(str(tmp_path))
    results = run_world(_user_world, 2, timeout=80)

    def merged(key, classes):
        return _merged([r[key] for r in results], 2, {}, classes)

    got = merged("unused", (param_mod.ParamSyncCheck, bn_mod.BnSyncCheck))
    param = got["param-sync"]
    assert param.status == Status.FAIL and param.finding == "unused-parameters"
    assert param.summary == "2 parameters get no gradient: spare.weight, spare.bias"
    assert "find_unused_parameters=True" in param.hint and "prior iteration" in param.hint
    assert "freeze" in param.hint and "stop creating" in param.hint and "costs" in param.hint
    bn = got["bn-sync"]
    assert bn.status == Status.WARN and bn.finding == "bn-stats-diverge"
    assert "1 BatchNorm layer not SyncBatchNorm" in bn.summary and "(norm)" in bn.summary
    assert bn.hint.startswith("Convert with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)")

    got = merged("plain", (param_mod.ParamSyncCheck, bn_mod.BnSyncCheck))
    assert got["param-sync"].status == Status.PASS, got["param-sync"].summary
    assert got["bn-sync"].status == Status.SKIP
    assert "has no BatchNorm layers" in got["bn-sync"].summary

    drift = merged("drifts", (param_mod.ParamSyncCheck,))["param-sync"]
    assert drift.status == Status.FAIL and drift.finding == "param-desync-after-step", drift.summary
    assert "param:fc.weight" in drift.summary and drift.hint

    got = merged("broken", (param_mod.ParamSyncCheck, bn_mod.BnSyncCheck))
    for result in got.values():
        assert result.status == Status.FAIL and result.finding == "model-factory-failed"
        assert "RuntimeError: checkpoint not found: /nope.pt" in result.summary
        assert "Traceback" not in result.summary and result.hint
    for key, rank_one in (("one_rank", "model-factory-failed"), ("one_forward", "model-forward-failed")):
        for i in range(2):
            finding_0, finding_1 = results[0][key][i].finding, results[1][key][i].finding
            assert (finding_0, finding_1) == ("model-failed-on-other-rank", rank_one), (key, i)
        assert "rank 1 could not" in results[0][key][0].summary
    assert "FileNotFoundError: weights.pt" in results[1]["one_rank"][0].summary
    assert "ValueError: shape mismatch on this node" in results[1]["one_forward"][1].summary
    wider = merged("wider", (param_mod.ParamSyncCheck,))["param-sync"]
    assert wider.status == Status.FAIL and wider.finding == "model-structure-differs"
    assert wider.summary.endswith("param:weight, param:bias")
    shape = merged("bad_shape", (param_mod.ParamSyncCheck,))["param-sync"]
    assert shape.finding == "bad-input-shape" and "'4,x'" in shape.summary

    sampler = merged("sampler", (sampler_mod.SamplerCheck,))["sampler"]
    assert sampler.status == Status.FAIL and sampler.finding == "sampler-seed-mismatch", sampler.summary
    assert sampler.summary.startswith("ranks shuffle with different seeds (rank 0: 0, rank 1: 1)")
    assert sampler.hint == "pass the same seed to DistributedSampler on every rank"


def _lazy_world(rank: int, world: int, store_path: str) -> tuple:
    store = dist.FileStore(store_path, world)
    ctx = rank_context(rank, world, {}, store=store)
    outcome = sampler_mod.SamplerCheck().run(ctx)
    return outcome, dist.is_initialized(), ctx.pg_init_seconds is not None


@pytest.mark.timeout(60)
def test_checks_initialize_the_process_group_lazily(tmp_path):
    results = run_world(_lazy_world, 2, str(tmp_path / "store"), backend=None, timeout=50)
    for outcome, initialized, timed in results:
        assert outcome.status == Status.PASS and initialized and timed


SYNC_BN_MODELS = """
import torch

def only_sync():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.SyncBatchNorm(4), torch.nn.ReLU())

def one_tensor():
    return torch.nn.Linear(3, 3, bias=False)

def mixed():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.SyncBatchNorm(4), torch.nn.ReLU(),
                               torch.nn.Conv2d(4, 4, 3), torch.nn.BatchNorm2d(4))
"""


def _sync_bn_world(rank: int, world: int) -> dict:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from ddpdoctor.diagnostics.model_factory import forward_failed

    out = {"only": _run_checks(rank, world, {"model": "diag_sync_models:only_sync"},
                               (param_mod.ParamSyncCheck, bn_mod.BnSyncCheck)),
           "mixed": _run_checks(rank, world, {"model": "diag_sync_models:mixed"},
                                (param_mod.ParamSyncCheck, bn_mod.BnSyncCheck)),
           "one": _run_checks(rank, world, {"model": "diag_sync_models:one_tensor"}, (param_mod.ParamSyncCheck,))}
    ctx = rank_context(rank, world, {})
    # the errors torch raises for SyncBatchNorm on CPU, for real: at DDP construction, in forward
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.SyncBatchNorm(4))
    for step in ("ddp", "forward"):
        try:
            if step == "ddp":
                DistributedDataParallel(model)
            else:
                model(torch.randn(2, 3, 8, 8))
        except Exception as exc:  # noqa: BLE001
            out[step] = forward_failed(ctx, exc, (2, 3, 8, 8), [], {})
    return out


@pytest.mark.timeout(90)
def test_sync_batchnorm_on_cpu_names_the_real_cause(tmp_path, monkeypatch):
    (tmp_path / "diag_sync_models.py").write_text(textwrap.dedent(SYNC_BN_MODELS))
    monkeypatch.syspath_prepend(str(tmp_path))
    results = run_world(_sync_bn_world, 2, timeout=80)
    got = _merged([r["only"] for r in results], 2, {}, (param_mod.ParamSyncCheck, bn_mod.BnSyncCheck))
    param = got["param-sync"]
    assert param.status == Status.WARN and param.finding == "sync-batchnorm-needs-gpu", param.summary
    assert param.summary.startswith("SyncBatchNorm needs GPU modules: on CPU, 1 SyncBatchNorm layer (1) "
                                    "ran as plain BatchNorm; otherwise rank-dependent init caught")
    assert "run ddpdoctor check on GPUs" in param.hint and "--input-shape" not in param.hint
    assert got["bn-sync"].status == Status.SKIP
    assert "SyncBatchNorm needs GPU modules" in got["bn-sync"].summary
    got = _merged([r["mixed"] for r in results], 2, {}, (param_mod.ParamSyncCheck, bn_mod.BnSyncCheck))
    assert got["param-sync"].finding == "sync-batchnorm-needs-gpu"
    bn = got["bn-sync"]
    assert bn.outcomes[0].data["layers"] == ["4"] and bn.outcomes[0].data["sync_batchnorm_reverted"] == ["1"]
    one = _merged([r["one"] for r in results], 2, {}, (param_mod.ParamSyncCheck,))["param-sync"]
    assert one.summary.startswith("rank-dependent init caught (1 tensor differs, e.g. param:weight)"), one.summary
    assert one.summary.endswith("in a DDP the check built: your training loop is not judged (never wrapped in DDP, "
                                "modules attached after wrapping, seeds): run the job under ddpdoctor run")
    assert "rank-dependent init without DDP: caught 1 differing tensor (param:weight)" in one.outcomes[0].details
    for out in results:
        for step, torch_text in (("ddp", "SyncBatchNorm layers only work with GPU modules"),
                                 ("forward", "SyncBatchNorm expected input tensor to be on GPU")):
            outcome = out[step]
            assert outcome.finding == "sync-batchnorm-needs-gpu", (step, outcome.summary)
            assert outcome.summary.startswith("SyncBatchNorm needs GPU modules: ") and torch_text in outcome.summary
            assert "--input-shape" not in outcome.hint


def test_counts_read_right():
    from ddpdoctor.result import count

    assert [count(n, "tensor") for n in (0, 1, 2)] == ["0 tensors", "1 tensor", "2 tensors"]
    assert count(1, "pass", "passes") == "1 pass" and count(3, "pass", "passes") == "3 passes"
