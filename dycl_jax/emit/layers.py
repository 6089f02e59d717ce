"""Standard Flax layers for torch leaf modules: recognition, constructor fields, raw-weight access."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

aten = torch.ops.aten

# the ops F.linear decomposes into (2-d and batched inputs)
_LINEAR_OPS = {aten.permute.default, aten.t.default, aten.addmm.default, aten.mm.default, aten.view.default,
               aten._unsafe_view.default, aten.add.Tensor, aten.matmul.default, aten.linear.default,
               aten.expand.default, aten.bmm.default, aten.clone.default}


@dataclass
class Layer:
    """One standard layer instance: its module path, constructor fields, and how it is called."""

    kind: str
    path: str
    fields: list[tuple[str, Any]]  # (field name, value) in constructor order

    def ctor(self, values: list[str]) -> str:
        """Constructor text, given each field's value as text (a literal or a constructor argument)."""
        v = dict(zip([n for n, _ in self.fields], values))
        extra = "".join(f", {n}={v[n]}" for n, _ in self.fields if n in _OPTIONAL[self.kind])
        head = ", ".join(v[n] for n in _POSITIONAL[self.kind])
        return f"{_CLASS[self.kind]}({head}{extra}{_FIXED[self.kind]}, rngs=rngs)"

    def call(self, ref: str, arg: str) -> str:
        # nnx.Conv is channels-last; the emitted program keeps torch's NCHW around it
        return f"conv_nchw({ref}, {arg})" if self.kind == "conv" else f"{ref}({arg})"


_CLASS = {"conv": "nnx.Conv", "linear": "nnx.Linear", "batch_norm": "nnx.BatchNorm", "layer_norm": "nnx.LayerNorm",
          "embed": "nnx.Embed"}
_POSITIONAL = {"conv": ("in_features", "out_features", "kernel_size"), "linear": ("in_features", "out_features"),
               "batch_norm": ("num_features",), "layer_norm": ("num_features",),
               "embed": ("num_embeddings", "features")}
_OPTIONAL = {"conv": ("strides", "padding", "kernel_dilation", "feature_group_count", "use_bias"),
             "linear": ("use_bias",), "batch_norm": ("epsilon", "momentum"), "layer_norm": ("epsilon",), "embed": ()}
_FIXED = {"conv": "", "linear": "", "batch_norm": ", axis=1, use_running_average=True", "layer_norm": "", "embed": ""}
# torch parameter name -> (Flax attribute, text turning the Flax value back into torch's layout)
TORCH_NAMES = {
    "conv": {"weight": ("kernel", "{}.transpose(3, 2, 0, 1)"), "bias": ("bias", "{}")},
    "linear": {"weight": ("kernel", "{}.T"), "bias": ("bias", "{}")},
    "batch_norm": {"weight": ("scale", "{}"), "bias": ("bias", "{}"), "running_mean": ("mean", "{}"),
                   "running_var": ("var", "{}")},
    "layer_norm": {"weight": ("scale", "{}"), "bias": ("bias", "{}")},
    "embed": {"weight": ("embedding", "{}")},
}


def _pair(v: Any) -> Any:
    v = tuple(v)
    return v[0] if len(set(v)) == 1 else v


def _conv(path: str, nodes: list, state: Callable[[Any], str | None], shape: Callable[[str], tuple]) -> list | None:
    convs = [n for n in nodes if n.target is aten.convolution.default]
    if len(convs) != 1 or len(nodes) != 1:
        return None  # padding modes other than zeros add a pad op before the convolution
    x, w, b, stride, padding, dilation, transposed, _, groups = convs[0].args
    if transposed or len(stride) != 2 or state(w) != f"{path}.weight" or (b is not None and state(b) != f"{path}.bias"):
        return None
    o, i, kh, kw = shape(f"{path}.weight")
    fields = [("in_features", i * groups), ("out_features", o), ("kernel_size", (kh, kw)), ("strides", _pair(stride)),
              ("padding", tuple((p, p) for p in padding))]
    if tuple(dilation) != (1, 1):
        fields.append(("kernel_dilation", _pair(dilation)))
    if groups != 1:
        fields.append(("feature_group_count", groups))
    if b is None:
        fields.append(("use_bias", False))
    return fields


def _linear(path: str, nodes: list, state: Callable[[Any], str | None], shape: Callable[[str], tuple]) -> list | None:
    if any(n.target not in _LINEAR_OPS for n in nodes):
        return None
    used = {state(a) for n in nodes for a in n.args if state(a)}
    if f"{path}.weight" not in used or not used <= {f"{path}.weight", f"{path}.bias"}:
        return None
    o, i = shape(f"{path}.weight")
    return [("in_features", i), ("out_features", o)] + ([] if f"{path}.bias" in used else [("use_bias", False)])


def _batch_norm(path: str, nodes: list, state: Callable[[Any], str | None], shape: Callable[[str], tuple]) -> list | None:
    bn = [n for n in nodes if n.target is aten._native_batch_norm_legit_no_training.default]
    if len(bn) != 1 or any(n is not bn[0] and not (n.target.__name__ == "getitem" and n.args[1] == 0) for n in nodes):
        return None
    _, w, b, mean, var, momentum, eps = bn[0].args
    names = [state(v) for v in (w, b, mean, var)]
    if names != [f"{path}.{k}" for k in ("weight", "bias", "running_mean", "running_var")]:
        return None
    return [("num_features", shape(f"{path}.weight")[0]), ("epsilon", eps), ("momentum", round(1 - momentum, 8))]


def _layer_norm(path: str, nodes: list, state: Callable[[Any], str | None], shape: Callable[[str], tuple]) -> list | None:
    ln = [n for n in nodes if n.target is aten.native_layer_norm.default]
    if len(ln) != 1 or any(n is not ln[0] and not (n.target.__name__ == "getitem" and n.args[1] == 0) for n in nodes):
        return None
    _, normalized, w, b, eps = ln[0].args
    if len(normalized) != 1 or state(w) != f"{path}.weight" or state(b) != f"{path}.bias":
        return None
    return [("num_features", normalized[0]), ("epsilon", eps)]


def _embed(path: str, nodes: list, state: Callable[[Any], str | None], shape: Callable[[str], tuple]) -> list | None:
    if len(nodes) != 1 or nodes[0].target is not aten.embedding.default or state(nodes[0].args[0]) != f"{path}.weight":
        return None
    n, d = shape(f"{path}.weight")
    return [("num_embeddings", n), ("features", d)]


_MATCHERS = {torch.nn.Conv2d: ("conv", _conv), torch.nn.Linear: ("linear", _linear),
             torch.nn.BatchNorm1d: ("batch_norm", _batch_norm), torch.nn.BatchNorm2d: ("batch_norm", _batch_norm),
             torch.nn.BatchNorm3d: ("batch_norm", _batch_norm), torch.nn.LayerNorm: ("layer_norm", _layer_norm),
             torch.nn.Embedding: ("embed", _embed)}


def match(cls: type, path: str, nodes: list, state: Callable[[Any], str | None],
          shape: Callable[[str], tuple], float32: Callable[[str], bool]) -> Layer | None:
    """The standard layer a call of torch class `cls` at `path` is, if one fits exactly."""
    kind, matcher = _MATCHERS.get(cls, (None, None))
    if matcher is None or not float32(path):
        return None  # Flax layers are built in float32 here; other dtypes keep their jnp code
    fields = matcher(path, nodes, state, shape)
    return None if fields is None else Layer(kind, path, fields)
