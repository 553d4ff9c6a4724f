"""What the fp8 and int4 stages share: calibration data and batch as the int8 stage makes them, the
ModelOpt call's log, the gate, and the metrics recorded."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.core.profiles import Profile
from pipeline.stages.int8 import SEQUENCE_DIMS, calibration_batch


def calibration(profile: Profile, calib: Path | None, source: Path):
    """(samples by input, batch, where they came from): the int8 stage's calibration data for `source`."""
    from quant.calibration import calibration_data

    data, origin = calibration_data(profile, calib, source)
    return data, calibration_batch(profile, source), origin


@contextmanager
def logged(log: Path | None) -> Iterator[None]:
    """The libraries' output into `log`; a user's input error leaves no log behind (nothing half written)."""
    from pipeline.core.errors import InputError
    from pipeline.core.quiet import captured

    try:
        with captured(log):
            yield
    except InputError:
        if log is not None:
            log.unlink(missing_ok=True)
        raise


def max_sequence(profile: Profile) -> int | None:
    return max((d.max for name, d in profile.dims.items() if name in SEQUENCE_DIMS), default=None)


def metrics(result, origin: str) -> dict[str, Any]:
    """The manifest's record: the PtqResult (Q/DQ counts, accuracy, method, samples, notes, lint counts) and the data's origin."""
    return {**result.metrics(), "calibration": origin}


def key_metric(m: dict[str, Any]) -> str:
    q = m["qdq"]
    return (f"{m['method']}: cosine_centered={m['accuracy']['cosine_centered']:.4f}, {q['quantize']} Q / {q['dequantize']} DQ, "
            f"{m['lint']['count']} lint findings")
