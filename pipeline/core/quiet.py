"""Keep third-party chatter (torch, ModelOpt, onnxruntime) out of the terminal, into a log file."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.fileio import atomic_path


@contextlib.contextmanager
def captured(log: Path | None = None) -> Iterator[None]:
    """Send file descriptor 2 and Python's sys.stdout/sys.stderr to `log` (or discard) for the block.

    Descriptor 1 is left alone so our own progress display keeps drawing. The log is written
    to a temporary file and renamed onto `log` when the block ends, failed or not, so a
    symlink planted at `log` is replaced, never written through; a log with nothing in it is
    not left behind.
    """
    try:
        with _redirected(log):
            yield
    finally:
        if log is not None and log.is_file() and log.stat().st_size == 0:
            log.unlink()


@contextlib.contextmanager
def _redirected(log: Path | None) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        if log is None:
            sink = stack.enter_context(tempfile.TemporaryFile("w+"))
        else:
            path = stack.enter_context(_kept_even_on_failure(atomic_path(log)))
            sink = stack.enter_context(open(path, "w", encoding="utf-8"))
        saved_fd = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                yield
        finally:
            sink.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)


@contextlib.contextmanager
def _kept_even_on_failure(atomic) -> Iterator[Path]:
    """atomic_path, but the file is renamed into place also when the block raises (a log of a failure)."""
    error: BaseException | None = None
    with atomic as path:
        try:
            yield path
        except BaseException as err:  # noqa: BLE001 - re-raised below, after the log is in place
            error = err
    if error is not None:
        raise error
