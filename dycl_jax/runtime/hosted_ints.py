"""A region program over symbolic Python ints (capture/int_inputs.py) in an exported dispatch
host: one program taking each int as a scalar input (so a decode loop's artifact serves step
counts never run before export), with its guard and the ints the host computes from the
call's (`t + 1`) written as text that the loaded host (runtime/hosted.py) evaluates without torch."""
from __future__ import annotations

import ast
from typing import Any

import os

import jax
import numpy as np

from dycl_jax.capture.int_inputs import SymbolicInts
from dycl_jax.errors import DyclError, Location
from dycl_jax.host import values
from dycl_jax.host.dispatch import Compiled, Part, _leaf_names
from dycl_jax.runtime.hosted import INT_LEAF, INT_NAMESPACE, printed_int_fn


_SCAN, _WIDEN = 1 << 12, 4  # int values checked against the guards; captures added per signature


def _names_known(args: tuple[str, ...], body: str) -> bool:
    """Whether the printed expression reads only its arguments and the loaded host's namespace."""
    try:
        tree = ast.parse(body, mode="eval")
    except SyntaxError:
        return False
    return all(n.id in args or n.id in INT_NAMESPACE for n in ast.walk(tree) if isinstance(n, ast.Name))


def int_fields(entry: Compiled | SymbolicInts, served: list[tuple]) -> dict | str:
    """The manifest fields of `entry`'s symbolic ints (`ints`, `guard`, `computed`), or why they
    cannot be written torch-free. `served`: the signature keys (host/values.leaf_key) it served;
    the written texts must agree with the live host's guard and results on each of them.
    (`entry` may also be a capture's SymbolicInts: its guard, results and leaves.)"""
    if isinstance(entry, SymbolicInts):
        entry = Compiled(None, [], [], None, [], [], guard=entry.guard, computed=entry.results,  # type: ignore[arg-type]
                         symbolic=entry.leaves)
    texts = [("its guard", entry.guard)] + [(f"the int it computes for output {r.position}", r.fn)
                                            for r in entry.computed]
    for what, fn in texts:
        if fn is not None and (getattr(fn, "printed", None) is None or not _names_known(*fn.printed)):
            return f"{what} uses functions the loaded host does not hold"
    fields = {"ints": sorted(entry.symbolic), "guard": list(entry.guard.printed) if entry.guard else None,
              "computed": [[r.position, list(r.leaves), list(r.fn.printed[0]), r.fn.printed[1], r.kind.__name__]
                           for r in entry.computed]}
    guard = printed_int_fn(fields["guard"])
    for _, keys, _, _ in served:  # int leaves key as (int, value); the texts read only those
        leaves = [k[1] if isinstance(k, tuple) and len(k) == 2 and k[0] is int else None for k in keys]
        try:
            if guard is not None and not guard(leaves):
                return "its printed guard rejects a signature it served"
            for r, (_, _, args, body, _) in zip(entry.computed, fields["computed"]):
                got = r.kind(printed_int_fn([args, body])(*[leaves[i] for i in r.leaves]))
                if got != r.kind(r.fn(*[leaves[i] for i in r.leaves])):
                    return f"its printed int for output {r.position} differs from the live host's"
        except Exception as exc:  # noqa: BLE001 - a printed form the torch-free namespace cannot evaluate
            return f"its printed guard or ints do not evaluate torch-free ({type(exc).__name__})"
    return fields


def int_keys(keys: list, entry: Compiled) -> list:
    """The JSON signature key with the program's symbolic int leaves as `INT_LEAF` (any value)."""
    return [INT_LEAF if i in entry.symbolic else k for i, k in enumerate(keys)]


