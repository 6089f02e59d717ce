"""The parts of the `dycl-jax` command: targets, input specs, progress, convert and bench."""
