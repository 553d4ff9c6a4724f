"""Python's cycle collector paused for a block that allocates a great many objects it never frees in cycles."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection for the block. Each full collection walks every live object: optimize took twice as long
    per node on a 48-layer encoder's IR as on a 12-layer one, and a 10,000-row gather table set off collections that freed nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
