"""Module instances → `nnx.Module` classes: one class per torch class and code, constructor
arguments for the values that differ between its instances."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dycl_jax.emit.ops import lit
from dycl_jax.emit.program import Program

_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList)


@dataclass
class Ctor:
    """Constructor text with `{}` holes, the literal for each hole, and a name for each."""

    template: str
    values: list[str]
    names: list[str]


@dataclass
class Emitted:
    classes: list[str] = field(default_factory=list)  # class texts, dependencies first
    root: str = ""


def _children(paths: list[str], parent: str) -> list[str]:
    depth = 0 if parent == "" else parent.count(".") + 1
    return [p for p in paths if p != parent and p.count(".") == depth and (parent == "" or p.startswith(parent + "."))]


def build_classes(prog: Program, root_name: str, root_call: tuple[list[str], list[str]],
                  methods: dict[str, list[str]] | None = None) -> Emitted:
    """`methods`: per module path, more method texts for its class (a dispatch host's regions)."""
    methods = methods or {}
    owners = {p.rpartition(".")[0] for p in prog.raw}
    used = set(prog.layers) | set(prog.bodies) | owners | set(methods) | {""}
    for p in list(used):
        while p:
            p = p.rpartition(".")[0]
            used.add(p)
    order = {p: k for k, p in enumerate(prog.classes)}
    paths = sorted(used, key=lambda p: order.get(p, len(order)))
    ctors: dict[str, Ctor] = {}
    texts: dict[tuple, tuple[str, list[str], list[str]]] = {}
    out = Emitted()
    taken: dict[str, int] = {}
    depth = lambda p: p.count(".") + 1 if p else 0  # noqa: E731
    for level in sorted({depth(p) for p in paths}, reverse=True):
        groups: dict[tuple, list[str]] = {}
        for path in (p for p in paths if depth(p) == level):
            key = _instance(prog, path, paths, ctors, root_name, root_call, level, tuple(methods.get(path, ())))
            if key is None:
                continue
            if key not in texts:
                k = taken.get(key[0], 0)
                taken[key[0]] = k + 1
                texts[key] = (key[0] if k == 0 else f"{key[0]}{k + 1}", list(key[2]), ctors[path].names)
            groups.setdefault(key, []).append(path)
        for key, members in groups.items():
            out.classes.append(_finish(key, texts[key], members, ctors))
            if "" in members:
                out.root = texts[key][0]
    return out


def _instance(prog: Program, path: str, paths: list[str], ctors: dict[str, Ctor], root_name: str,
              root_call: tuple[list[str], list[str]], level: int, extra: tuple[str, ...] = ()) -> tuple | None:
    """Fills ctors[path]; for a class instance returns its grouping key (class name, code)."""
    if path in prog.layers:
        layer = prog.layers[path]
        leaf = path.rpartition(".")[2]
        ctors[path] = Ctor(layer.ctor(["{}"] * len(layer.fields)), [lit(v) for _, v in layer.fields],
                           [f"{leaf}_{n}" if not leaf.isdigit() else n for n, _ in layer.fields])
        return None
    kids = _children(paths, path)
    cls = prog.classes.get(path)
    if path and path not in prog.bodies and kids and all(k.rpartition(".")[2].isdigit() for k in kids) \
            and (cls is None or issubclass(cls, _CONTAINERS)):
        n = max(int(k.rpartition(".")[2]) for k in kids) + 1
        by_index = {int(k.rpartition(".")[2]): ctors[k] for k in kids}
        parts = [by_index.get(i) for i in range(n)]
        ctors[path] = Ctor("nnx.List([" + ", ".join(c.template if c else "None" for c in parts) + "])",
                           [v for c in parts if c for v in c.values], [v for c in parts if c for v in c.names])
        return None
    init, values, names = [], [], []
    for k in kids:
        c = ctors[k]
        init.append(f"self.{k.rpartition('.')[2]} = {c.template}")
        values += c.values
        names += c.names
    for s in (s for s in prog.raw if s.rpartition(".")[0] == path):
        t = prog.state[s]
        kind = "nnx.Param" if isinstance(t, torch.nn.Parameter) or t.requires_grad else (
            "nnx.BatchStat" if s in prog.updated else "Buffer")
        leaf = s.rpartition(".")[2]
        init.append(f"self.{leaf} = {kind}(jnp.zeros({{}}, {lit(t.dtype)}))")
        values.append(lit(tuple(t.shape)))
        names.append(f"{leaf}_shape")
    params, body = prog.bodies.get(path, (None, None)) if path else root_call
    base = root_name if path == "" else (cls.__name__ if cls is not None else "Module")
    ctors[path] = Ctor("", values, names)
    return (base, level, tuple(init), tuple(params or ()), tuple(body or ()), extra)


def _finish(key: tuple, named: tuple[str, list[str], list[str]], members: list[str], ctors: dict[str, Ctor]) -> str:
    """The class text; the values its instances differ in become constructor arguments."""
    name, init, names = named
    columns = list(zip(*[ctors[m].values for m in members])) if names else []
    slot_of: dict[tuple, str] = {}
    fills, args = [], []
    for j, col in enumerate(columns):
        if len(set(col)) == 1:
            fills.append(col[0])
            continue
        if col not in slot_of:
            arg, k = names[j], 2
            while arg in slot_of.values():
                arg, k = f"{names[j]}{k}", k + 1
            slot_of[col] = arg
            args.append((arg, col))
        fills.append(slot_of[col])
    lines, at = [], 0
    for ln in init:
        holes = ln.count("{}")
        lines.append(ln.format(*fills[at:at + holes]))
        at += holes
    _, _, _, params, body, extra = key
    head = ", ".join([a for a, _ in args] + ["*", "rngs: nnx.Rngs"])
    text = [f"class {name}(nnx.Module):", f"    def __init__(self, {head}):"]
    text += ["        " + ln for ln in lines] or ["        pass"]
    if body:
        text += ["", f"    def __call__(self, {', '.join(params)}):"] + ["        " + ln for ln in body]
    for method in extra:
        text += [""] + ["    " + ln if ln else "" for ln in method.splitlines()]
    for i, m in enumerate(members):
        kwargs = ", ".join(f"{a}={{}}" for a, _ in args)
        ctors[m].template = f"{name}({kwargs + ', ' if kwargs else ''}rngs=rngs)"
        ctors[m].values = [col[i] for _, col in args]
        ctors[m].names = [a for a, _ in args]
    return "\n".join(text)
