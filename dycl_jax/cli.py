"""The `dycl-jax` command line: parse, dispatch to a subcommand, turn errors into exit statuses."""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Callable, NoReturn, Sequence

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from dycl_jax.command import exits
from dycl_jax.errors import DyclError, UsageError


class _Parser(argparse.ArgumentParser):
    """argparse with our usage-error status (3) and a one-line message."""

    def error(self, message: str) -> NoReturn:
        self.exit(exits.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _ops(ns: argparse.Namespace, out: Console, err: Console) -> int:
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
    return exits.OK


def _convert(ns: argparse.Namespace, out: Console, err: Console) -> int:
    from dycl_jax.command.convert import convert

    return convert(ns, out, err)


def _bench(ns: argparse.Namespace, out: Console, err: Console) -> int:
    from dycl_jax.command.bench import bench

    return bench(ns, out, err)


def _emit(ns: argparse.Namespace, out: Console, err: Console) -> int:
    from dycl_jax.command.outputs import emit

    return emit(ns, out, err)


def _report(ns: argparse.Namespace, out: Console, err: Console) -> int:
    from dycl_jax.command.outputs import report

    return report(ns, out, err)


# subcommand name -> its function
COMMANDS: dict[str, Callable[[argparse.Namespace, Console, Console], int]] = {
    "convert": _convert, "bench": _bench, "ops": _ops, "emit": _emit, "report": _report,
}


def _parser() -> argparse.ArgumentParser:
    from dycl_jax.command.bench import add_bench_options
    from dycl_jax.command.convert import add_target_options
    from dycl_jax.command.outputs import add_report_parser

    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(prog="dycl-jax", description="Convert PyTorch (dynamic) networks to JAX.", epilog=exits.HELP,
                formatter_class=fmt)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = sub.add_parser("convert", help="convert a model, check it against torch and report on it", epilog=exits.HELP,
                       formatter_class=fmt)
    add_target_options(c, check_default=16)
    c.add_argument("--json", nargs="?", const="-", metavar="OUT",
                   help="write the full report as JSON to OUT (to stdout, instead of the tables, without OUT)")
    c.add_argument("--wide", action="store_true", help="the full record: every name and path, fx graph names")
    c.add_argument("--out", metavar="DIR", help="write DIR/report.json, the deployable artifact (DIR/artifact, "
                                                "for dycl_jax.load) and the emitted Flax source (DIR/flax)")
    e = sub.add_parser("emit", help="convert a model and write its Flax NNX source with the weights",
                       epilog=exits.HELP, formatter_class=fmt)
    add_target_options(e, check_default=0)
    e.add_argument("--out", metavar="DIR", required=True, help="where model.py and its weights go")
    add_report_parser(sub, exits.HELP, fmt)
    b = sub.add_parser("bench", help="time torch eager against the converted model (one thread each)",
                       epilog=exits.HELP, formatter_class=fmt)
    add_target_options(b, check_default=8)
    add_bench_options(b)
    o = sub.add_parser("ops", help="count the registered op lowerings by family")
    o.add_argument("--list", action="store_true", help="also list every op")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dycl-jax` console script; returns the exit status (see `--help`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # before JAX's CPU client or torch's thread pool starts
        from dycl_jax.command.bench import pin_threads

        pin_threads()
    ns = _parser().parse_args(argv)
    out, err = Console(), Console(stderr=True)
    try:
        return COMMANDS[ns.command](ns, out, err)
    except UsageError as exc:  # bad input: one line, no traceback
        fix = f" (fix: {exc.fix})" if exc.fix else ""
        err.print(Text(f"dycl-jax {ns.command}: error: {exc.message}{fix}"), soft_wrap=True)
        return exits.USAGE
    except DyclError as exc:  # the conversion refused: where, why, and the fix
        err.print(Panel(Text(str(exc)), title=f"[bold]{type(exc).__name__}[/bold]", border_style="red", expand=False))
        return exits.REFUSED


if __name__ == "__main__":
    sys.exit(main())
