"""Capture stage: torch.export of the (rewritten) method to core ATen."""
