"""Small dynamic-network example models, written the way research code writes them.

Every model module here defines:

- the model class(es), written without any regard for a converter (``.item()``, Python
  ints for exit ids, ``if tensor:`` conditions, ``break``/``continue``/early ``return``,
  side effects on ``self``, numpy on the side);
- ``example() -> (model, args)``: a seeded, eval-mode model and one argument tuple, batch 1
  unless the module sets ``BATCH``;
- ``inputs(n, seed=0) -> list[tuple]``: ``n`` argument tuples chosen so that every path in
  ``PATHS`` is taken at least once over ``inputs(50)``;
- ``PATHS``: the path labels that must all be covered;
- ``path_of(model, args) -> tuple``: the labels one call takes, read from the outputs or from
  forward hooks that count submodule calls (never from the converter).
"""

from __future__ import annotations

import contextlib
import importlib
from collections import Counter
from types import ModuleType
from typing import Iterator

import torch
from torch import nn

MODELS = (
    "shallow_deep",
    "skipnet_ff",
    "skipnet_rnn",
    "blockdrop",
    "deebert",
    "pabee",
    "act",
    "anytime_msdnet",
    "energy_selector",
    "nested_while_if",
    "while_modulelist",  # a counted `while` over a ModuleList: staged as a static `for` (counted_while.py)
    "numpy_fallback",  # `np.argmax([c.item() for c in cs])`: a tensor argmax when staged (host_values.py)
    "skip_logging",  # a list only appended to, never read: dropped (unread_lists.py)
)

# Output shapes or structure depend on the data (decode loops, shape-changing branches,
# data-dependent indexing, sizes read with `.tolist()`): these need per-call dispatch rather
# than one trace, unless a padded form holds them (below).
DISPATCH_MODELS = (
    "captioning",
    "captioning_teacher",
    "greedy_nmt",
    "shape_branch",
)

# Of those, the ones `host="auto"` stages as one padded program (convert._padded): a decode loop
# that its own Python bound ends within 16 iterations, a branch whose paths return different
# shapes; calls trim the padding, so results stay exact. `host="dispatch"` still runs them.
PADDED_MODELS = ("captioning", "greedy_nmt", "shape_branch")

# Data-dependent row selections (`nonzero` gather, compute, scatter) that stage as one program
# through their bounded form: every row computed, the selected ones kept (rewrite/rows.py).
BOUNDED_MODELS = ("moe",)

# Control flow on tensors built from Python constants (``torch.tensor(1)`` flags).
CONSTANT_FLAG_MODELS = ("sdn_published",)


def load(name: str) -> ModuleType:
    """The example module ``examples.dynn.<name>``."""
    known = MODELS + DISPATCH_MODELS + BOUNDED_MODELS + CONSTANT_FLAG_MODELS
    if name not in known:
        raise KeyError(f"unknown example {name!r}; known: {', '.join(known)}")
    return importlib.import_module(f"{__name__}.{name}")


@contextlib.contextmanager
def count_calls(model: nn.Module, names: list[str]) -> Iterator[Counter]:
    """Count forward calls of the named submodules while the block runs.

    Hooks rather than re-running the model's logic: the counts then describe what the
    original forward actually executed.
    """
    counts: Counter = Counter({name: 0 for name in names})
    modules = dict(model.named_modules())
    handles = []
    for name in names:
        def hook(module, args, output, name=name):
            counts[name] += 1
        handles.append(modules[name].register_forward_hook(hook))
    try:
        yield counts
    finally:
        for handle in handles:
            handle.remove()


def seeded(seed: int) -> contextlib.AbstractContextManager:
    """A local torch RNG seeded with ``seed``, so building an example leaves global state alone."""
    @contextlib.contextmanager
    def scope():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    return scope()


def image_inputs(n: int, seed: int = 0, *, log_scale: tuple[float, float] = (-1.0, 1.0),
                 texture: float = 0.2, noise_every_other: bool = True) -> list[tuple]:
    """``n`` one-image argument tuples (1x3x16x16) at random scales exp(U(log_scale)).

    Textured noise (every other input, if ``noise_every_other``) and flat colour patches with
    some texture on top move pooled features, and so the models' gates and exits, to both
    sides of their decision boundaries.
    """
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        scale = float(torch.exp(torch.empty(()).uniform_(*log_scale, generator=g)))
        if noise_every_other and i % 2 == 0:
            x = torch.randn(1, 3, 16, 16, generator=g)
        else:
            x = torch.randn(1, 3, 1, 1, generator=g) + texture * torch.randn(1, 3, 16, 16, generator=g)
        out.append((x * scale,))
    return out


def blocks_ran(model: nn.Module, args: tuple, names: tuple[str, ...]) -> tuple:
    """``(name, ran)`` for each named submodule: whether one call of ``model`` executed it."""
    with torch.no_grad(), count_calls(model, list(names)) as calls:
        model(*args)
    return tuple((name, calls[name] > 0) for name in names)
