"""The `dycl-jax` command line: convert an example file and show its report; list lowerings."""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from dycl_jax.errors import DyclError
from dycl_jax.report.parity import compare, parity  # noqa: F401  (compare: also used by scripts/bench.py)

_DEFAULT_FN = "example"


def load_entry(spec: str, default_fn: str = _DEFAULT_FN) -> tuple[Any, Callable[..., Any]]:
    """`file.py` or `file.py:function` → (the imported module, the function)."""
    path_text, fn_name = spec, default_fn
    head, sep, tail = spec.rpartition(":")
    if sep and head.endswith(".py") and tail.isidentifier():
        path_text, fn_name = head, tail
    path = Path(path_text)
    if not path.is_file() or path.suffix != ".py":
        raise DyclError(f"{path_text}: no such Python file", fix="pass the path of a .py file, e.g. examples/x.py")
    module = import_file(path)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise DyclError(
            f"{path} defines no function {fn_name}()",
            fix=f"define `def {fn_name}(): return model, args` in it, or name another one as {path}:FUNCTION",
        )
    return module, fn


def import_file(path: Path) -> Any:
    """Import a .py file as a fresh module, with its folder and the working directory on sys.path."""
    name = f"_dycl_user_{path.stem}_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    # the file's folder (sibling imports) and the working directory, as `python -m` would
    # (examples import their package, e.g. `from examples.dynn import seeded`, from the repo root)
    for folder in (str(Path.cwd()), str(path.resolve().parent)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise DyclError(f"importing {path} failed: {type(exc).__name__}: {exc}", fix="fix the file") from exc
    return module


def call_example(fn: Callable[..., Any]) -> tuple[Any, tuple[Any, ...]]:
    """Run the example function and check it returned `(model, args)`."""
    import torch

    try:
        result = fn()
    except Exception as exc:
        raise DyclError(f"{fn.__name__}() raised {type(exc).__name__}: {exc}", fix="fix the example function") from exc
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise DyclError(
            f"{fn.__name__}() must return (model, args), got {type(result).__name__}",
            fix="return a tuple: an nn.Module and its example arguments",
        )
    model, args = result
    return model, args if isinstance(args, tuple) else (args,)


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


def _convert(ns: argparse.Namespace, out: Console, err: Console) -> int:
    import jax

    from dycl_jax import to_jax
    from dycl_jax.report.record import report_to_dict
    from dycl_jax.report.render import report_renderable

    with err.status(f"loading {ns.path}"):
        module, fn = load_entry(ns.path)
        model, args = call_example(fn)
    with err.status("capturing with torch.export and lowering to JAX"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jm = to_jax(model, args, method=ns.method, host=ns.host, max_len=ns.max_len)
    model.eval()  # converted in eval mode; compare against the same
    report = jm.report()
    # what the user's model triggered; deprecations come from library internals, not the model
    internal = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
    shown = {f"{w.category.__name__}: {w.message}" for w in caught if not issubclass(w.category, internal)}
    report.warnings += sorted(shown)
    with err.status("first call: tracing and XLA compilation"):
        start = time.perf_counter()
        jax.block_until_ready(jm(*args))
        report.timings["first_call_s"] = time.perf_counter() - start
    with err.status("parity check against torch"):
        cases = [args] + extra_cases(module, ns.check)
        report.parity, problems, report.flips = parity(model, ns.method, jm, cases)
        report.warnings += problems
    out.print(report_renderable(report))
    if ns.json:
        Path(ns.json).write_text(json.dumps(report_to_dict(report), indent=2))
        err.print(f"report written to {ns.json}")
    return 0


def _ops(ns: argparse.Namespace, out: Console) -> int:
    import dycl_jax.lower.ops  # noqa: F401  (registers every lowering)
    from dycl_jax.lower.registry import registered

    table_data = registered()
    families: Counter[str] = Counter(fn.__module__.rsplit(".", 1)[-1] for fn in table_data.values())
    table = Table(title=f"{len(table_data)} registered lowerings", title_justify="left")
    table.add_column("family (dycl_jax/lower/ops/)")
    table.add_column("lowerings", justify="right")
    if ns.list:
        table.add_column("ops", overflow="fold")
    for family, count in sorted(families.items()):
        row = [family, str(count)]
        if ns.list:
            names = sorted(str(op) for op, fn in table_data.items() if fn.__module__.endswith("." + family))
            row.append(", ".join(names))
        table.add_row(*row)
    out.print(table)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dycl-jax", description="Convert PyTorch (dynamic) networks to JAX.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="convert the model an example file returns and report on it")
    c.add_argument("path", help="file.py or file.py:function; the function returns (model, args)")
    c.add_argument("--method", default="forward", help="method to convert (default: forward)")
    c.add_argument("--host", default="auto", choices=["auto", "staged", "dispatch"], help="how control flow runs")
    c.add_argument("--max-len", type=int, default=None, metavar="N",
                   help="stage the method's decode loop, unrolled to at most N iterations (padded outputs)")
    c.add_argument(
        "--check", type=int, default=16, metavar="N", help="also compare on inputs(N) if the file defines it"
    )
    c.add_argument("--json", metavar="OUT", help="write the report as JSON to OUT")
    o = sub.add_parser("ops", help="count the registered op lowerings by family")
    o.add_argument("--list", action="store_true", help="also list every op")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dycl-jax` console script; returns the exit status."""
    ns = _parser().parse_args(argv)
    out, err = Console(), Console(stderr=True)
    try:
        return _convert(ns, out, err) if ns.command == "convert" else _ops(ns, out)
    except DyclError as exc:
        err.print(Panel(Text(str(exc)), title=f"[bold]{type(exc).__name__}[/bold]", border_style="red", expand=False))
        return 2


if __name__ == "__main__":
    sys.exit(main())
