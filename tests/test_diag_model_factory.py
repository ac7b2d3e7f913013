"""Loading the user's model factory and input shape: clear errors, never tracebacks."""

from __future__ import annotations

import textwrap

import pytest
import torch

from ddpdoctor.errors import UsageError
from ddpdoctor.diagnostics.model_factory import (BUILTIN_INPUT_SHAPE, TinyConvNet, build_model, forward_loss,
                                                 guess_input_shape, load_model, parse_input_shape)
from worlds import run_world


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    (tmp_path / "diag_user_models.py").write_text(textwrap.dedent("""
        import torch
        NOT_CALLABLE = 3
        def good():
            return torch.nn.Sequential(torch.nn.Linear(5, 2))
        def needs_args(width):
            return torch.nn.Linear(width, 2)
        def not_a_module():
            return {"weights": 1}
        class Nested:
            @staticmethod
            def build():
                return torch.nn.Conv1d(4, 2, 3)
    """))
    (tmp_path / "diag_broken_models.py").write_text("import not_a_real_package_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "diag_user_models"


@pytest.mark.parametrize("spec, reference, named", [
    ("diag_user_models", "bad-model-spec", "'diag_user_models'"),
    ("a:b:c", "bad-model-spec", "'a:b:c'"),
    (":good", "bad-model-spec", "':good'"),
    ("diag_broken_models:good", "model-import-failed", "not_a_real_package_xyz"),
    ("no_such_module_xyz:f", "model-import-failed", "no_such_module_xyz"),
    ("diag_user_models:missing", "model-factory-missing", "'missing'"),
    ("diag_user_models:NOT_CALLABLE", "model-factory-not-callable", "int"),
    ("diag_user_models:needs_args", "model-factory-failed", "TypeError"),
    ("diag_user_models:not_a_module", "model-not-module", "dict"),
])
def test_bad_factories_are_usage_errors_that_name_the_value_and_the_fix(user_models, spec, reference, named):
    with pytest.raises(UsageError) as info:
        build_model(spec)
    err = info.value
    assert err.reference == reference
    assert named in err.message and err.hint
    assert "Traceback" not in err.one_line()


@pytest.mark.timeout(30)
def test_good_factories_and_shapes(user_models):
    assert isinstance(build_model("diag_user_models:good"), torch.nn.Sequential)
    assert isinstance(build_model("diag_user_models:Nested.build"), torch.nn.Conv1d)
    loaded = load_model({"model": "diag_user_models:good"})
    assert loaded.input_shape == (4, 5) and not loaded.builtin
    loaded = load_model({"model": "diag_user_models:good", "input_shape": "2,5"})
    assert loaded.input_shape == (2, 5)
    builtin = load_model({})
    assert builtin.builtin and isinstance(builtin.module, TinyConvNet)
    assert builtin.input_shape == BUILTIN_INPUT_SHAPE
    # A forward runs OpenMP threads; run it in a child, never in the pytest process that forks
    # the gloo worlds of later tests (libgomp's thread pool does not survive fork).
    dims = run_world(lambda rank, world: forward_loss(builtin.module, torch.randn(BUILTIN_INPUT_SHAPE)).dim(),
                     1, backend=None, timeout=20)
    assert dims == [0]
    assert guess_input_shape(torch.nn.Embedding(3, 3)) is None


@pytest.mark.parametrize("text, shape", [("8,3,32,32", (8, 3, 32, 32)), (" 4, 5 ", (4, 5)),
                                         ("8x3x32x32", (8, 3, 32, 32)), ((2, 3), (2, 3)), (None, None)])
def test_parse_input_shape(text, shape):
    assert parse_input_shape(text) == shape


@pytest.mark.parametrize("text", ["", "8,,3", "a,b", "8,-1", "0", "1.5,2"])
def test_bad_input_shapes_name_the_value(text):
    with pytest.raises(UsageError) as info:
        parse_input_shape(text)
    assert info.value.reference == "bad-input-shape" and repr(text) in info.value.message
    assert "--input-shape 8,3,32,32" in info.value.hint
