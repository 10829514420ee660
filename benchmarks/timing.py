"""What the benchmark scripts share."""

from __future__ import annotations

import time


def timed(fn):
    """``(fn(), seconds)``."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start
