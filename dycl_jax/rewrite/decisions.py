"""One recorded decision: a (site, value) pair that also carries the predicate's margin."""
from __future__ import annotations

import math
from typing import Any


class Decision(tuple):
    """`(site, value)`, as the decision lists of `jm.trace` and `run_torch_trace` have always been
    (it unpacks, indexes and compares equal like that pair), plus `.margin`: how far the
    predicate's compared quantity is from flipping the decision.

    The margin is the smallest |lhs - rhs| (between integers: the smallest whole change that
    flips it, so `2 > 2` has margin 1) over the comparisons (`>`, `>=`, `<`, `<=`, `==`,
    `!=`; elementwise ones over every element) whose results reach the predicate through boolean
    or integer values only (`and`/`or`/`not`, counts like `(h > 0).sum()`, an elif chain's path
    index); a float tested for truth counts as its own |value|. A decision with nothing of the
    kind behind it (a flag from a Python value, a region run in torch) has margin `nan`: unknown.
    Comparisons on the float side of a cast (`(h > 0).float().mean() > 0.5` counts only
    |mean - 0.5|) and argmax ties are not margins.
    """

    margin: float

    def __new__(cls, site: str, value: Any, margin: float = math.nan) -> "Decision":
        self = super().__new__(cls, (site, value))
        self.margin = float(margin)
        return self

    @property
    def site(self) -> str:
        return self[0]

    @property
    def value(self) -> Any:
        return self[1]

    def __repr__(self) -> str:
        return f"Decision({self[0]!r}, {self[1]!r}, margin={self.margin:.3g})"

    def __reduce__(self) -> tuple:
        return (Decision, (self[0], self[1], self.margin))
