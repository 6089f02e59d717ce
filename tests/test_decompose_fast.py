"""The fast decomposition path (cached table split, composite_override.py) gives torch's graph."""
from __future__ import annotations

import pytest
import torch
import torch.export.exported_program as torch_ep

from dycl_jax.capture import export as capture_export


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.bn(self.conv(x))), 1)
        return torch.log_softmax(self.fc(h.flatten(1)), dim=-1)


class Lstm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(5, 6, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


class Transformer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class Cond(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: torch.nn.functional.gelu(self.fc(t)), lambda t: torch.nn.functional.hardswish(t), (x,))


class WhileLoop(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.while_loop import while_loop

        i = torch.zeros((), dtype=torch.int64)
        return while_loop(lambda i, t: i < 3, lambda i, t: (i + 1, torch.nn.functional.silu(t) * 2), (i, x))[1]


CASES = [
    (ConvNet, (torch.randn(2, 3, 6, 6),)),
    (Lstm, (torch.randn(2, 4, 5),)),
    (Transformer, (torch.randn(2, 3, 8),)),
    (Cond, (torch.randn(3, 4),)),
    (WhileLoop, (torch.randn(3, 4),)),
]


def _text(ep: torch.export.ExportedProgram) -> str:
    # the whole program: every (sub)graph, its signature, the state it reads (the generated
    # code's comments hold a counter of fx's generated files, so the graphs' own text)
    graphs = [f"{name}:\n{gm.graph}" for name, gm in ep.graph_module.named_modules() if isinstance(gm, torch.fx.GraphModule)]
    return "\n".join([*graphs, str(ep.graph_signature), *sorted(ep.state_dict)])


def _ops(ep: torch.export.ExportedProgram) -> list[str]:
    return [str(n.target) for gm in ep.graph_module.modules() if isinstance(gm, torch.fx.GraphModule)
            for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("make,args", CASES, ids=[c[0].__name__ for c in CASES])
def test_fast_path_graph_is_torchs(make: type, args: tuple) -> None:
    torch.manual_seed(0)
    model = make().eval()
    ours = capture_export.run_core_aten_decompositions(torch.export.export(model, args))
    torchs = torch.export.export(model, args).run_decompositions(capture_export._core_aten_table())
    assert _ops(ours) == _ops(torchs)
    assert _text(ours) == _text(torchs)
    # the numbers too, against the original model
    torch.testing.assert_close(ours.module()(*args), model(*args))


def test_override_restores_torch() -> None:
    ops = [torch.ops.aten.linear.default, torch.ops.aten.gelu.default]
    before = {op: dict(op.py_kernels) for op in ops}
    original = torch_ep._override_composite_implicit_decomp
    capture_export.run_core_aten_decompositions(torch.export.export(Cond().eval(), (torch.randn(3, 4),)))
    assert torch_ep._override_composite_implicit_decomp is original
    assert {op: dict(op.py_kernels) for op in ops} == before
