"""Host stage: how control flow runs around the lowered sub-networks."""
