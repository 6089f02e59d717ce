"""The fuzzer's module attributes: values the forward keeps on `self` (a Python int counter, a
tensor) and assigns in branches and loops, read back by tests, by later statements and by the
return."""
from __future__ import annotations

import random


class Attributes:
    """`self.k` (an int) and `self.t` (a 0-d tensor), set at the start of every call (so no state
    carries from one call to the next), then changed and read where the generator puts simple
    statements and tests. Drawn from their own stream (`rng`), so a program that does not use
    them is the one its seed made before."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def prelude(self) -> list[str]:
        return ["self.k = 0", "self.t = h.sum() * 0.0"]

    def outputs(self) -> dict[str, str]:
        return {"k": "self.k", "t": "self.t * 1.0"}

    def wanted(self) -> bool:
        return self.rng.random() < 0.3

    def pred(self) -> str:
        return self.rng.choice([f"self.k > {self.rng.randrange(0, 3)}", "self.t > 0.5", "self.t.item() < -0.25"])

    def statement(self) -> str:
        return self.rng.choice([
            "self.k += 1", "self.k = (self.k * 2 + 1) % 7", "self.t = self.t + h.mean()", "self.t = self.t * 0.5",
            "h = h + self.t * 0.1", "s = s + self.k", "self.t = self.t - self.k * 0.25",
        ])
