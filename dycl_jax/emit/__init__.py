"""Emission: a converted staged program written out as readable Flax NNX source plus its weights."""
