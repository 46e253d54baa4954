"""Loading MODEL specs: the three spec forms, KernelBench files, and each bad input as UsageError."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kforge_tui.errors import UsageError
from kforge_tui.workload.loader import LoadedModel, load_model

FIX = Path(__file__).parent / "fixtures" / "models"


def test_file_with_build_gets_device_and_eval_mode():
    lm = load_model(str(FIX / "tiny.py"))
    assert isinstance(lm, LoadedModel)
    assert lm.device == "cpu" and not lm.model.training
    assert isinstance(lm.example_inputs, tuple) and len(lm.example_inputs) == 2
    out = lm.run()
    assert out.shape == (2, 6) and torch.isfinite(out).all()
    assert not torch.is_inference_mode_enabled()  # run() leaves no global state behind


def test_file_colon_callable_with_dict_inputs_and_without_device_param():
    kw = load_model(f"{FIX / 'tiny.py'}:build_kwargs")
    assert isinstance(kw.example_inputs, dict) and set(kw.example_inputs) == {"img", "tokens"}
    plain = load_model(f"{FIX / 'tiny.py'}:make")  # make() takes no device argument
    assert torch.equal(kw.run(), plain.run())  # same seed, same model: kwargs map to the same args


def test_package_module_callable(monkeypatch):
    monkeypatch.syspath_prepend(str(FIX))
    lm = load_model("fixture_pkg.small:build")
    assert lm.run().shape == (3, 8)


def test_kernelbench_file_uses_init_inputs():
    lm = load_model(str(FIX / "kernelbench_softmax.py"))
    assert lm.model.dim == 1  # from get_init_inputs()
    (x,) = lm.example_inputs
    assert x.shape == (16, 256)
    assert torch.allclose(lm.run().sum(1), torch.ones(16))


def test_relative_path_and_same_stem_files_do_not_collide(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, width in ((a, 3), (b, 5)):
        d.mkdir()
        (d / "model.py").write_text(
            "import torch\n"
            f"def build():\n    return torch.nn.Linear({width}, 1), (torch.randn(2, {width}),)\n")
    monkeypatch.chdir(tmp_path)
    assert load_model("a/model.py").model.in_features == 3
    assert load_model("b/model.py").model.in_features == 5


@pytest.mark.parametrize("spec, needle", [
    ("tests/fixtures/models/does_not_exist.py", "model file not found"),
    ("syntax_error.py", "syntax_error.py:4: syntax error"),
    ("raises_in_build.py", "RuntimeError: weights not found at /nowhere/model.safetensors"),
    ("wrong_return.py", "must return (model, example_inputs), got a Linear"),
    ("wrong_return.py:not_a_module", "model a torch.nn.Module, got a str"),
    ("wrong_return.py:nope", "has no callable 'nope'"),
    ("not_kernelbench.py", "is not a KernelBench file (missing Model, get_inputs)"),
    ("no.such.module:build", "cannot import module 'no.such.module'"),
    ("justaword", "neither a .py file nor package.module:callable"),
    ("tiny.py:", "name the callable"),
])
def test_bad_specs_are_one_line_usage_errors(spec, needle):
    if not spec.startswith("tests/") and (".py" in spec):
        spec = str(FIX / spec)
    with pytest.raises(UsageError) as ei:
        load_model(spec)
    msg = str(ei.value)
    assert needle in msg
    assert "\n" not in msg


def test_forward_that_raises_is_a_usage_error():
    lm = load_model(str(FIX / "forward_raises.py"))  # loading is fine; the forward is not
    with pytest.raises(UsageError, match=r"forward raised RuntimeError: .*shapes cannot be multiplied"):
        lm.run()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_gpu_is_a_usage_error():
    with pytest.raises(UsageError, match="no CUDA GPU is visible"):
        load_model(str(FIX / "tiny.py"), device="cuda")


@pytest.mark.gpu
def test_cuda_moves_model_and_inputs():
    lm = load_model(str(FIX / "tiny.py"), device="cuda")
    assert next(lm.model.parameters()).is_cuda
    assert all(t.is_cuda for t in lm.example_inputs)
    assert lm.run().is_cuda
