"""Emitted source of a dispatch-host model converted with `train=True`: each compiled region method
takes its own key and writes the statistics it updates; the root call hands out the region keys.

The live host (host/training.py) gives the n-th compiled region call of a host call the key
`fold_in(key, n)`, and the region's random ops draw `fold_in(region key, i)` in trace order. The
emitted module does the same: `region_key()` (module level, written into the file) returns the
next region key of the call that is running, which the root `__call__` starts from its `key=`
(or its `rngs`), so `model(x, key=k)` draws what `jm(x, key=k)` draws. The key stream lives at
module level because submodules' host methods are called from the user's code, which passes no
key; a call stack keeps nested or re-entrant calls apart.
"""
from __future__ import annotations

from dycl_jax.emit.ops import KEYS

KEY = "_region_key"  # a train-mode region method's last parameter: its region key
NEXT = "region_key()"  # the host's argument for it at every compiled region call
# a method choosing among versions takes the function instead, and draws only where it has a
# version for the call (where it has none, the live host runs no program, so draws no key)
NEXT_FN, NEXT_PARAM = "region_key", "_next_key"

REGION_KEYS = '''_CALLS = []  # per train-mode call running now: [its key, region calls so far]


def region_key():
    """The next compiled region's key: the n-th region call of a call draws from fold_in(key, n),
    as the converted model's dispatch host does."""
    if not _CALLS:
        raise ValueError("a train-mode region ran outside a call of the model: call the loaded model "
                         "itself (with key= or rngs=), which hands out its regions' keys")
    call = _CALLS[-1]
    call[1] += 1
    return jax.random.fold_in(call[0], call[1] - 1)'''


def keyed_root(params: list[str], lines: list[str]) -> tuple[list[str], list[str]]:
    """The root `__call__` taking `key=` (else drawing from `rngs=` or the module's rngs) and
    running its body with that call's region keys."""
    start = (f"_CALLS.append([key if key is not None else (rngs if rngs is not None else self.rngs).dropout(), 0])"
             "  # this call's regions draw from key, as jm(x, key=key)")
    body = ["try:", *("    " + ln for ln in lines or ["pass"]), "finally:", "    _CALLS.pop()"]
    return [*params, "*", "key=None", "rngs=None"], [start, *body]


def keyed_body(lines: list[str], keyed: bool) -> list[str]:
    """A region method's body: where it draws random numbers, its ops draw from its key."""
    return [f"{KEYS} = RandomKeys({KEY})", *lines] if keyed else lines
