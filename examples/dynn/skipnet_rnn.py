"""SkipNet with a recurrent gate (Wang et al., ECCV 2018): one LSTM, its state carried across blocks, decides each skip."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.dynn import blocks_ran, image_inputs, seeded
from examples.dynn.skipnet_ff import BasicBlock, conv3x3


class RNNGate(nn.Module):
    """Shared recurrent gate: the LSTM hidden state lives on the module between block calls."""

    def __init__(self, input_dim, hidden_dim):
        super().__init__()
        self.input_dim = input_dim
        self.hidden_dim = hidden_dim
        self.rnn = nn.LSTM(input_dim, hidden_dim)
        self.hidden = None
        self.proj = nn.Conv2d(hidden_dim, 1, kernel_size=1, stride=1)
        self.prob = nn.Sigmoid()
        self.saved_actions = []

    def init_hidden(self, batch_size):
        return (torch.zeros(1, batch_size, self.hidden_dim), torch.zeros(1, batch_size, self.hidden_dim))

    def forward(self, x):
        batch_size = x.size(0)
        self.rnn.flatten_parameters()
        out, self.hidden = self.rnn(x.view(1, batch_size, -1), self.hidden)
        proj = self.proj(out.squeeze(0).view(batch_size, out.size(2), 1, 1))
        prob = self.prob(proj)
        action = (prob > 0.5).float().detach()
        # kept for the policy-gradient update of the hybrid RL training stage
        self.saved_actions.append(action)
        return action.view(batch_size, 1, 1, 1), prob


class ResNetRecurrentGateSP(nn.Module):
    def __init__(self, layers=(2, 2, 2), num_classes=10, embed_dim=8, hidden_dim=8):
        super().__init__()
        self.num_layers = list(layers)
        self.inplanes = 8
        self.embed_dim = embed_dim
        self.conv1 = conv3x3(3, 8)
        self.bn1 = nn.BatchNorm2d(8)
        self._make_group(8, layers[0], group_id=1, stride=1)
        self._make_group(16, layers[1], group_id=2, stride=2)
        self._make_group(32, layers[2], group_id=3, stride=2)
        self.control = RNNGate(embed_dim, hidden_dim)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _make_group(self, planes, blocks, group_id, stride):
        for i in range(blocks):
            s = stride if i == 0 else 1
            downsample = None
            if s != 1 or self.inplanes != planes:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, planes, kernel_size=1, stride=s, bias=False), nn.BatchNorm2d(planes))
            setattr(self, "group{}_ds{}".format(group_id, i), downsample)
            setattr(self, "group{}_layer{}".format(group_id, i), BasicBlock(self.inplanes, planes, s, downsample))
            # gate features come from the block's *output*: pool and embed for the LSTM
            gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(planes, self.embed_dim, kernel_size=1))
            setattr(self, "group{}_gate{}".format(group_id, i), gate)
            self.inplanes = planes

    def forward(self, x):
        batch_size = x.size(0)
        x = F.relu(self.bn1(self.conv1(x)))

        # reinitialise the recurrent gate for this batch
        self.control.hidden = self.control.init_hidden(batch_size)
        self.control.saved_actions = []

        masks = []
        gprobs = []
        # the first block always runs; its output seeds the gate
        x = getattr(self, "group1_layer0")(x)
        gate_feature = getattr(self, "group1_gate0")(x)
        mask, gprob = self.control(gate_feature)
        gprobs.append(gprob)
        masks.append(mask.squeeze())

        for g in range(3):
            for i in range(0 + int(g == 0), self.num_layers[g]):
                if gprob > 0.5:
                    x = getattr(self, "group{}_layer{}".format(g + 1, i))(x)
                elif getattr(self, "group{}_ds{}".format(g + 1, i)) is not None:
                    x = getattr(self, "group{}_ds{}".format(g + 1, i))(x)
                # the last block has no successor to gate
                if not (g == 2 and i == self.num_layers[g] - 1):
                    gate_feature = getattr(self, "group{}_gate{}".format(g + 1, i))(x)
                    mask, gprob = self.control(gate_feature)
                    gprobs.append(gprob)
                    masks.append(mask.squeeze())

        x = self.avgpool(x)
        x = x.view(x.size(0), -1)
        x = self.fc(x)
        return x, masks, gprobs


GATED = tuple("group{}_layer{}".format(g, i) for g in (1, 2, 3) for i in range(2))[1:]
PATHS = tuple((name, ran) for name in GATED for ran in (True, False))


def example() -> tuple[nn.Module, tuple]:
    # seed 4: with this init every gate opens for some inputs and closes for others
    with seeded(4):
        model = ResNetRecurrentGateSP().eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    return image_inputs(n, seed)


def path_of(model: nn.Module, args: tuple) -> tuple:
    return blocks_ran(model, args, GATED)
