"""load_checkpoint: CPU by default, weights_only by default, loud on missing files."""

from __future__ import annotations

import collections
import os
import pickle
import random

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
    with pytest.raises(CheckpointError, match=r"was refused, not damaged") as info:
        load_checkpoint(path)
    assert info.value.reference == "checkpoint-not-weights-only"
    assert f"this file names {__name__}._Custom" in info.value.message
    assert "if you trust the file (you wrote it)" in info.value.hint and "add_safe_globals" in info.value.hint
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


class _Opens:
    """Unpickling this calls open(marker, "w"): proof that a refused file ran nothing."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _bad_files(tmp_path):
    """name -> (path, reference, words the message must hold), for every kind of file that is no checkpoint."""
    good = tmp_path / "good.pt"
    torch.save({"w": torch.arange(1000.0)}, good)
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.arange(1000.0)}, legacy, _use_new_zipfile_serialization=False)
    marker = str(tmp_path / "ran")
    files = {
        "csv": (b"epoch,loss\n1,0.5\n2,0.4\n", "checkpoint-corrupt", "it is not a torch.save file (it starts with b'epoch,"),
        "empty": (b"", "checkpoint-corrupt", "the file is empty (0 bytes)"),
        "truncated-zip": (good.read_bytes()[:500], "checkpoint-corrupt", "a damaged or cut-short zip archive (500 bytes)"),
        "truncated-legacy-pickle": (legacy.read_bytes()[:150], "checkpoint-corrupt", "its pickle is cut short"),
        "truncated-legacy-data": (legacy.read_bytes()[:-100], "checkpoint-corrupt", "its tensor data is cut short"),
        "random": (bytes(random.Random(7).randrange(256) for _ in range(4096)), "checkpoint-corrupt",
                   "it is not a torch.save file"),
        "unsafe-pickle-protocol-2": (pickle.dumps({"x": _Opens(marker)}, protocol=2), "checkpoint-not-weights-only",
                                     "was refused, not damaged: weights_only=True loads only tensors, primitive types "
                                     "and allow-listed classes, and this file names io.open"),
        "unsafe-pickle-protocol-5": (pickle.dumps({"x": _Opens(marker)}, protocol=5), "checkpoint-not-weights-only",
                                     "this file names io.open"),
    }
    out = {}
    for name, (data, reference, words) in files.items():
        path = tmp_path / f"{name}.pt"
        path.write_bytes(data)
        out[name] = (path, reference, words)
    unsafe_zip = tmp_path / "unsafe-zip.pt"
    torch.save({"x": _Opens(marker)}, unsafe_zip)
    out["unsafe-torch-save"] = (unsafe_zip, "checkpoint-not-weights-only", "this file names io.open")
    out["directory"] = (tmp_path, "checkpoint-is-directory", "is a directory, not a checkpoint file")
    out["missing"] = (tmp_path / "nope.pt", "checkpoint-missing", "found no checkpoint file at")
    return out, marker


@pytest.mark.timeout(60)
def test_every_bad_file_is_a_checkpoint_error_that_says_what_it_is(tmp_path):
    # A CSV used to raise a raw IndexError (weights_only) or UnpicklingError; an unsafe pickle was
    # refused but called "corrupt or truncated". Each row: the one error, its reference, its words.
    files, marker = _bad_files(tmp_path)
    for name, (path, reference, words) in files.items():
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(path)
        error = info.value
        assert (error.reference, words in error.message) == (reference, True), (name, error.one_line())
        assert repr(str(path)) in error.message and error.message.startswith("rank 0")
        assert "\x1b" not in error.one_line() and "\n" not in error.one_line()
        if reference == "checkpoint-corrupt":
            assert "written completely" in error.hint
        if reference == "checkpoint-not-weights-only":
            assert "add_safe_globals" in error.hint and "weights_only=False" in error.hint
            assert "never for a file from elsewhere" in error.hint
    assert not os.path.exists(marker)  # refused means refused: nothing in those files ran
    # The same files without weights_only: still one CheckpointError each (never a raw IndexError/KeyError).
    for name in ("csv", "empty", "truncated-zip", "truncated-legacy-pickle", "truncated-legacy-data", "random"):
        path, reference, words = files[name]
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(path, weights_only=False)
        assert (info.value.reference, words in info.value.message) == (reference, True), (name, info.value.one_line())


@pytest.mark.timeout(30)
def test_a_plain_pickle_and_a_missing_class_are_named_as_such(tmp_path):
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps({"a": 1}))
    for weights_only in (True, False):
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(plain, weights_only=weights_only)
        assert info.value.reference == "checkpoint-unloadable"
        assert info.value.message.endswith("it is a plain pickle (pickle.dump), not a torch.save file")
    missing_class = tmp_path / "class.pt"
    missing_class.write_bytes(pickle.dumps(_Custom(1), protocol=2).replace(b"_Custom", b"_Gone__"))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(missing_class, weights_only=True)
    assert info.value.reference == "checkpoint-not-weights-only" and "_Gone__" in info.value.message
