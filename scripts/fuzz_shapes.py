"""The fuzzer's data-dependent-shape statements: growing sequences, `nonzero` and mask indexing, `.item()` sizes, host lists and numpy."""
from __future__ import annotations

import random

WIDTH = 6  # scripts/fuzz.py's feature width: h and v are float [2, WIDTH]


class Shapes:
    """Statements whose shapes or Python values depend on the data, the constructs that only the
    dispatch host runs exactly: `seq` (float [2, L]) grows by `torch.cat` and is trimmed by its own
    length, `toks` (a list of Python ints) takes `.item()` values, `nonzero` picks the columns an
    update writes, a boolean mask selects the values a sum reads, `.item()` bounds a slice, and
    `.tolist()` / numpy reduce values on the host. Drawn from their own stream (`rng`), so a
    program that does not use them is the one its seed made before they existed."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.numpy = False  # a statement calls numpy: the program imports it

    def prelude(self) -> list[str]:
        return ["seq = h[:, :1] * 1.0", "toks = []"]

    def outputs(self) -> dict[str, str]:
        return {"seq": "seq * 1.0", "nt": "len(toks)", "ts": "sum(toks)"}

    def wanted(self) -> bool:
        """Whether this statement (or test) is one of these."""
        return self.rng.random() < 0.3

    def statement(self) -> str:
        r = self.rng
        j, c = r.randrange(WIDTH), r.choice(["0.0", "0.3", "-0.3", "1.0"])
        forms = [
            f"seq = torch.cat([seq, h[:, {j}:{j + 1}] * 0.5], dim=1)",
            f"seq = torch.cat([seq, torch.tanh(seq[:, -1:]) + h[:, {j}:{j + 1}]], dim=1)",
            f"if seq.shape[1] > {r.randint(2, 4)}: seq = seq[:, 1:]",
            "h = h + seq.mean(1, keepdim=True)",
            "toks.append(int(h[0].argmax().item()))",
            f"toks.append(int((h > {c}).sum()))",
            f"sel = (h[0] > {c}).nonzero(as_tuple=True)[0]; h = h.clone(); h[:, sel] = torch.tanh(h[:, sel]) + 0.1",
            f"sel = (h[1] < {c}).nonzero(as_tuple=True)[0]\nif sel.numel() == 0: cnt = cnt + 1",
            f"outs.append(h[h > {c}].sum())",
            f"k = int((h[0] > {c}).sum().item()); h = torch.cat([h[:, :k] * 0.5, h[:, k:]], dim=1)",
            f"s += len([t for t in h[0].tolist() if t > {c}])",
            "s += int(np.argmax([t.item() for t in h[0]]))",
            "s += int(np.sum(np.array(toks) % 2)) if toks else 0",
        ]
        line = r.choice(forms)
        self.numpy |= "np." in line
        return line

    def pred(self) -> str:
        r = self.rng
        return r.choice([
            f"seq.shape[1] > {r.randint(1, 4)}", f"len(toks) > {r.randint(0, 2)}",
            f"(h[0] > {r.choice(['0.0', '0.5'])}).nonzero().numel() > {r.randint(1, 4)}",
            f"seq[:, -1].sum() > {r.choice(['0.0', '0.5', '-0.5'])}",
        ])
