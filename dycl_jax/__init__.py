"""dycl_jax: convert PyTorch dynamic neural networks to JAX/XLA."""
from dycl_jax.convert import to_jax
from dycl_jax.errors import CallError, CaptureError, DyclError, UnsupportedOpError
from dycl_jax.runtime.model import JaxModel

__all__ = ["to_jax", "JaxModel", "DyclError", "UnsupportedOpError", "CaptureError", "CallError"]
__version__ = "0.1.0"
