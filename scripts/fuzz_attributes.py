"""The fuzzer's module attributes: values the forward keeps on `self` (a Python int counter, a
tensor, an item of a dict) and assigns in branches and loops, directly or through helper methods,
read back by tests, by later statements and by the return."""
from __future__ import annotations

import random


class Attributes:
    """`self.k` (an int), `self.t` (a 0-d tensor) and `self.stats["m"]` (a 0-d tensor in a dict),
    set at the start of every call (so no state carries from one call to the next), then changed
    and read where the generator puts simple statements and tests, also by the helper methods
    `bump` (no branch: not rewritten) and `note` (a branch of its own). Drawn from their own
    stream (`rng`), so a program that does not use them is the one its seed made before."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        # half the programs: helper methods use `k` and `stats` too, so the forward keeps them on the
        # module (no local of its own) and the dispatch host carries them; else they are its locals
        self.helpers = rng.random() < 0.5

    def prelude(self) -> list[str]:
        return ["self.k = 0", "self.t = h.sum() * 0.0", "self.stats = {'m': h.sum() * 0.0}"]

    def methods(self) -> list[str]:
        """Helper methods of the fuzzed module (four-space indented, inside the class)."""
        if not self.helpers:
            return []
        return ["    def bump(self, n):", "        self.k = self.k + n", "",
                "    def note(self, h):", "        if h.mean() > 0:", "            self.stats['m'] = self.stats['m'] + h.mean()",
                "        else:", "            self.stats['m'] = self.stats['m'] * 0.5", "        return h", ""]

    def outputs(self) -> dict[str, str]:
        return {"k": "self.k", "t": "self.t * 1.0", "m": "self.stats['m'] * 1.0"}

    def wanted(self) -> bool:
        return self.rng.random() < 0.3

    def pred(self) -> str:
        return self.rng.choice([f"self.k > {self.rng.randrange(0, 3)}", "self.t > 0.5", "self.t.item() < -0.25",
                                "self.stats['m'] > 0.1"])

    def statement(self) -> str:
        if self.helpers and self.rng.random() < 0.4:
            return self.rng.choice(["self.bump(1)", "h = self.note(h)", "self.bump(self.k % 3)"])
        return self.rng.choice([
            "self.k += 1", "self.k = (self.k * 2 + 1) % 7", "self.t = self.t + h.mean()", "self.t = self.t * 0.5",
            "h = h + self.t * 0.1", "s = s + self.k", "self.t = self.t - self.k * 0.25",
            "self.stats['m'] = h.mean()", "h = h + self.stats['m'] * 0.1",
        ])
