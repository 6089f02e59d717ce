"""What `dycl-jax convert TARGET` names: an example file, `path.py:FACTORY` or `MODULE:FACTORY`.

FACTORY is a function returning a model, or `(model, args)` as the example files' `example()`
does, or an `nn.Module` class that takes no required arguments. Every problem with the target
itself is a `UsageError` (exit status 3), never a traceback.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from dycl_jax.errors import UsageError

DEFAULT_FN = "example"


@dataclass
class Target:
    """The loaded model; `args` when the factory gave example arguments too."""

    model: Any
    args: tuple | None
    module: Any  # the imported module (its `inputs(n[, seed])`, if any, gives --check inputs)
    name: str  # as the user wrote it


def _split(spec: str) -> tuple[str, str | None]:
    head, sep, tail = spec.rpartition(":")
    if sep and tail and all(part.isidentifier() for part in tail.split(".")):
        return head, tail
    return spec, None


def _on_path(folder: str) -> None:
    if folder not in sys.path:
        sys.path.insert(0, folder)


def import_file(path: Path) -> Any:
    """Import a .py file as a fresh module, with its folder and the working directory on sys.path."""
    name = f"_dycl_user_{path.stem}_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    # the file's folder (sibling imports) and the working directory, as `python -m` would
    # (examples import their package, e.g. `from examples.dynn import seeded`, from the repo root)
    for folder in (str(Path.cwd()), str(path.resolve().parent)):
        _on_path(folder)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        module_spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:
        del sys.modules[name]
        folder = _ancestor_holding(path, exc.name)
        if folder is None:
            raise UsageError(f"importing {path} failed: ModuleNotFoundError: {exc}",
                             fix="install what it imports, or run from the folder that holds it") from None
        _on_path(folder)  # e.g. `from examples.dynn import seeded` with the file run from elsewhere
        return import_file(path)
    except Exception as exc:  # noqa: BLE001  (the user's file: report it in one line)
        del sys.modules[name]
        raise UsageError(f"importing {path} failed: {type(exc).__name__}: {exc}", fix="fix the file") from None
    return module


def _ancestor_holding(path: Path, missing: str | None) -> str | None:
    """The nearest folder above `path`, not yet on sys.path, holding the missing top-level package."""
    if not missing:
        return None
    top = missing.split(".")[0]
    for parent in path.resolve().parents:
        if str(parent) not in sys.path and ((parent / top).is_dir() or (parent / f"{top}.py").is_file()):
            return str(parent)
    return None


def _import_module(name: str) -> Any:
    _on_path(str(Path.cwd()))  # `dycl-jax convert mypkg.models:build` from the project folder
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name) and (len(exc.name) == len(name) or name[len(exc.name)] == "."):
            raise UsageError(f"no module named {exc.name!r}",
                             fix="run from the folder that holds it, install it, or pass path/to/file.py:FACTORY") from None
        raise UsageError(f"importing {name} failed: ModuleNotFoundError: {exc}", fix="install what it imports") from None
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"importing {name} failed: {type(exc).__name__}: {exc}", fix="fix the module") from None


def _attribute(module: Any, where: str, name: str) -> Any:
    value = module
    for part in name.split("."):
        if not hasattr(value, part):
            raise UsageError(f"{where} defines no {name}",
                             fix=f"name a function or nn.Module class defined there, as {where}:FACTORY")
        value = getattr(value, part)
    return value


def _build(fn: Callable, label: str) -> Any:
    import torch

    if isinstance(fn, type) and issubclass(fn, torch.nn.Module):
        required = [p for p in list(inspect.signature(fn.__init__).parameters.values())[1:]
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if required:
            names = ", ".join(p.name for p in required)
            raise UsageError(f"{label} needs arguments ({names})",
                             fix="write a factory function that builds the model and name it instead")
    if not callable(fn):
        raise UsageError(f"{label} is a {type(fn).__name__}, not a function or nn.Module class",
                         fix="name a function returning a model, or an nn.Module class")
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001  (the user's factory: report it in one line)
        raise UsageError(f"{label}() raised {type(exc).__name__}: {exc}", fix="fix the factory") from None


def load_target(spec: str) -> Target:
    """Import the target and build the model (and its example arguments, if the factory gives them)."""
    import torch

    where, fn_name = _split(spec)
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where)
        if not path.is_file():
            raise UsageError(f"{where}: no such Python file", fix="pass the path of a .py file, e.g. examples/x.py")
        module, label = import_file(path), f"{path}"
        fn_name = fn_name or DEFAULT_FN
        if not hasattr(module, fn_name):
            raise UsageError(f"{path} defines no function {fn_name}()",
                             fix=f"define `def {fn_name}(): return model, args` in it, or name another one as "
                                 f"{path}:FACTORY")
    else:
        if fn_name is None:
            raise UsageError(f"{spec!r} names no factory", fix=f"write MODULE:FACTORY, e.g. {spec}:build_model")
        module, label = _import_module(where), where
    made = _build(_attribute(module, label, fn_name), f"{label}:{fn_name}")
    if isinstance(made, torch.nn.Module):
        return Target(made, None, module, spec)
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        args = made[1] if isinstance(made[1], tuple) else (made[1],)
        return Target(made[0], args, module, spec)
    raise UsageError(f"{label}:{fn_name}() returned {type(made).__name__}, not a model",
                     fix="return an nn.Module, or (model, example_args)")


def extra_cases(module: Any, n: int) -> list[tuple[Any, ...]]:
    """Argument tuples from the file's `inputs(n[, seed])`, if it defines one.

    Two conventions: a list of n argument tuples (dynamic-network examples), or one argument
    tuple at batch size n (static examples).
    """
    fn = getattr(module, "inputs", None)
    if n <= 0 or not callable(fn):
        return []
    made = fn(n, seed=0) if "seed" in inspect.signature(fn).parameters else fn(n)
    if isinstance(made, tuple):
        return [made]
    return [c if isinstance(c, tuple) else (c,) for c in made]
