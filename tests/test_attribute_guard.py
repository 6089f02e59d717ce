"""Module attributes the converted model holds as values (`self.threshold`, `self.max_len`,
`self.budget`), changed on the torch model after conversion. Before, every host ran on with the
value at conversion where a program held it and, under dispatch, with the new value where a host
statement read it again: no error, answers matching neither torch before nor after the change.
Now a call after such a change raises a `CallError` naming the attribute and both values, and a
conversion after the change matches torch with the new value."""
from __future__ import annotations

import argparse
import copy
import logging

import pytest
import torch
from torch import nn

import dycl_jax
from differential import assert_same
from dycl_jax.errors import CallError, DyclError


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.threshold = 0.5

    def forward(self, h):
        return torch.relu(self.fc(h)) + h


class ThresholdExit(nn.Module):
    """An exit threshold on the root and a scale on a submodule, read by the user's code."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Gate() for _ in range(3)])
        self.head = nn.Linear(4, 3)
        self.threshold = 0.6
        self.calls = 0  # never read by the program: never guarded

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x)
            conf = torch.softmax(self.head(x), -1).max()
            if conf > self.threshold:
                return self.head(x), i
            if x.abs().max().item() > 3 * block.threshold:
                x = x * 0.5
        return self.head(x), len(self.blocks)


def _x(k: int) -> torch.Tensor:
    return torch.randn(1, 4, generator=torch.Generator().manual_seed(k))


@pytest.mark.parametrize("host", ["staged", "dispatch", "auto"])
@pytest.mark.parametrize("change", ["root", "submodule"])
def test_a_changed_attribute_is_refused_at_the_next_call(host, change):
    torch.manual_seed(0)
    model = ThresholdExit().eval()
    jm = dycl_jax.to_jax(model, (_x(0),), host=host)
    with torch.no_grad():
        assert_same(model(_x(1)), jm(_x(1)), "before the change")
    if change == "root":
        model.threshold, name = 0.35, "`threshold`"
    else:
        model.blocks[1].threshold, name = 0.1, "`blocks.1.threshold`"
    with pytest.raises(CallError) as info:
        jm(_x(2))
    assert name in str(info.value) and "convert again" in (info.value.fix or ""), str(info.value)
    if change == "root":  # set back: the converted model serves again
        model.threshold = 0.6
    else:
        model.blocks[1].threshold = 0.5
    with torch.no_grad():
        assert_same(model(_x(3)), jm(_x(3)), "set back")


@pytest.mark.parametrize("host", ["staged", "dispatch"])
def test_converting_again_after_the_change_matches_torch(host):
    torch.manual_seed(0)
    model = ThresholdExit().eval()
    exits = set()
    for threshold in (0.35, 0.6, 0.9):
        model.threshold = threshold
        jm = dycl_jax.to_jax(copy.deepcopy(model), (_x(0),), host=host)
        with torch.no_grad():
            for k in range(12):
                want = model(_x(k))
                assert_same(want, jm(_x(k)), f"threshold {threshold} input {k}")
                exits.add((threshold, want[1]))
    assert len({e for _, e in exits}) >= 3, exits


def test_what_the_method_assigns_and_torchs_own_flags_are_not_guarded():
    torch.manual_seed(0)
    model = ThresholdExit().eval()
    jm = dycl_jax.to_jax(model, (_x(0),), host="dispatch")
    model.calls = 7  # never read by the program
    model.train()  # `training` is the hosts' own
    model.eval()
    model.head.in_features = model.head.in_features  # the same value again
    with torch.no_grad():
        assert_same(model(_x(4)), jm(_x(4)), "after unguarded changes")


TEMPERATURE = 1.0
CFG = argparse.Namespace(threshold=0.6, name="exit")
LOG = logging.getLogger("dycl_jax.tests.attribute_guard")


class SettingsEverywhere(nn.Module):
    """Settings read from a global number, a global config object, a dict on the module; a memo
    dict the forward fills (by a computed key) and a library logger beside them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.opts = {"scale": 2.0}
        self.seen: dict = {}

    def forward(self, x):
        logits = self.fc(x) / TEMPERATURE
        LOG.debug("logits %s", logits.shape)
        self.seen[x.shape[0]] = 1  # filled on first use: a memo, never guarded
        if torch.softmax(logits, -1).max() > CFG.threshold:
            return logits * self.opts["scale"], 1
        return logits, 0


@pytest.mark.parametrize("host", ["staged", "dispatch"])
@pytest.mark.parametrize("change", ["global", "config", "dict"])
def test_a_changed_global_config_or_dict_setting_is_refused(host, change, monkeypatch):
    torch.manual_seed(0)
    model = SettingsEverywhere().eval()
    jm = dycl_jax.to_jax(model, (_x(0),), host=host)
    LOG.setLevel(logging.ERROR)  # a library object's fields are not the program's
    model.seen[5] = 1
    with torch.no_grad():
        assert_same(model(_x(1)), jm(_x(1)), "unguarded changes only")
    if change == "global":
        monkeypatch.setitem(globals(), "TEMPERATURE", 0.5)
        name = "`TEMPERATURE`"
    elif change == "config":
        monkeypatch.setattr(CFG, "threshold", 0.9)
        name = "`CFG.threshold`"
    else:
        monkeypatch.setitem(model.opts, "scale", 3.0)
        name = "`opts['scale']`"
    with pytest.raises(CallError) as info:
        jm(_x(2))
    assert name in str(info.value), str(info.value)


class Settings:
    """A settings class of the user's."""

    def __init__(self) -> None:
        self.threshold = 0.6


class Ticker:
    """A callable object of the user's that changes its own fields as it is called."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


SETTINGS = Settings()
TICK = Ticker()


class UserSettings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        logits = self.fc(x)
        if torch.softmax(logits, -1).max() > SETTINGS.threshold:
            return logits * 2.0
        return logits


class Ticking(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        stamp = TICK()
        return self.fc(x), stamp


def test_a_user_settings_object_is_guarded(monkeypatch):
    torch.manual_seed(0)
    model = UserSettings().eval()
    jm = dycl_jax.to_jax(model, (_x(0),), host="dispatch")
    with torch.no_grad():
        assert_same(model(_x(1)), jm(_x(1)), "before")
    monkeypatch.setattr(SETTINGS, "threshold", 0.2)
    with pytest.raises(CallError, match="SETTINGS.threshold"):
        jm(_x(5))


@pytest.mark.parametrize("host", ["staged", "dispatch", "auto"])
def test_an_object_whose_method_changes_its_fields_is_refused_as_carried_state(host):
    """`stamp = TICK()` bumps a field of a user object on every call: before, every host held the
    conversion's stamp (2.0 where torch gave 11.0, 12.0, ...); the carried-state check now sees
    the objects of the user's classes that globals and modules hold."""
    torch.manual_seed(0)
    TICK.t = 10.0
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(Ticking().eval(), (_x(0),), host=host)
    err = info.value
    assert "carries state" in str(err) and "Ticker" in str(err), str(err)
    assert err.location is not None and err.location.code == "self.t += 1.0", str(err)
    assert TICK.t == 10.0  # the conversion's calls put the field back
