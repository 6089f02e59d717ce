"""One module per construct; rewrite/pipeline.py runs them in order."""
