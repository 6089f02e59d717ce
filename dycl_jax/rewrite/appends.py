"""Lists a region only appends to: found in the statements' source, run with an empty list whose
appended items the host adds to the caller's list (the live host and the torch-free loaded one);
and lists and dicts a region changes only in place, which keep their identity across it."""
from __future__ import annotations

import ast
from typing import Any, Callable, Sequence


def appended(s: ast.stmt) -> tuple[str, ...]:
    """`xs.append(v)` where `v` does not read `xs`: the name the statement only appends to."""
    call = s.value if isinstance(s, ast.Expr) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "append"
            and isinstance(call.func.value, ast.Name) and len(call.args) == 1 and not call.keywords):
        return ()
    target = call.func.value.id
    if any(isinstance(n, ast.Name) and n.id == target for n in ast.walk(call.args[0])):
        return ()
    return (target,)


def copied(s: ast.stmt) -> tuple[tuple[str, str], ...]:
    """(target, source) of `a = b` (and `a = c = b`): names bound to what another name holds."""
    if not (isinstance(s, ast.Assign) and isinstance(s.value, ast.Name)
            and all(isinstance(t, ast.Name) for t in s.targets)):
        return ()
    return tuple((t.id, s.value.id) for t in s.targets if isinstance(t, ast.Name))


def appending(ins: Sequence[str], outs: Sequence[str], appends: Sequence[str], vals: tuple,
              run: Callable[[tuple], tuple]) -> tuple:
    """Run a part whose input lists `appends` it only appends to and gives back: each goes in
    as a new empty list, and what the part appended to it is added to the caller's list, which
    is the output (as `xs.append` keeps the list's identity). So the part's signature is the
    same at every length of the list: a decode loop body compiles once, not once per step."""
    lists = appended_lists(ins, appends, vals)
    if lists is None:
        return run(vals)
    return extended(outs, lists, run(emptied(ins, lists, vals)))


def appended_lists(ins: Sequence[str], appends: Sequence[str], vals: tuple) -> dict[str, list] | None:
    """The caller's lists among `vals` that go in empty (by name), or None where the part must
    see them whole: none is a list, or a list another input also holds or contains."""
    lists = {n: v for n, v in zip(ins, vals) if n in appends and type(v) is list}
    if not lists or any(v is l or type(v) in (list, tuple) and any(x is l for x in v)
                        for n, v in zip(ins, vals) if n not in lists for l in lists.values()):
        return None
    return lists


def emptied(ins: Sequence[str], lists: dict[str, list], vals: tuple) -> tuple:
    """`vals` with a new empty list in place of each of `lists`."""
    return tuple([] if n in lists else v for n, v in zip(ins, vals))


def extended(outs: Sequence[str], lists: dict[str, list], got: Sequence[Any]) -> tuple:
    """The part's outputs `got` with each appended list's items added to the caller's list,
    which takes its place."""
    got = list(got)
    for k, n in enumerate(outs):
        if n in lists:
            lists[n].extend(got[k])
            got[k] = lists[n]
    return tuple(got)


def rebound(nodes: Sequence[ast.AST]) -> set[str]:
    """Names the code binds to a new object (`xs = ...`, a loop target), not counting an
    augmented assignment's target (`xs += [v]` extends a list in place) nor the names a
    converted construct's own assignment gives back as they were (`_dycl_in_place`)."""
    kept: set[int] = set()
    for s in nodes:
        for n in ast.walk(s):
            if isinstance(n, ast.AugAssign):
                kept.add(id(n.target))
            elif isinstance(n, ast.Assign) and getattr(n, "_dycl_in_place", None):
                kept |= {id(t) for target in n.targets for t in ast.walk(target)
                         if isinstance(t, ast.Name) and t.id in n._dycl_in_place}  # type: ignore[attr-defined]
    return {n.id for s in nodes for n in ast.walk(s)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and id(n) not in kept}


def kept_in_place(vals: tuple, outs: tuple, pairs: Sequence[tuple[int, int]]) -> tuple:
    """`outs` where each (input position, output position) pair is a name the part changes only
    in place: a list or dict that comes back as a new object (a compiled program, or a host
    statement, builds its outputs anew) is written into the caller's object, which is the output,
    so every other name holding it sees the change, as in Python (`saved = xs; xs.append(v)`)."""
    got = list(outs)
    for i, o in pairs:
        got[o] = _written_into(vals[i], got[o])
    return tuple(got)


def _written_into(old: Any, new: Any) -> Any:
    """`old` holding `new`'s contents where both are lists (or both dicts); else `new`."""
    if new is old or type(new) is not type(old) or type(old) not in (list, dict):
        return new
    if type(old) is list:
        old[:] = new
    else:
        old.clear()
        old.update(new)
    return old


def kept_identity(vals: tuple, outs: tuple, pairs: Sequence[tuple[int, bool, int]]) -> tuple:
    """`outs` with each (output, from an input?, position) of `regions.identities` holding that
    input's or earlier output's list or dict itself again (an input's object gets the output's
    contents written into it, as `saved.append(v)` changed the caller's `xs`)."""
    got = list(outs)
    for o, from_input, i in pairs:
        new = got[o]
        if from_input:
            got[o] = _written_into(vals[i], new)
        elif type(new) in (list, dict) and type(got[i]) is type(new):
            got[o] = got[i]
    return tuple(got)


def shared_containers(vals: Sequence[Any]) -> list[tuple[int, int]]:
    """(j, i) for each input j that is the same list or dict object as an earlier input i (one
    list under two names): a compiled program would take them as two."""
    first: dict[int, int] = {}
    pairs = []
    for j, v in enumerate(vals):
        if type(v) in (list, dict):
            i = first.setdefault(id(v), j)
            if i != j:
                pairs.append((j, i))
    return pairs


def rejoined(vals: Sequence[Any], pairs: Sequence[tuple[int, int]]) -> tuple:
    """`vals` rebuilt (fresh containers) with the inputs of `pairs` one object again."""
    out = list(vals)
    for j, i in pairs:
        out[j] = out[i]
    return tuple(out)
