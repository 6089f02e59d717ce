"""Input specs from the command line: `--input-shape 1x3x224x224 --dtype float32`, `--example f.pt`."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dycl_jax.errors import UsageError

_SHAPE = re.compile(r"^(\d+(x\d+)*)?$")
# dtype names accepted by --dtype (torch's own names), and the range random integers come from
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
INT_HIGH = 10  # random integer inputs are uniform in [0, INT_HIGH): valid token ids and indices for small tables


@dataclass(frozen=True)
class InputSpec:
    """One tensor input: its shape and torch dtype name."""

    shape: tuple[int, ...]
    dtype: str

    def describe(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


def parse_shape(text: str) -> tuple[int, ...]:
    """`1x3x224x224` → (1, 3, 224, 224); `""` is a 0-d tensor."""
    if not _SHAPE.match(text.strip()):
        raise UsageError(f"bad shape {text!r}", fix="write sizes separated by x, e.g. --input-shape 1x3x224x224")
    return tuple(int(d) for d in text.strip().split("x")) if text.strip() else ()


def parse_dtype(text: str) -> str:
    name = text.strip().removeprefix("torch.")
    if name not in DTYPES:
        raise UsageError(f"unknown dtype {text!r}", fix=f"use one of {', '.join(DTYPES)}")
    return name


def input_specs(shapes: list[str], dtypes: list[str]) -> list[InputSpec]:
    """One spec per --input-shape; one --dtype for all of them, one per shape, or float32."""
    if not shapes:
        if dtypes:
            raise UsageError("--dtype given without --input-shape", fix="give one --input-shape per input")
        return []
    names = [parse_dtype(d) for d in dtypes] or ["float32"]
    if len(names) == 1:
        names = names * len(shapes)
    if len(names) != len(shapes):
        raise UsageError(f"{len(shapes)} --input-shape but {len(dtypes)} --dtype",
                         fix="give one --dtype for all inputs, or one per --input-shape, in the same order")
    return [InputSpec(parse_shape(s), d) for s, d in zip(shapes, names)]


def specs_of(args: tuple) -> list[InputSpec]:
    """The specs of a tuple of tensors (an --example file), to draw more inputs like it."""
    return [InputSpec(tuple(a.shape), str(a.dtype).removeprefix("torch.")) for a in args]


def random_inputs(specs: list[InputSpec], seed: int) -> tuple[Any, ...]:
    """One argument tuple: floats standard normal, integers in [0, INT_HIGH), bools fair coins."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for s in specs:
        dtype = getattr(torch, s.dtype)
        if dtype == torch.bool:
            out.append(torch.randint(0, 2, s.shape, generator=g).bool())
        elif dtype.is_floating_point:
            out.append(torch.randn(s.shape, generator=g).to(dtype))
        else:
            out.append(torch.randint(0, INT_HIGH, s.shape, generator=g).to(dtype))
    return tuple(out)


def load_example(path_text: str) -> tuple[Any, ...]:
    """A saved tensor or tuple/list of tensors (`torch.save((x, mask), "example.pt")`)."""
    import torch

    path = Path(path_text)
    if not path.is_file():
        raise UsageError(f"{path_text}: no such file", fix="pass a file written by torch.save((x, ...), PATH)")
    try:
        value = torch.load(path, weights_only=True)
    except Exception as exc:  # noqa: BLE001  (any unreadable file is the user's input)
        raise UsageError(f"{path_text}: not a torch.save file of tensors ({type(exc).__name__}: {exc})".split("\n")[0],
                         fix="save a tuple of tensors with torch.save((x, ...), PATH)") from None
    args = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not args or not all(isinstance(a, torch.Tensor) for a in args):
        raise UsageError(f"{path_text}: holds {type(value).__name__}, not a tensor or a tuple of tensors",
                         fix="save a tuple of tensors with torch.save((x, ...), PATH)")
    return args
