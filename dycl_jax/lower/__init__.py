"""Lower stage: ATen graphs to JAX through one op registry."""
