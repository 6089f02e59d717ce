"""The fuzzer's run-time aliases: names bound to another name's object inside branches and loops, and objects chosen by a test."""
from __future__ import annotations

import random


class Rebinds:
    """Statements that make one name another's object where a tensor test decides whether they
    run (`a = v` in a branch, `t = a if p else v`), then update it in place; and a test that
    chooses the list a value is appended to (`(outs if p else spare).append(...)`). torch's
    update reaches every name of the object on the paths that bound it. Drawn from their own
    stream (`rng`), so a program that does not use them is the one its seed made before."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def prelude(self) -> list[str]:
        return ["spare = []"]

    def outputs(self) -> dict[str, str]:
        return {"ns": "len(spare)"}

    def wanted(self) -> bool:
        return self.rng.random() < 0.25

    def statement(self, pred: str) -> str:
        r = self.rng
        return r.choice([
            "a = v", "v = a", "a = v[:, :]", "t = a if " + pred + " else v; t.mul_(0.5)",
            "(a if " + pred + " else v).add_(0.25)", "(outs if " + pred + " else spare).append(h.sum())",
            "(spare if " + pred + " else outs).append(h.mean())", "a.add_(0.5)", "v.mul_(1.5)",
        ])
