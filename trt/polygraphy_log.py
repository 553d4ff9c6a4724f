"""Polygraphy's log, collected into a list instead of printed: it becomes our build log."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def polygraphy_log(lines: list[str], severity: str) -> Iterator[None]:
    """Collect what Polygraphy logs during the block into `lines`, at or above `severity` (TensorRT's INFO is its
    VERBOSE). Polygraphy prints a repeated warning once per process: that record is cleared, so each log is whole."""
    from polygraphy.logger import G_LOGGER

    levels = {"error": G_LOGGER.ERROR, "warning": G_LOGGER.WARNING, "info": G_LOGGER.VERBOSE, "verbose": G_LOGGER.EXTRA_VERBOSE}

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Collect(level=1)
    python_logger = logging.getLogger("Polygraphy")
    saved = (G_LOGGER.use_python_logging_system, python_logger.propagate, python_logger.level)
    G_LOGGER.use_python_logging_system = True
    python_logger.addHandler(handler)
    python_logger.propagate = False
    python_logger.setLevel(1)
    G_LOGGER.once_logged.clear()
    try:
        with G_LOGGER.verbosity(levels[severity]):
            yield
    finally:
        python_logger.removeHandler(handler)
        G_LOGGER.use_python_logging_system, python_logger.propagate = saved[:2]
        python_logger.setLevel(saved[2])
