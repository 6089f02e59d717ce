"""Small models with data-dependent control flow, one per construct the rewrite must handle."""
from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

log = logging.getLogger(__name__)


def _lin(i: int, o: int, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(i, o)


class EarlyExit(nn.Module):
    """Early return inside a loop over blocks, with the most confident head as fallback."""

    def __init__(self, thr: float = 0.7):
        super().__init__()
        self.blocks = nn.ModuleList(_lin(4, 4, k) for k in range(3))
        self.heads = nn.ModuleList(_lin(4, 3, 10 + k) for k in range(3))
        self.thr = thr

    def forward(self, x):
        best = torch.zeros(x.shape[0], 3)
        best_conf = -1.0
        best_i = -1
        for i, (blk, head) in enumerate(zip(self.blocks, self.heads)):
            x = x + torch.tanh(blk(x))
            out = head(x) * (1.0 + i)  # deeper heads are more confident
            conf = out.softmax(-1).max()
            if conf > self.thr:
                return out, i, True
            if conf > best_conf:
                best, best_conf, best_i = out, conf, i
        return best, best_i, False


class SkipGate(nn.Module):
    """Per-block gate: `if gate.item() > 0.5: x = block(x)`."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(_lin(4, 4, k) for k in range(3))
        self.gates = nn.ModuleList(_lin(4, 1, 20 + k) for k in range(3))

    def forward(self, x):
        for blk, gate in zip(self.blocks, self.gates):
            g = torch.sigmoid(gate(x.mean(0)))
            if g.item() > 0.5:
                x = torch.tanh(blk(x))
        return x


class ContinueSkip(nn.Module):
    """`if action.sum() == 0: ...; continue` inside a loop over blocks, with a Python counter."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(_lin(4, 4, k) for k in range(3))
        self.policy = nn.ModuleList(_lin(4, 1, 30 + k) for k in range(3))

    def forward(self, x):
        skipped = 0
        for i, blk in enumerate(self.blocks):
            action = (self.policy[i](x) > 0).float()
            if action.sum() == 0:
                skipped += 1
                continue
            x = x + torch.tanh(blk(x)) * action
        return x, skipped


class Patience(nn.Module):
    """PABEE-style patience counter: a Python int that differs per path, and `break`."""

    def __init__(self, patience: int = 1):
        super().__init__()
        self.blocks = nn.ModuleList(_lin(4, 4, k) for k in range(4))
        self.heads = nn.ModuleList(_lin(4, 3, 40 + k) for k in range(4))
        self.patience = patience

    def forward(self, x):
        count = 0
        prev = None
        logits = None
        for i, (blk, head) in enumerate(zip(self.blocks, self.heads)):
            x = torch.tanh(blk(x))
            logits = head(x)
            pred = logits.argmax(-1)
            if prev is not None and torch.all(pred == prev):
                count += 1
            else:
                count = 0
            prev = pred
            if count >= self.patience:
                break
        return logits, i


class ElifChain(nn.Module):
    """`if / elif / elif / else` on tensor predicates."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = _lin(4, 4, 50), _lin(4, 4, 51), _lin(4, 4, 52)

    def forward(self, x):
        s = x.mean()
        if s > 0.5:
            y = self.a(x)
        elif s > 0.0:
            y = self.b(x)
        elif s > -0.5:
            y = self.c(x)
        else:
            y = -x
        return y


class Halting(nn.Module):
    """ACT: `while (halting < 1 - eps).any() and n < max_steps`, a Python counter in the carry."""

    def __init__(self, max_steps: int = 6):
        super().__init__()
        self.cell = _lin(4, 4, 60)
        self.halt = _lin(4, 1, 61)
        self.max_steps = max_steps
        self.eps = 0.01

    def forward(self, x):
        halting = torch.zeros(x.shape[0])
        h = x
        n = 0
        while (halting < 1 - self.eps).any() and n < self.max_steps:
            p = torch.sigmoid(self.halt(h)).squeeze(-1)
            halting = halting + p
            h = torch.tanh(self.cell(h))
            n += 1
        return h, n, halting


class IfInWhile(nn.Module):
    """A dynamic `if` inside a dynamic `while`."""

    def __init__(self):
        super().__init__()
        self.f = _lin(4, 4, 70)

    def forward(self, x):
        h = x
        k = 0
        while h.norm() < 20.0 and k < 8:
            if h.sum() > 0:
                h = h * 1.5 + 0.1
            else:
                h = self.f(h) - 0.2
            k += 1
        return h, k


class Block(nn.Module):
    """A submodule whose forward branches on data."""

    def __init__(self, seed: int):
        super().__init__()
        self.lin = _lin(4, 4, seed)

    def forward(self, x):
        if x.abs().mean() > 0.5:
            return torch.relu(self.lin(x))
        return x * 2.0


class Stack(nn.Module):
    """Calls submodules with dynamic forwards; no control flow of its own."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block(80 + k) for k in range(2))
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return self.out(x)


def gate_fn(x, w):
    """A module-level helper with a dynamic branch."""
    if (x @ w).sum() > 0:
        return x @ w
    return -x


class Helpers(nn.Module):
    """A helper method with a dynamic if, and a module-level helper function."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4, generator=torch.Generator().manual_seed(90)))
        self.lin = _lin(4, 4, 91)

    def route(self, x):
        if x.max() > 1.0:
            x = self.lin(x)
        return x

    def forward(self, x):
        y = self.route(x)
        return gate_fn(y, self.w)


class Ternary(nn.Module):
    """`a if c else b` and `and` / `or` / `not` on tensors."""

    def __init__(self):
        super().__init__()
        self.a, self.b = _lin(4, 4, 100), _lin(4, 4, 101)

    def forward(self, x):
        y = self.a(x) if x.sum() > 0 else self.b(x)
        if (y.mean() > 0 and y.max() < 2.0) or not (x.min() > -1.0):
            y = y * 3.0
        return y


class Replaced(nn.Module):
    """Replaces its own forward in __init__: the converted method is what Python calls."""

    def __init__(self):
        super().__init__()
        self.lin = _lin(4, 4, 110)
        self.forward = self.fast

    def forward(self, x):  # never called on instances
        return x

    def fast(self, x):
        if x.sum() > 0:
            x = self.lin(x)
        return x * 2


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = _lin(4, 4, 120)

    def forward(self, x):
        return self.lin(x)


class Derived(Base):
    """`super().forward(x)` inside a dynamic branch."""

    def forward(self, x):
        if x.mean() > 0:
            return super().forward(x) + 1.0
        return x - 1.0


class SideEffects(nn.Module):
    """print, logging, a `self.` list and a counter on self: dropped with a warning."""

    def __init__(self):
        super().__init__()
        self.lin = _lin(4, 4, 130)
        self.saved = []
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        if y.sum() > 0:
            print("positive", y.sum())
            log.info("positive branch")
            self.saved.append(y)
            y = y * 2
        return y


# ---------------------------------------------------------------- research-style patterns (examples/dynn)

class SkipReshape(nn.Module):
    """BlockDrop: `if <all actions zero>: x = residual; continue` in a loop whose first block
    of each stage widens the features: both complete paths agree, the `if` alone does not."""

    def __init__(self):
        super().__init__()
        self.policy = _lin(4, 4, 200)
        self.down = nn.ModuleList([_lin(4, 6, 201), _lin(6, 8, 202)])
        self.blocks = nn.ModuleList([_lin(4, 6, 203), _lin(6, 6, 204), _lin(6, 8, 205), _lin(8, 8, 206)])

    def forward(self, x):
        policy = (self.policy(x) > 0).float()
        t = 0
        for stage in range(2):
            for b in range(2):
                action = policy[:, t].contiguous()
                residual = self.down[stage](x) if b == 0 else x
                if action.data.sum() == 0:
                    x = residual
                    t += 1
                    continue
                mask = action.view(-1, 1)
                fx = torch.relu(residual + self.blocks[t](x))
                x = fx * mask + residual * (1 - mask)
                t += 1
        return x


class ExitReshape(nn.Module):
    """Shallow-Deep Network: `return` inside a loop whose features change width per layer, lists
    appended to in a branch, and `np.argmax` over them as the fallback."""

    def __init__(self, thr: float = 0.7):
        super().__init__()
        self.layers = nn.ModuleList([_lin(4, 6, 210), _lin(6, 8, 211), _lin(8, 5, 212)])
        self.heads = nn.ModuleList([_lin(6, 3, 213), _lin(8, 3, 214)])
        self.final = _lin(5, 3, 215)
        self.add_output = [1, 1, 0]
        self.thr = thr

    def forward(self, x):
        confidences = []
        outputs = []
        output_id = 0
        for k, layer in enumerate(self.layers):
            x = torch.tanh(layer(x))
            is_output = self.add_output[k]
            if is_output:
                output = self.heads[k](x) * 3.0
                outputs.append(output)
                confidence = torch.max(torch.softmax(output[0], dim=0)).detach()
                confidences.append(confidence)
                if confidence >= self.thr:
                    return output, output_id, True
                output_id += is_output
        output = self.final(x) * 3.0
        outputs.append(output)
        confidences.append(torch.max(torch.softmax(output[0], dim=0)).detach())
        best = np.argmax(confidences)
        return outputs[best], best, False


class AnytimeBreak(nn.Module):
    """MSDNet (anytime): `break` in a `for` over blocks that change width; after the loop the
    result and the loop index of the iteration that broke are returned."""

    def __init__(self, thresholds: tuple = (0.6, 0.5)):
        super().__init__()
        self.blocks = nn.ModuleList([_lin(4, 6, 220), _lin(6, 8, 221), _lin(8, 5, 222)])
        self.heads = nn.ModuleList([_lin(6, 3, 223), _lin(8, 3, 224), _lin(5, 3, 225)])
        self.thresholds = list(thresholds)
        self.n = 3

    def forward(self, x):
        for i in range(self.n):
            x = torch.tanh(self.blocks[i](x))
            res = self.heads[i](x) * 3.0
            if i == self.n - 1:
                break
            confidence = torch.softmax(res, dim=1).max()
            if confidence.item() >= self.thresholds[i]:
                break
        return res, i


class PatienceInElse(nn.Module):
    """PABEE: the patience loop sits in the `else` of an if/elif chain; names first assigned
    inside the loop (`logits`, `labels`) are used after it; the last `break` test's result is
    unused, so the staged graph must keep it to make the same decisions."""

    def __init__(self, patience: int = 1):
        super().__init__()
        self.layer = _lin(4, 4, 242)
        self.heads = nn.ModuleList(_lin(4, 3, 243 + k) for k in range(4))
        self.patience = patience

    def forward(self, x):
        h = x
        if self.training:
            res = [head(h) for head in self.heads]
        elif self.patience == 0:
            for i in range(4):
                h = torch.tanh(self.layer(h))
            res = self.heads[3](h)
        else:
            counter = 0
            result = None
            for i in range(4):
                h = torch.tanh(self.layer(h))
                logits = self.heads[i](h)
                labels = logits.argmax(dim=1)
                if result is not None:
                    prev_labels = result.argmax(dim=1)
                if (result is not None) and torch.all(labels.eq(prev_labels)):
                    counter += 1
                else:
                    counter = 0
                result = logits
                if counter == self.patience:
                    break
            res = result
        return res


def mean_entropy(logits):
    p = torch.softmax(logits, dim=1)
    return -(p * torch.log(p)).sum(dim=1).mean()


class OffRamps(nn.Module):
    """DeeBERT: `for i, layer in enumerate(...)` with a `break` on the last layer and a `return`
    through off-ramp i: the loop index must stay a Python int to pick the module `ramps[i]`."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(_lin(4, 4, 240 + k) for k in range(3))
        self.ramps = nn.ModuleList(_lin(4, 3, 245 + k) for k in range(2))
        self.final = _lin(4, 3, 249)
        self.thr = [0.8, 0.9]

    def forward(self, x):
        h = x
        for i, layer in enumerate(self.layers):
            h = torch.tanh(layer(h)) * 2.0
            if i == len(self.layers) - 1:
                break
            logits = self.ramps[i](h) * 2.0
            if not self.training:
                if mean_entropy(logits) < self.thr[i]:
                    return logits, i + 1
        return self.final(h), len(self.layers)


# ---------------------------------------------------------------- models that must be refused

class OnePath(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = _lin(4, 4, 140)

    def forward(self, x):
        if x.sum() > 0:
            y = self.lin(x)
        return y + 1


class NoneVsTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = _lin(4, 4, 150)

    def forward(self, x):
        best = None
        if x.sum() > 0:
            best = self.lin(x)
        return best


class ShapeMismatch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            y = x[:, :2]
        else:
            y = x
        return y


class DeadOnePath(nn.Module):
    """A name assigned on one path only but not used after the `if`: fine."""

    def forward(self, x):
        y = x
        if x.sum() > 0:
            tmp = x * 2
            y = tmp + 1
        return y


class BreakLiveReshape(nn.Module):
    """`x` changes width per block and is returned after a data-dependent `break`: live on
    the exit path, so no placeholder may stand in for it."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([_lin(4, 6, 160), _lin(6, 8, 161)])

    def forward(self, x):
        for blk in self.blocks:
            x = torch.tanh(blk(x))
            if x.sum() > 0:
                break
        return x


class RaggedPick(nn.Module):
    """A list of tensors of different widths indexed by a tensor (in a function that is
    rewritten: it has a dynamic `if`)."""

    def forward(self, x):
        if x.mean() > 0:
            x = x * 2.0
        parts = [x, x[:, :2]]
        k = (x.sum() > 0).long()
        return parts[k]


# ---------------------------------------------------------------- test helpers

import re  # noqa: E402

from dycl_jax.rewrite.api import rewritten  # noqa: E402
from dycl_jax.rewrite.operators import staging  # noqa: E402
from dycl_jax.source import origins  # noqa: E402

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


class Wrap(nn.Module):
    """What the capture stage exports: the user's module as a child."""

    def __init__(self, m: nn.Module):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)


def export_rewritten(model: nn.Module, x: torch.Tensor, dynamic_batch: bool = False):
    dyn = ({0: torch.export.Dim.AUTO},) if dynamic_batch else None
    with staging(), rewritten(model, "forward"):
        return torch.export.export(Wrap(model), (x,), dynamic_shapes=dyn)


def node_site(node: torch.fx.Node) -> str | None:
    """The decision site of a control-flow node: the innermost generated frame with a site."""
    for m in reversed(list(_FRAME.finditer(node.meta.get("stack_trace") or ""))):
        if m["file"].startswith("<dycl-rewrite"):
            label = origins.site(m["file"], int(m["line"]))
            if label:
                return label
    return None


class StagedDecisions(torch.fx.Interpreter):
    """Runs an exported graph and records (site, value) per torch.cond / while test, the way
    a lowering of the staged program reports decisions: guard sites are not decisions, an
    `elif` chain reports the branch index once, a loop reports every test."""

    def __init__(self, gm: torch.fx.GraphModule, log: list, chain: str | None = None):
        super().__init__(gm)
        self.log = log
        self.chain = chain
        self._node = None

    def run_node(self, n):
        self._node = n
        return super().run_node(n)

    def call_function(self, target, args, kwargs):
        if target is torch.ops.higher_order.cond:
            pred, true_gm, false_gm, ops = args
            site = node_site(self._node)
            value = bool(pred)
            if origins.is_decision(site) and site != self.chain:
                if site.startswith("elif@"):
                    self.log.append((site, int(self.env[self._node.args[0].args[0]])))
                else:
                    self.log.append((site, value))
            chain = site if site and site.startswith("elif@") else None
            return tuple(StagedDecisions(true_gm if value else false_gm, self.log, chain).run(*ops))
        if target is torch.ops.higher_order.while_loop:
            cond_gm, body_gm, carried, additional = args
            site = node_site(self._node)
            carry = tuple(carried)
            while True:
                c = StagedDecisions(cond_gm, self.log).run(*carry, *additional)
                c = bool(c[0] if isinstance(c, (tuple, list)) else c)
                if origins.is_decision(site):
                    self.log.append((site, c))
                if not c:
                    return carry
                carry = tuple(StagedDecisions(body_gm, self.log).run(*carry, *additional))
        return super().call_function(target, args, kwargs)


def staged_decisions(ep, *args) -> list:
    log: list = []
    StagedDecisions(ep.module(), log).run(*args)
    return log


def flat_values(out) -> list:
    """Leaves as tensors (Python numbers become 0-d tensors), for exact comparison."""
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return [v if isinstance(v, torch.Tensor) else torch.tensor(v) for v in leaves]


def same(a, b) -> bool:
    fa, fb = flat_values(a), flat_values(b)
    return len(fa) == len(fb) and all(x.shape == y.shape and torch.equal(x, y.to(x.dtype)) for x, y in zip(fa, fb))


def candidate_inputs(n: int = 40, batch: int = 3, seed: int = 0) -> list[torch.Tensor]:
    """Inputs of several scales and signs: together they reach every path of the models."""
    g = torch.Generator().manual_seed(seed)
    scales = [0.05, 0.3, 1.0, 3.0, 10.0]
    return [torch.randn(batch, 4, generator=g) * scales[k % 5] + torch.randn(1, 4, generator=g) * scales[k % 5]
            for k in range(n)]


def paths(model: nn.Module, inputs: list[torch.Tensor]) -> dict[tuple, torch.Tensor]:
    """One input per distinct eager decision sequence (= per distinct path through the model)."""
    from dycl_jax.rewrite.api import run_torch_trace

    chosen: dict[tuple, torch.Tensor] = {}
    for x in inputs:
        _, decisions = run_torch_trace(model, "forward", (x,))
        chosen.setdefault(tuple(decisions), x)
    return chosen


def site_values(sequences) -> dict[str, set]:
    values: dict[str, set] = {}
    for seq in sequences:
        for site, v in seq:
            values.setdefault(site, set()).add(v)
    return values


def line_of(text: str, after: str = "") -> int:
    """Line number in this file of the first line containing `text` (after a line with `after`)."""
    import inspect
    import sys

    lines = inspect.getsource(sys.modules[__name__]).splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    return next(i for i, line in enumerate(lines) if i >= start and text in line) + 1


def site(kind: str, text: str, after: str = "") -> str:
    return f"{kind}@rewrite_models.py:{line_of(text, after)}"