def tensor_avals(keys: list, entry: Compiled) -> list:
    """The program's inputs: arrays as keyed, each symbolic int a weakly typed scalar, as the live
    jitted program takes a Python int (so `int8_tensor + t` keeps int8, as torch does)."""
    scalar = np.int64 if entry.x64 else np.int32
    return [jax.ShapeDtypeStruct((), scalar, weak_type=True) if keys[i] == INT_LEAF
            else jax.ShapeDtypeStruct(tuple(keys[i][1]), np.dtype(keys[i][2])) for i in entry.tensor_leaves]


def describe(key: list) -> str:
    """A signature key as the manifest's coverage lists it: `float32[1, 8], int (any), module`."""
    def one(k: Any) -> str:
        kind = k[0]
        if kind == "a":
            return f"{k[2]}[{', '.join(map(str, k[1]))}]"
        if kind == "i":
            return "int (any value its guard takes)"
        if kind == "m":
            return f"module {k[1] or '(root)'}"
        if kind == "p":
            return f"{k[1]} {k[2]!r}"
        return f"{kind} {k[1:]!r}"
    return ", ".join(one(k) for k in key)


def widen(writer: Any, spec: Any, part: Part, fname: str) -> tuple[list[str], list[tuple]]:
    """For a program over one symbolic int whose guard (torch.export's, e.g. `t <= 8`) leaves out
    values in [0, _SCAN) that no other program of its signature takes, capture the part at the
    first such value (up to _WIDEN times), so that the artifact serves it. Returns a note per
    signature where values stay unserved, and the captures deferred (`resolve_deferred`).

    Signatures that differ only in array sizes (a decode loop's growing `seqs` at each step)
    form a family: only enough of them to show every size that varies are captured here, so
    that the new programs group into one with symbolic sizes (hosted_symbolic.py); the others
    are deferred, and captured only where that program does not take them."""
    notes: list[str] = []
    deferred: list[tuple] = []
    families: dict[Any, list] = {}
    for group in list(part.variants.values()):
        leaves_of = {frozenset(e.symbolic) for e in group}
        if len(leaves_of) != 1 or len(next(iter(leaves_of))) != 1 or not part.served.get(id(group[0])):
            continue
        symbolic_leaves = next(iter(leaves_of))
        tree, keys, grad, same = next(iter(part.served[id(group[0])]))
        shape_free = tuple((len(k[0]), k[1]) if _is_array(k) else None if i in symbolic_leaves else k
                           for i, k in enumerate(keys))
        families.setdefault((tree, shape_free, grad, same, symbolic_leaves), []).append(group)
    for family in families.values():
        family.sort(key=lambda g: -_volume(next(iter(part.served[id(g[0])]))[1]))  # the largest first
        shown = _showing(family, part)
        for n, group in enumerate(family):
            notes += _widen_group(writer, spec, part, fname, group, None if n in shown else deferred)
    return notes, deferred


def _widen_group(writer: Any, spec: Any, part: Part, fname: str, group: list[Compiled],
                 deferred: list | None) -> list[str]:
    """widen() for one signature's programs; with `deferred`, the captures are listed there instead."""
    notes = []
    symbolic_leaves = frozenset(group[0].symbolic)
    (leaf,) = symbolic_leaves
    tree, keys, grad, same = next(iter(part.served[id(group[0])]))
    name = _leaf_names(part.ins, tree, [leaf])[0]
    covered: set[int] = set()  # values given a static program here
    for _ in range(_WIDEN):
        value = _unguarded(group, leaf, len(keys), covered)
        if value is None:
            break
        covered.add(value)
        key = (tree, keys[:leaf] + ((int, value),) + keys[leaf + 1:], grad, same)
        if key in part.cache:  # the live host compiled it with the int as a constant
            continue
        if deferred is not None:  # resolve_deferred widens this group from here, if it must
            deferred.append((group, key, leaf, value))
            return notes
        new = _capture_at(writer, spec, part, fname, key, symbolic_leaves)
        if isinstance(new, str):
            notes.append(f"`{name}` from {value} on: the statements fail there ({new})")
            break
        _file(writer, part, group, key, new)
    else:
        value = _unguarded(group, leaf, len(keys), covered)
        if value is not None:
            notes.append(f"`{name}` = {value}: outside every program's guard after {_WIDEN} more captures")
            _uncovered_value(writer, spec, part, name, value)
    return notes


