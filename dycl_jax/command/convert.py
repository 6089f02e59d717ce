"""`dycl-jax convert`: load the target, convert it with a progress display, check it, print the report."""
from __future__ import annotations

import argparse
import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from dycl_jax.command import exits
from dycl_jax.command.progress import stages
from dycl_jax.command.specs import InputSpec, input_specs, load_example, random_inputs, specs_of
from dycl_jax.command.targets import Target, extra_cases, load_target
from dycl_jax.errors import UsageError

# notices from library internals, not from the user's model
_INTERNAL = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


@dataclass
class Prepared:
    """The model, the example arguments it is converted with, and the cases --check compares."""

    target: Target
    args: tuple
    specs: list[InputSpec]  # where the inputs came from shapes (given, or an --example file's)
    checks: list[tuple]


def add_target_options(p: argparse.ArgumentParser, check_default: int) -> None:
    """The options `convert` and `bench` share: what to convert, with which inputs, how."""
    p.add_argument("target", metavar="TARGET",
                   help="file.py (its example() returns (model, args)), file.py:FACTORY or MODULE:FACTORY; "
                        "FACTORY returns a model or (model, args), or is an nn.Module class without required arguments")
    p.add_argument("--input-shape", action="append", default=[], metavar="SHAPE",
                   help="one per tensor input, in order: sizes separated by x, e.g. 1x3x224x224")
    p.add_argument("--dtype", action="append", default=[], metavar="DTYPE",
                   help="torch dtype of the inputs (default float32): once for all, or once per --input-shape")
    p.add_argument("--example", metavar="FILE.pt", help="example inputs: a tensor or tuple of tensors saved by torch.save")
    p.add_argument("--method", default="forward", help="method to convert (default: forward)")
    p.add_argument("--host", default="auto", choices=["auto", "staged", "dispatch"], help="how control flow runs")
    p.add_argument("--max-len", type=int, default=None, metavar="N",
                   help="stage the method's decode loop, unrolled to at most N iterations (padded outputs)")
    p.add_argument("--check", type=int, default=check_default, metavar="N",
                   help=f"compare with torch on N more inputs (default {check_default}): random ones drawn from the "
                        "shapes (floats normal, integers in [0, 10), bools fair), or the file's inputs(N)")


def prepare(ns: argparse.Namespace) -> Prepared:
    """Everything from the command line before conversion; bad input is a UsageError."""
    specs = input_specs(ns.input_shape, ns.dtype)
    if ns.example and specs:
        raise UsageError("both --example and --input-shape given", fix="give one of them")
    if ns.max_len is not None and ns.max_len < 1:
        raise UsageError(f"--max-len must be at least 1, got {ns.max_len}", fix="pass e.g. --max-len 32")
    if ns.check < 0:
        raise UsageError(f"--check must be 0 or more, got {ns.check}", fix="pass e.g. --check 16")
    example = load_example(ns.example) if ns.example else None
    target = load_target(ns.target)
    target.model.eval()  # converted in eval mode (a fresh nn.Module is in training mode): no warning for it
    if example is not None:
        args, specs = example, specs_of(example)
    elif specs:
        args = random_inputs(specs, seed=0)
    elif target.args is not None:
        args = target.args
    else:
        raise UsageError(f"{ns.target} gives a model but no example inputs",
                         fix="add --input-shape (e.g. --input-shape 1x3x224x224 --dtype float32) or --example FILE.pt")
    import torch

    if not specs and target.args is not None and getattr(target.module, "inputs", None) is None \
            and all(isinstance(a, torch.Tensor) for a in args):
        specs = specs_of(args)  # a factory's own tensors: draw more like them
    if specs:
        checks = [random_inputs(specs, seed=1 + k) for k in range(ns.check)]
    else:
        checks = extra_cases(target.module, ns.check)
    return Prepared(target, args, specs, checks)


def _caught(caught: list) -> list[str]:
    return sorted({f"{w.category.__name__}: {w.message}" for w in caught if not issubclass(w.category, _INTERNAL)})


def convert(ns: argparse.Namespace, out: Console, err: Console) -> int:
    """Convert, call once, compare with torch; print the report; the exit status."""
    import jax

    from dycl_jax import to_jax
    from dycl_jax.report.parity import parity
    from dycl_jax.report.record import report_to_dict
    from dycl_jax.report.render import report_renderable

    prep = prepare(ns)
    model = prep.target.model
    with stages(err) as step, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jm = to_jax(model, prep.args, method=ns.method, host=ns.host, max_len=ns.max_len, progress=step)
        model.eval()  # converted in eval mode; compare against the same
        report = jm.report()
        report.warnings += _caught(caught)
        step("first call: trace + XLA compile")
        start, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(jm(*prep.args))
        report.timings["first_call_s"] = time.perf_counter() - start
        report.timings["first_call_cpu_s"] = time.process_time() - cpu
        cases = [prep.args] + prep.checks
        step(f"parity check against torch ({len(cases)} inputs)")
        report.parity, problems, report.flips = parity(model, ns.method, jm, cases)
        report.warnings += problems
    if ns.json == "-":
        out.print_json(json.dumps(report_to_dict(report)))
    else:
        # the full record: every name, at least 160 columns (a pager or a file holds it)
        wide = Console(file=out.file, width=max(out.width, 160), color_system=out.color_system,
                       force_terminal=out.is_terminal) if ns.wide else out
        wide.print(report_renderable(report, wide=ns.wide))
        if ns.json:
            Path(ns.json).write_text(json.dumps(report_to_dict(report), indent=2))
            err.print(f"report written to {ns.json}")
    status = verdict(report.parity, problems, err)
    if getattr(ns, "out", None) and status == exits.OK:  # only a model that matches torch is written out
        from dycl_jax.command.outputs import write_outputs

        write_outputs(jm, report, ns.out, err)
    return status


def verdict(numbers: dict[str, Any], problems: list[str], err: Console) -> int:
    """Exit status from the parity numbers: real mismatches (or different outputs) fail."""
    failed = int(numbers.get("mismatches", 0)) + (1 if problems else 0)
    cases = int(numbers.get("cases", 0))
    if failed:
        err.print(f"parity FAILED: {int(numbers.get('mismatches', 0))} of {cases} inputs differ from torch"
                  + (f"; {len(problems)} output structure problems" if problems else ""), highlight=False)
        return exits.PARITY
    flips = int(numbers.get("decision_flips", 0))
    note = f" ({flips} near-threshold decision flips)" if flips else ""
    err.print(f"parity ok: {cases} inputs match torch{note}", highlight=False)
    return exits.OK
