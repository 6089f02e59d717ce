"""The exit statuses of `dycl-jax`, documented in README and `--help`."""
from __future__ import annotations

OK = 0  # converted (and, with --check, matched torch)
REFUSED = 1  # the conversion was refused with a DyclError (location and fix shown)
PARITY = 2  # converted, but some checked input differs from torch beyond float rounding
USAGE = 3  # bad command-line input: missing module/file/factory, bad shape or dtype, bad option

HELP = """exit status:
  0  ok
  1  conversion refused (a DyclError: where, why and the fix are shown)
  2  parity failure: a checked input differs from torch (near-threshold decision
     flips, which float rounding explains, are counted but do not fail)
  3  usage error: missing module, file or factory, bad shape or dtype, bad option"""
