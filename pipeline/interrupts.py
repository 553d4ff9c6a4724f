"""Ctrl-C, noticed however deep it lands.

A KeyboardInterrupt raised inside a third-party import or `except` block can surface as
another exception (e.g. `module 'torch._dynamo' has no attribute 'exc'`). The SIGINT handler
records that the user interrupted, so the run is reported as interrupted (exit 130) whatever
exception finally reaches the top.
"""

from __future__ import annotations

import signal

EXIT_CODE = 130
_interrupted = False


def _on_sigint(signum, frame) -> None:
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def install() -> None:
    """Route SIGINT through the recording handler (main thread only, as Python requires)."""
    signal.signal(signal.SIGINT, _on_sigint)


def interrupted() -> bool:
    return _interrupted
