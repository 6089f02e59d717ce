"""Runtime stage: the JaxModel users call."""
