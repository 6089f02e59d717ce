"""The emitted file: header and helpers, the classes, the loader; and the weights beside it."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind

from dycl_jax.emit import hierarchy
from dycl_jax.emit.bodies import Body
from dycl_jax.emit.classes import build_classes
from dycl_jax.emit.layers import TORCH_NAMES
from dycl_jax.emit.ops import HELPERS, KEYS, Expr, lit
from dycl_jax.emit.program import Program
from dycl_jax.errors import DyclError, decode_bound_error
from dycl_jax.rewrite.padding import Decoded, Padded

WEIGHTS = "model.safetensors"

_HEADER = '''"""{model} converted from PyTorch by dycl_jax: Flax NNX modules, torch's NCHW layout.

`model = load()` builds it with the weights stored beside this file (torch names, converted
to Flax layouts once, at load) and returns an `nnx.Module`: call it like the torch method.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
from flax import nnx


class Buffer(nnx.Variable):
    """A torch buffer or tensor constant: state, not trained."""


def conv_nchw(conv, x):
    """An nnx.Conv (channels-last) applied to an NCHW array."""
    return conv(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
'''

# a train-mode program with random ops: its key stream and torch's dropout
_RANDOM = '''

class RandomKeys:
    """One call's random keys: the n-th random op the call traces draws `fold_in(key, n)`.

    The count is a Python int (random ops inside `jax.lax.cond` branches draw from it too, counted
    as they are traced); a loop carries a key of its own, drawn where it starts. So a call is
    reproducible from its key: `model(x, key=k)` draws what the converted model's
    `jm(x, key=k)` draws.
    """

    def __init__(self, key, drawn=None):
        self.key, self.drawn = key, drawn if drawn is not None else [0]

    def __call__(self):
        self.drawn[0] += 1
        return jax.random.fold_in(self.key, self.drawn[0] - 1)

    def loop(self, loop_key):
        """A loop iteration's keys, from the key the loop carries; the count goes on (keys never repeat)."""
        return RandomKeys(jax.random.fold_in(loop_key, 1), self.drawn)


def dropout(x, p, key):
    """torch's dropout in training mode: each value zeroed with probability p, the rest scaled by 1/(1-p)."""
    keep = jax.random.bernoulli(key, 1.0 - p, x.shape)
    return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - p), x.dtype), jnp.zeros((), x.dtype))
'''

_LOADER = '''
# torch parameter name -> (Flax attribute, conversion from torch's layout)
_LAYOUT = {{
    nnx.Conv: {{"weight": ("kernel", lambda w: w.transpose(2, 3, 1, 0)), "bias": ("bias", None)}},
    nnx.Linear: {{"weight": ("kernel", lambda w: w.T), "bias": ("bias", None)}},
    nnx.BatchNorm: {{"weight": ("scale", None), "bias": ("bias", None), "running_mean": ("mean", None),
                    "running_var": ("var", None)}},
    nnx.LayerNorm: {{"weight": ("scale", None), "bias": ("bias", None)}},
    nnx.Embed: {{"weight": ("embedding", None)}},
}}


