"""Keep third-party chatter (torch, ModelOpt, onnxruntime) out of the terminal, into a log file."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def captured(log: Path | None = None) -> Iterator[None]:
    """Send file descriptor 2 and Python's sys.stdout/sys.stderr to `log` (or discard) for the block.

    Descriptor 1 is left alone so our own progress display keeps drawing.
    """
    saved_fd = os.dup(2)
    sink = open(log, "w", encoding="utf-8") if log else tempfile.TemporaryFile("w+")  # noqa: SIM115
    try:
        sys.stderr.flush()
        os.dup2(sink.fileno(), 2)
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield
    finally:
        sink.flush()
        os.dup2(saved_fd, 2)
        os.close(saved_fd)
        sink.close()
