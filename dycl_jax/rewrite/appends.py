"""Lists a region only appends to: found in the statements' source, run with an empty list whose
appended items the host adds to the caller's list (the live host and the torch-free loaded one)."""
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


def appending(ins: Sequence[str], outs: Sequence[str], appends: Sequence[str], vals: tuple,
              run: Callable[[tuple], tuple]) -> tuple:
    """Run a part whose input lists `appends` it only appends to and gives back: each goes in
    as a new empty list, and what the part appended to it is added to the caller's list, which
    is the output (as `xs.append` keeps the list's identity). So the part's signature is the
    same at every length of the list: a decode loop body compiles once, not once per step."""
    lists = {n: v for n, v in zip(ins, vals) if n in appends and type(v) is list}
    # (a list another input also holds, or contains, is seen whole by the part: run as it is)
    if not lists or any(v is l or type(v) in (list, tuple) and any(x is l for x in v)
                        for n, v in zip(ins, vals) if n not in lists for l in lists.values()):
        return run(vals)
    got = list(run(tuple([] if n in lists else v for n, v in zip(ins, vals))))
    for k, n in enumerate(outs):
        if n in lists:
            lists[n].extend(got[k])
            got[k] = lists[n]
    return tuple(got)
