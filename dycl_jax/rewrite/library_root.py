"""The host program of a root whose forward is torch's own code (`nn.Sequential`): one region."""
from __future__ import annotations

from typing import Any


def library_forward(self: Any, *args: Any) -> Any:
    # the dispatch rewrite makes this statement one region, so the class's own forward (never
    # rewritten, as torch's code is not) runs inside torch.export on the region's tensors
    return type(self).forward(self, *args)
