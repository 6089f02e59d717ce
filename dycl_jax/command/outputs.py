"""`convert --out DIR`, `dycl-jax emit` and `dycl-jax report DIR`: what a conversion leaves on disk."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from dycl_jax.command import exits
from dycl_jax.errors import DyclError, UsageError

REPORT = "report.json"  # the conversion report, as report_to_dict writes it
ARTIFACT = "artifact"  # jm.export: StableHLO, safetensors, manifest (dycl_jax.load reads it)
SOURCE = "flax"  # jm.emit: model.py and its weights


def write_outputs(jm: Any, report: Any, out_dir: str, err: Console) -> list[str]:
    """Write the report, the deployable artifact and the emitted source under `out_dir`.

    A part the model cannot have (a dispatch-host model emits no Flax source; its artifact holds
    the region signatures its conversion and `--check` ran) is skipped with its reason on
    stderr; the others are still written. Returns the reasons of the parts skipped."""
    from dycl_jax.report.record import report_to_dict

    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    (root / REPORT).write_text(json.dumps(report_to_dict(report), indent=2))
    written, skipped = [REPORT], []
    for name, write in ((ARTIFACT, lambda p: jm.export(p)), (SOURCE, lambda p: jm.emit(p))):
        try:
            write(str(root / name))
            written.append(f"{name}/")
        except DyclError as exc:  # a refusal is the user's news, not a crash: say it, write the rest
            first = str(exc).strip().splitlines()[0]
            skipped.append(f"{name}/ not written: {first}")
    err.print(f"wrote {', '.join(written)} to {root}", highlight=False)
    for line in skipped:
        err.print(line, highlight=False, soft_wrap=True)
    return skipped


def emit(ns: argparse.Namespace, out: Console, err: Console) -> int:
    """`dycl-jax emit TARGET --out DIR`: convert and write only the Flax source."""
    from dycl_jax import to_jax
    from dycl_jax.command.convert import prepare
    from dycl_jax.command.progress import stages

    prep = prepare(ns)
    with stages(err) as step:
        jm = to_jax(prep.target.model, prep.args, method=ns.method, host=ns.host, max_len=ns.max_len, progress=step)
        step("emitting Flax source")
        path = jm.emit(ns.out)
    lines = Path(path).read_text().count("\n")
    out.print(f"wrote {path} ({lines} lines) and its weights; `import model; m = model.load()`", highlight=False)
    return exits.OK


def report(ns: argparse.Namespace, out: Console, err: Console) -> int:
    """`dycl-jax report DIR`: render the report a `convert --out DIR` wrote, and the artifact's manifest."""
    from dycl_jax.report.record import report_from_dict
    from dycl_jax.report.render import report_renderable

    root = Path(ns.dir)
    path = root / REPORT
    if not path.is_file():
        raise UsageError(f"{path} not found", fix=f"write it with `dycl-jax convert TARGET --out {ns.dir}`")
    try:
        data = json.loads(path.read_text())
        record = report_from_dict(data)
    except (ValueError, KeyError, TypeError) as exc:  # a file that is not our report
        raise UsageError(f"{path} is not a dycl-jax report ({type(exc).__name__}: {exc})") from exc
    if ns.json:
        out.print_json(json.dumps(data))
        return exits.OK
    out.print(report_renderable(record, wide=ns.wide))
    manifest = root / ARTIFACT / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        out.print(f"artifact: {manifest.parent} ({_artifact_summary(m)}); load it with dycl_jax.load(path)",
                  highlight=False, soft_wrap=True)
    return exits.OK


def _artifact_summary(m: dict) -> str:
    if m.get("host") == "dispatch":  # a host program with its regions' programs (runtime/hosted_export.py)
        missing = len(m.get("coverage", {}).get("uncovered", []))
        served = "every region signature served" if not missing else \
            f"{missing} site{'s' if missing > 1 else ''} serve only the signatures run before export"
        return f"host dispatch, {len(m.get('regions', []))} regions, {served}"
    return (f"host {m.get('host')}, platforms {', '.join(m.get('platforms', []))}, "
            f"batch dimension {m.get('batch', {}).get('dim0', '?')}")


def add_report_parser(sub: Any, epilog: str, fmt: type) -> None:
    r = sub.add_parser("report", help="show the report of a `convert --out DIR` directory", epilog=epilog,
                       formatter_class=fmt)
    r.add_argument("dir", metavar="DIR")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.add_argument("--wide", action="store_true", help="the full record")
