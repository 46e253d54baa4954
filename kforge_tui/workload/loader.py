"""Load a MODEL spec (DESIGN.md) into a model on a device plus the inputs of one forward.

Three spellings: `path/file.py:callable`, `path/file.py` (its `build()`, else the KernelBench
convention `Model` / `get_inputs()` / `get_init_inputs()`), and `package.module:callable`.
The user's file is imported as it is, never edited or copied. Anything that goes wrong in the
user's code becomes a one-line `UsageError` (exit 2) that says what failed and where, because a
traceback from someone else's model is noise to the person running `kforge`.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kforge_tui.device import resolve_backend
from kforge_tui.errors import UsageError


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """`Type: message` squeezed onto one line, so errors from user code stay one line."""
    msg = " ".join(str(exc).split())
    if len(msg) > limit:
        msg = msg[: limit - 3] + "..."
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


@dataclass
class LoadedModel:
    """A model in eval mode on `device` and the inputs of one representative forward."""

    model: Any  # torch.nn.Module
    example_inputs: tuple | dict
    spec: str
    device: str

    def run(self):
        """One forward under inference_mode; an exception in the model becomes a UsageError."""
        import torch

        try:
            with torch.inference_mode():
                if isinstance(self.example_inputs, dict):
                    return self.model(**self.example_inputs)
                return self.model(*self.example_inputs)
        except UsageError:
            raise
        except Exception as exc:  # user code: report it, do not crash with its traceback
            raise UsageError(f"{self.spec}: the model's forward raised {_one_line(exc)}") from exc


# ------------------------------------------------------------------------------ spec parsing

def _split_spec(spec: str) -> tuple[str, str | None, str | None]:
    """-> (kind, target, callable name); kind is "file" or "module"."""
    if not spec or not spec.strip():
        raise UsageError("empty MODEL spec; give path/file.py, path/file.py:callable or "
                         "package.module:callable")
    spec = spec.strip()
    path_part, sep, attr = spec.rpartition(":")
    if not sep:
        path_part, attr = spec, None
    elif not attr:
        raise UsageError(f"MODEL spec {spec!r} ends with ':'; name the callable after it")
    if path_part.endswith(".py") or "/" in path_part or "\\" in path_part:
        return "file", path_part, attr
    if attr is None:
        raise UsageError(f"MODEL spec {spec!r} is neither a .py file nor package.module:callable")
    return "module", path_part, attr


def _import_file(path_str: str):
    path = Path(path_str).expanduser()
    if not path.exists():
        raise UsageError(f"model file not found: {path_str}")
    if not path.is_file():
        raise UsageError(f"model path is not a file: {path_str}")
    path = path.resolve()
    # A unique module name per path: two sample files with the same stem must not collide.
    mod_name = f"kforge_user_model_{abs(hash(str(path))):x}"
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read model file {path_str}: {_one_line(exc)}") from exc
    try:
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise UsageError(f"{path_str}:{exc.lineno}: syntax error: {exc.msg}") from exc
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    # The file's folder goes on sys.path while it imports, so it can import its neighbours.
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(mod_name, None)
        raise UsageError(f"{path_str}: importing it raised {_one_line(exc)}") from exc
    finally:
        try:
            sys.path.remove(str(path.parent))
        except ValueError:
            pass
    return module


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise UsageError(f"cannot import module {name!r}: {_one_line(exc)}") from exc
    except SyntaxError as exc:
        raise UsageError(f"{exc.filename}:{exc.lineno}: syntax error: {exc.msg}") from exc
    except (Exception, SystemExit) as exc:
        raise UsageError(f"importing module {name!r} raised {_one_line(exc)}") from exc


def _call(fn: Callable, label: str, device: str, *args):
    """Call user code, passing device= when it takes one; its exceptions become UsageError."""
    kwargs = {}
    try:
        sig = inspect.signature(fn)
        if "device" in sig.parameters or any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            kwargs["device"] = device
    except (TypeError, ValueError):
        pass
    try:
        return fn(*args, **kwargs)
    except (Exception, SystemExit) as exc:
        raise UsageError(f"{label} raised {_one_line(exc)}") from exc


def _check_build_result(result, label: str):
    import torch

    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise UsageError(f"{label} must return (model, example_inputs), got {_describe(result)}")
    model, inputs = result
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{label} must return (model, example_inputs) with model a torch.nn.Module, "
                         f"got {_describe(model)}")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif isinstance(inputs, list):
        inputs = tuple(inputs)
    elif not isinstance(inputs, (tuple, dict)):
        raise UsageError(f"{label} must return example_inputs as a tuple of args or a dict of "
                         f"kwargs, got {_describe(inputs)}")
    return model, inputs


def _describe(x) -> str:
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of length {len(x)}"
    return f"a {type(x).__name__}"


def _kernelbench(module, path: str, device: str):
    """KernelBench files: Model(*get_init_inputs()) and get_inputs() (a list of args)."""
    missing = [n for n in ("Model", "get_inputs") if not hasattr(module, n)]
    if missing:
        raise UsageError(f"{path} has no build() and is not a KernelBench file (missing "
                         f"{', '.join(missing)}); define build() -> (model, example_inputs) "
                         "or use path/file.py:callable")
    init = _call(module.get_init_inputs, f"{path}: get_init_inputs()", device) \
        if hasattr(module, "get_init_inputs") else []
    if not isinstance(init, (list, tuple)):
        raise UsageError(f"{path}: get_init_inputs() must return a list, got {_describe(init)}")
    model = _construct(module.Model, init, path)
    inputs = _call(module.get_inputs, f"{path}: get_inputs()", device)
    return _check_build_result((model, inputs), f"{path}: Model/get_inputs()")


def _construct(cls, init, path):
    # Model(...) is called without device=: KernelBench models take only their init inputs.
    try:
        return cls(*init)
    except (Exception, SystemExit) as exc:
        raise UsageError(f"{path}: Model(*get_init_inputs()) raised {_one_line(exc)}") from exc


def _to_device(obj, device: str):
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple):
        return tuple(_to_device(o, device) for o in obj)
    if isinstance(obj, list):
        return [_to_device(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def load_model(spec: str, device: str = "cpu") -> LoadedModel:
    """Resolve a MODEL spec, build the model, move it and its inputs to `device`, eval mode."""
    backend = resolve_backend(device)
    kind, target, attr = _split_spec(spec)
    if kind == "file":
        module = _import_file(target)
        where = target
    else:
        module = _import_module(target)
        where = target
    if attr is not None:
        fn = getattr(module, attr, None)
        if fn is None or not callable(fn):
            raise UsageError(f"{where} has no callable {attr!r}")
        label = f"{where}:{attr}()"
        model, inputs = _check_build_result(_call(fn, label, backend), label)
    elif callable(getattr(module, "build", None)):
        label = f"{where}: build()"
        model, inputs = _check_build_result(_call(module.build, label, backend), label)
    else:
        model, inputs = _kernelbench(module, where, backend)
    try:
        model = model.to(backend)
        inputs = _to_device(inputs, backend)
    except Exception as exc:
        raise UsageError(f"{spec}: moving the model to {backend} raised {_one_line(exc)}") from exc
    model.eval()
    return LoadedModel(model=model, example_inputs=inputs, spec=spec, device=backend)
