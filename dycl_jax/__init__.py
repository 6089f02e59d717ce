"""dycl_jax: convert PyTorch dynamic neural networks to JAX/XLA."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dycl_jax.errors import CallError, CaptureError, DyclError, UnsupportedOpError

if TYPE_CHECKING:
    from dycl_jax.convert import to_jax
    from dycl_jax.runtime.loaded import LoadedModel, load
    from dycl_jax.runtime.model import JaxModel

__all__ = ["to_jax", "JaxModel", "load", "LoadedModel", "DyclError", "UnsupportedOpError", "CaptureError",
           "CallError"]
__version__ = "0.1.0"

# Imported on first use, so that `import dycl_jax` (and `dycl_jax.load` of an exported
# artifact) works where torch is not installed; only conversion needs torch.
_LAZY = {"to_jax": "dycl_jax.convert", "JaxModel": "dycl_jax.runtime.model",
         "load": "dycl_jax.runtime.loaded", "LoadedModel": "dycl_jax.runtime.loaded"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dycl_jax' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