def _file(writer: Any, part: Part, group: list[Compiled], key: tuple, new: Compiled) -> None:
    if new.symbolic == group[0].symbolic:
        group.append(new)
        part.cache[("variant", id(new))] = new  # the live host reuses it too: the same program
        part.served[id(new)] = {key: None}
    else:  # the int is a constant there (as the live host would compile it): that value only
        part.cache[key] = new
        writer.widened.add(id(new))


def resolve_deferred(writer: Any, spec: Any, part: Part, fname: str, deferred: list[tuple],
                     served: Any) -> list[str]:
    """Widen each deferred signature's programs as widen() would have, unless a program with
    symbolic sizes serves its first unguarded value (`served(key)`); returns notes."""
    notes = []
    for group, key, _, _ in deferred:
        if not served(key):
            notes += _widen_group(writer, spec, part, fname, group, None)
    return notes


def _is_array(k: Any) -> bool:
    return isinstance(k, tuple) and len(k) == 2 and isinstance(k[0], tuple)


def _volume(keys: tuple) -> int:
    return sum(int(np.prod(k[0])) for k in keys if _is_array(k))


def _showing(family: list, part: Part) -> set[int]:
    """Indices of family members that together show every array dimension whose size varies
    in the family (the first, then each that differs from it in a dimension not yet shown)."""
    sigs = [next(iter(part.served[id(g[0])]))[1] for g in family]
    first = sigs[0]
    varying = {(i, d) for s in sigs for i, k in enumerate(s) if _is_array(k)
               for d in range(len(k[0])) if k[0][d] != first[i][0][d]}
    chosen, shown = {0}, set()
    for n, s in enumerate(sigs[1:], 1):
        new = {(i, d) for i, d in varying if s[i][0][d] != first[i][0][d]} - shown
        if new:
            chosen.add(n)
            shown |= new
    return chosen


def _unguarded(group: list[Compiled], leaf: int, n: int, covered: set[int]) -> int | None:
    """The first value in [0, _SCAN) of int leaf `leaf` (of `n`) no program's guard takes, and not covered."""
    probe: list = [None] * n
    return next((v for v in range(_SCAN) if v not in covered and not any(
        e.guard is None or e.guard(probe[:leaf] + [v] + probe[leaf + 1:]) for e in group)), None)


def _capture_at(writer: Any, spec: Any, part: Part, fname: str, key: tuple, symbolic: frozenset[int]) -> Compiled | str:
    """The part captured at signature `key` with `symbolic` ints as symbols, else as constants
    (as the live host falls back); why not where the statements fail there too."""
    tree, leaves, _, same = key
    for ints_in in (symbolic, frozenset()):
        try:
            return writer.static_entry(spec, part, fname, tree, leaves, same, ints_in)
        except Exception as exc:  # noqa: BLE001 - e.g. an index out of range at this value
            values.reraise_if_internal(exc)
            why = exc.message if isinstance(exc, DyclError) else f"{type(exc).__name__}: {exc}"
    return " ".join(why.split())[:160]


def _uncovered_value(writer: Any, spec: Any, part: Part, name: str, value: int) -> None:
    first = spec.statements[part.first]
    writer.note_uncovered(DyclError(
        f"{os.path.basename(spec.file)}:{first.line}: the {spec.label} takes the Python int `{name}`, and no "
        f"exported program of it takes `{name}` = {value}; an input that reaches it gets a CallError when the "
        "artifact is called", location=Location(spec.file, first.line, first.code),
        fix=f"before jm.export, call jm on an input that reaches `{name}` = {value} (and the values after it)"))
