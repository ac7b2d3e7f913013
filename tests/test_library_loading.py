"""load_checkpoint: CPU by default, weights_only by default, loud on missing files."""

from __future__ import annotations

import collections

import pytest
import torch

from ddpdoctor.training import CheckpointError, load_checkpoint
from worlds import run_world


class _Custom:
    def __init__(self, value):
        self.value = value


@pytest.mark.timeout(30)
def test_loads_tensors_onto_the_cpu_by_default(tmp_path):
    path = tmp_path / "ckpt.pt"
    state = {"model": collections.OrderedDict(w=torch.arange(4.0)), "step": 7}
    torch.save(state, path)
    loaded = load_checkpoint(path)
    assert loaded["step"] == 7
    assert torch.equal(loaded["model"]["w"], torch.arange(4.0)) and loaded["model"]["w"].device.type == "cpu"
    own = load_checkpoint(str(path), map_location="rank")  # no CUDA here: this rank's own device is the CPU
    assert own["model"]["w"].device == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))


@pytest.mark.timeout(30)
def test_refuses_arbitrary_objects_unless_asked(tmp_path):
    path = tmp_path / "pickle.pt"
    torch.save({"obj": _Custom(3)}, path)
    with pytest.raises(CheckpointError, match=r"weights_only=True refuses") as info:
        load_checkpoint(path)
    assert info.value.reference == "checkpoint-not-weights-only"
    assert "weights_only=False only if you trust the file" in info.value.hint
    assert load_checkpoint(path, weights_only=False)["obj"].value == 3


@pytest.mark.timeout(30)
def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.pt"
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(missing)
    assert info.value.message == f"rank 0 found no checkpoint file at {str(missing)!r}"


def _load_everywhere(rank, world, path):
    t = load_checkpoint(path)["w"]
    return t.device.type, t.tolist()


@pytest.mark.timeout(60)
def test_every_rank_loads_to_its_cpu(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save({"w": torch.tensor([1.5, 2.5])}, path)
    assert run_world(_load_everywhere, 2, str(path), timeout=30) == [("cpu", [1.5, 2.5])] * 2


@pytest.mark.timeout(30)
def test_unreadable_files_name_the_file_the_rank_and_the_fix(tmp_path):
    # The failures people hit with torch.load on every rank: a truncated copy, a file that is not a
    # checkpoint, a directory (a sharded checkpoint) instead of a file.
    good = tmp_path / "good.pt"
    torch.save({"w": torch.arange(1000.0)}, good)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[:500])
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint")
    for path in (cut, text):
        for weights_only in (True, False):
            with pytest.raises(CheckpointError) as info:
                load_checkpoint(path, weights_only=weights_only)
            assert info.value.reference == "checkpoint-corrupt", info.value.one_line()
            assert info.value.message.startswith("rank 0 could not ") and repr(str(path)) in info.value.message
            assert "written completely" in info.value.hint
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    assert info.value.reference == "checkpoint-is-directory"
    assert info.value.message == f"rank 0: {str(tmp_path)!r} is a directory, not a checkpoint file"
