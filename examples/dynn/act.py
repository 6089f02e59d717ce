"""Adaptive Computation Time (Graves, 2016): an RNN cell that ponders until its halting units sum to one."""

from __future__ import annotations

import torch
import torch.nn as nn

from examples.dynn import seeded


class ACTCell(nn.Module):
    def __init__(self, input_size, hidden_size, max_steps=6, eps=0.01):
        super().__init__()
        self.hidden_size = hidden_size
        self.max_steps = max_steps
        self.eps = eps
        # one extra input: the flag that marks the first ponder step
        self.cell = nn.RNNCell(input_size + 1, hidden_size)
        self.halting_unit = nn.Linear(hidden_size, 1)

    def forward(self, x, hidden):
        batch_size = x.size(0)
        halting_prob = torch.zeros(batch_size)
        remainders = torch.zeros(batch_size)
        n_updates = torch.zeros(batch_size)
        weighted_state = torch.zeros(batch_size, self.hidden_size)
        flag = torch.ones(batch_size, 1)
        n = 0
        while (halting_prob < 1 - self.eps).any() and n < self.max_steps:
            still_running = (halting_prob < 1 - self.eps).float()
            hidden = self.cell(torch.cat([x, flag], dim=1), hidden)
            flag = torch.zeros(batch_size, 1)
            p = torch.sigmoid(self.halting_unit(hidden)).squeeze(1)

            # units whose cumulative halting probability crosses 1 - eps stop here and
            # spend their remainder; the others keep pondering
            new_halted = (halting_prob + p * still_running >= 1 - self.eps).float() * still_running
            still_running = (halting_prob + p * still_running < 1 - self.eps).float() * still_running
            halting_prob = halting_prob + p * still_running
            remainders = remainders + new_halted * (1 - halting_prob)
            halting_prob = halting_prob + new_halted * remainders
            n_updates = n_updates + still_running + new_halted

            update_weights = p * still_running + new_halted * remainders
            weighted_state = weighted_state + update_weights.unsqueeze(1) * hidden
            n += 1

        ponder_cost = n_updates + remainders
        return weighted_state, ponder_cost, n


class ACTNet(nn.Module):
    def __init__(self, input_size=16, hidden_size=32, num_classes=4, max_steps=6):
        super().__init__()
        self.hidden_size = hidden_size
        self.act = ACTCell(input_size, hidden_size, max_steps=max_steps)
        self.classifier = nn.Linear(hidden_size, num_classes)
        # a wide halting unit: the halting probability depends strongly on the input,
        # so some inputs halt at once and others ponder to the step limit
        nn.init.normal_(self.act.halting_unit.weight, std=1.5)
        nn.init.constant_(self.act.halting_unit.bias, 0.0)

    def forward(self, x):
        hidden = torch.zeros(x.size(0), self.hidden_size)
        state, ponder_cost, n_steps = self.act(x, hidden)
        return self.classifier(state), ponder_cost, n_steps


MAX_STEPS = 6
# both ways out of the loop: every unit halted after k steps, or the step limit cut it off
PATHS = tuple(("halted", k) for k in range(1, MAX_STEPS + 1)) + (("cut_off", MAX_STEPS),)


def example() -> tuple[nn.Module, tuple]:
    # seed 19: with this init the inputs below halt after every step count from 1 to MAX_STEPS
    with seeded(19):
        model = ACTNet(max_steps=MAX_STEPS).eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        scale = float(torch.exp(torch.empty(()).uniform_(-1.0, 1.5, generator=g)))
        out.append((torch.randn(1, 16, generator=g) * scale,))
    return out


def path_of(model: nn.Module, args: tuple) -> tuple:
    with torch.no_grad():
        _, ponder_cost, n_steps = model(*args)
    # a unit that halted spent a remainder > eps, so its ponder cost exceeds its step count
    halted = bool(ponder_cost.item() > n_steps)
    return (("halted" if halted else "cut_off", int(n_steps)),)
