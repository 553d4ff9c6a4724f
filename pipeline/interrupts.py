"""Ctrl-C, noticed however deep it lands: a KeyboardInterrupt inside a third-party import can surface as another exception
(`module 'torch._dynamo' has no attribute 'exc'`), so the SIGINT handler records it and the run is reported interrupted.
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
