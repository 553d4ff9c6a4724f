"""Keep third-party chatter (torch, ModelOpt, onnxruntime) out of the terminal, into a log file."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.fileio import atomic_path


@contextlib.contextmanager
def captured(log: Path | None = None) -> Iterator[None]:
    """Send descriptor 2 and sys.stdout/sys.stderr to `log` (or discard) for the block; descriptor 1 keeps our progress
    display. The log is renamed into place when the block ends, failed or not (a symlink there is replaced, not written
    through); an empty log is not left behind."""
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
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), _handlers_to(sink):
                yield
        finally:
            sink.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)


_discard: list = []  # one os.devnull file for the process, opened when first needed


@contextlib.contextmanager
def _handlers_to(sink) -> Iterator[None]:
    """Logging handlers bound to an earlier block's stream write to `sink` for this one, and to nothing after it: ModelOpt's,
    bound to the sys.stdout it was imported under (a closed stage log), printed "--- Logging error ---" a dozen times a stage."""
    if not _discard:
        _discard.append(open(os.devnull, "w"))  # noqa: SIM115 - kept open for the process
    for handler in _stream_handlers():
        if handler.stream is _discard[0] or getattr(handler.stream, "closed", False):
            _point(handler, sink)
    try:
        yield
    finally:
        for handler in _stream_handlers():  # those added during the block too
            if handler.stream is sink:
                _point(handler, _discard[0])


def _stream_handlers() -> list[logging.StreamHandler]:
    loggers = (logging.getLogger(), *logging.Logger.manager.loggerDict.values())
    return [handler for logger in loggers if isinstance(logger, logging.Logger) for handler in logger.handlers if type(handler) is logging.StreamHandler]


def _point(handler: logging.StreamHandler, stream) -> None:
    """handler.setStream without its flush of the old stream (closed: the flush raises)."""
    with handler.lock:
        handler.stream = stream


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
