"""Rewrite stage: data-dependent control flow to explicit control-flow operators."""