def load(path=None{rngs_arg}):
    """{root} with the weights in `path` (default: {weights} beside this file){rngs_doc}."""
    path = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "{weights}")
    model = nnx.eval_shape(lambda: {root}(rngs=nnx.Rngs(0)))  # shapes only: the values come from the file
    for name, w in safetensors.numpy.load_file(path).items():
        *parents, leaf = name.split(".")
        module = model
        for p in parents:
            module = module[int(p)] if p.isdigit() else getattr(module, p)
        attr, convert = _LAYOUT.get(type(module), {{}}).get(leaf, (leaf, None))
        var, value = getattr(module, attr), jnp.asarray(convert(w) if convert else w)
        if var.get_raw_value().shape != value.shape:
            raise ValueError(f"{{name}}: stored shape {{value.shape}}, model expects {{var.get_raw_value().shape}}")
        var.set_raw_value(value)
    missing = [k for k, v in nnx.state(model).flat_state() if isinstance(v.get_raw_value(), jax.ShapeDtypeStruct)]
    if missing:
        raise ValueError(f"{{path}} has no values for {{missing}}")
{rngs_set}    return model
'''
# the loader of a module whose calls draw random numbers: the Rngs a call without key= draws from
_RNGS = (", rngs=None", "; `rngs`: the nnx.Rngs a call without key= or rngs= draws its key from (default nnx.Rngs(0))",
         "    model.rngs = rngs if rngs is not None else nnx.Rngs(0)\n")


@dataclass
class EmitInput:
    """What emission needs from a staged conversion: the exported graph and the model's classes."""

    ep: Any  # torch.export.ExportedProgram (decomposed)
    state: dict[str, torch.Tensor]  # torch path -> tensor
    classes: dict[str, type]  # module path -> torch class ("" is the model)
    input_names: list[str]
    out_spec: pytree.TreeSpec
    model_name: str
    x64: bool
    # a train=True conversion: the state paths its graph's first outputs update (torch.export's
    # buffer mutations, in output order); parameters by path (weights come back as plain tensors)
    mutations: tuple[str, ...] = ()
    params: frozenset[str] = frozenset()


def _tree(spec: pytree.TreeSpec, leaves: list[str]) -> str:
    if spec.is_leaf():
        return leaves.pop(0)
    kids = [_tree(c, leaves) for c in spec.children()]
    if spec.type is Padded:  # a padded program's value of per-input shape (rewrite/padding.py)
        return f"trim_padded({kids[0]}, {kids[1]})"
    if spec.type is tuple:
        return "(" + ", ".join(kids) + ("," if len(kids) == 1 else "") + ")"
    if spec.type is list:
        return "[" + ", ".join(kids) + "]"
    if spec.type is dict:
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(spec.context, kids)) + "}"
    raise DyclError(f"emitted source: the method returns a {spec.type.__name__}",
                    fix="return tuples, lists or dicts of tensors")


def state_refs(ep: Any) -> tuple[dict[Any, str], list[Any]]:
    """({placeholder: torch state path} for the state inputs, [user input placeholders]) of an exported program."""
    placeholders = [n for n in ep.graph_module.graph.nodes if n.op == "placeholder"]
    refs, user = {}, []
    for node, spec in zip(placeholders, ep.graph_signature.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            user.append(node)
        else:
            refs[node] = spec.target[2:] if spec.target.startswith("m.") else spec.target
    return refs, user


def emit_source(inp: EmitInput) -> tuple[str, dict[str, np.ndarray]]:
    """The emitted module's text and the weights it loads (torch names and layouts)."""
    if inp.x64:
        raise DyclError("emitted source: this program needs 64-bit integers (see `jm.x64`), which the emitted "
                        "module does not enable", fix="use the in-memory JaxModel, or `jm.export` for deployment")
    gm = inp.ep.graph_module
    refs, user = state_refs(inp.ep)
    prog = Program(gm, inp.classes, inp.state, refs, inp.mutations)
    body = Body(prog, "", gm)
    params = []
    for node, name in zip(user, inp.input_names):
        name = body.fresh(name if name.isidentifier() else "x", node)
        params.append(name)
        body.env[node] = Expr(name)
        body.lines.append(f"{name} = jnp.asarray({name})")
    items = hierarchy.build([n for n in gm.graph.nodes if n.op == "call_function"], "", prog.inline, prog.classes)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    exprs = body.run(items, list(out_node.args[0]))
    # a train-mode call writes the statistics it updated (BatchNorm's) into the module, as jm(...) does
    body.lines += [f"{prog.state_expr(path, '')} = {lit(e)}" for path, e in zip(inp.mutations, exprs)]
    leaves = [lit(e) for e in exprs[len(inp.mutations):]]
    if body.keyed:
        if inp.out_spec.type is Decoded:
            raise DyclError("emitted source: a padded program (an unrolled loop) that draws random numbers",
                            fix="use the in-memory JaxModel, or convert with host=\"dispatch\" to emit it")
        prog.keyed_calls.add("")
        params += ["*", "key=None", "rngs=None"]
        body.lines.insert(0, f"{KEYS} = RandomKeys(key if key is not None else (rngs if rngs is not None else "
                             "self.rngs).dropout())  # this call's random ops draw from key, as jm(x, key=key)")
    if inp.out_spec.type is Decoded:
        call, padded = _padded_call(inp.out_spec, leaves, params, body.lines)
        return assemble(prog, inp.model_name, call, inp.state, methods={"": [padded]})
    return assemble(prog, inp.model_name, (params, body.lines + [f"return {_tree(inp.out_spec, leaves)}"]),
                    inp.state)


def _padded_call(spec: pytree.TreeSpec, leaves: list[str], params: list[str],
                 lines: list[str]) -> tuple[tuple[list[str], list[str]], str]:
    """A method with an unrolled loop (a `Decoded` result, rewrite/padding.py): its program as the
    jitted method `padded` (the result's arrays flat, a value of per-input shape followed by its
    lengths, then whether the input needed more iterations than the program has), and a
    `__call__` that checks the bound and cuts each value to its lengths, as jm(...) does."""
    args = ", ".join(params)
    padded = "\n".join(
        ["@nnx.jit", f"def padded(self, {args}):",
         '    """The padded program (jittable): the result\'s arrays flat, then the decode bound\'s flag."""',
         *["    " + ln for ln in lines], f"    return ({', '.join(leaves)},)"])
    out = [f"out[{i}]" for i in range(len(leaves) - 1)]
    call = [f"out = self.padded({args})",
            "if isinstance(out[-1], jax.core.Tracer):  # the cut needs the lengths' values",
            "    raise TypeError('the exact outputs have data-dependent sizes, cut on the host: under jax.jit "
            "or jax.vmap call .padded(...), which returns the padded values, their lengths and the bound flag')",
            "if bool(np.any(np.asarray(out[-1]))):",
            f"    raise ValueError({str(decode_bound_error(spec.context))!r})",
            f"return {_tree(spec.children()[0], out)}"]
    return (params, call), padded


def assemble(prog: Program, model_name: str, root_call: tuple[list[str], list[str]], state: dict[str, torch.Tensor],
             methods: dict[str, list[str]] | None = None, functions: list[str] = ()) -> tuple[str, dict[str, np.ndarray]]:
    """The module's text (header, classes, module-level `functions`, loader) and the weights it loads."""
    emitted = build_classes(prog, model_name, root_call, methods)
    keyed = "" in prog.keyed_calls
    header = _HEADER.format(model=model_name) + (_RANDOM if keyed else "")
    code = "\n".join([*emitted.classes, *functions])
    helpers = [src for name, src in HELPERS.items() if re.search(rf"(?<![\w.]){name}\(", code)]
    text = "\n\n\n".join([header.rstrip("\n"), *helpers, *emitted.classes, *functions])
    rngs_arg, rngs_doc, rngs_set = _RNGS if keyed else ("", "", "")
    text += "\n\n" + _LOADER.format(root=emitted.root, weights=WEIGHTS, rngs_arg=rngs_arg, rngs_doc=rngs_doc,
                                     rngs_set=rngs_set)
    weights: dict[str, np.ndarray] = {}
    for path, layer in prog.layers.items():
        for leaf in TORCH_NAMES[layer.kind]:
            if f"{path}.{leaf}" in state:
                weights[f"{path}.{leaf}"] = state[f"{path}.{leaf}"].detach().cpu().numpy()
    for path in prog.raw:
        weights[path] = state[path].detach().cpu().numpy()
    return text, weights


def write(inp: EmitInput | tuple[str, dict[str, np.ndarray]], out_dir: str) -> str:
    """Writes out_dir/model.py and its weights (`inp`, or the text and weights made already); returns
    the path of model.py."""
    import safetensors.numpy  # the weight format of the emitted module

    text, weights = emit_source(inp) if isinstance(inp, EmitInput) else inp
    os.makedirs(out_dir, exist_ok=True)
    # (np.require, not np.ascontiguousarray: that makes a 0-d buffer 1-d, which load() then refuses)
    safetensors.numpy.save_file({k: np.require(v, requirements="C") for k, v in weights.items()},
                                os.path.join(out_dir, WEIGHTS))
    path = os.path.join(out_dir, "model.py")
    with open(path, "w") as f:
        f.write(text)
    return path
