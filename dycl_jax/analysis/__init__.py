"""Analysis stage: CFG, liveness and the static/dynamic decision per predicate."""
