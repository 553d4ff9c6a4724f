"""Accuracy of a reduced-precision model against the FP32 one, on held-out samples (onnxruntime CPU).

Recorded per model: max_abs_diff, cosine (of all outputs flattened) and cosine_centered (the
same after subtracting the FP32 outputs' mean). The gate uses cosine_centered: outputs such
as sigmoid scores sit near a constant (bert-tiny: 0.57 +- 0.03), where the plain cosine is
0.9999 even for a broken model; centring measures whether the model follows FP32's variation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.verify import run_onnx


def accuracy(reference: Path, candidate: Path, feed_sets: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    return agreement([run_onnx(reference, f) for f in feed_sets], [run_onnx(candidate, f) for f in feed_sets])


def agreement(expected: list[list[np.ndarray]], actual: list[list[np.ndarray]]) -> dict[str, Any]:
    """The figures of `actual` against `expected`: per sample, the outputs in the same order."""
    ref = np.concatenate([np.asarray(o, np.float64).reshape(-1) for outputs in expected for o in outputs])
    got = np.concatenate([np.asarray(o, np.float64).reshape(-1) for outputs in actual for o in outputs])
    centre = ref.mean()
    return {
        "samples": len(expected),
        "max_abs_diff": float(np.max(np.abs(ref - got))),
        "cosine": _cosine(ref, got),
        "cosine_centered": _cosine(ref - centre, got - centre),
    }


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    if norms == 0.0:
        return 1.0 if np.array_equal(a, b) else 0.0
    return float(np.dot(a, b) / norms)
