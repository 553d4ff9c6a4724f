"""Numerical checks on onnxruntime's CPU provider (onnxruntime is imported lazily)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.errors import InputError


def run_onnx(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run an ONNX file on onnxruntime's CPU provider; only the inputs the model declares are fed."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # check the graph as written: onnxruntime's own rewrites are not under test, and one of them
    # (merging identical nodes) breaks valid graphs such as two GELU forms sharing x * 0.5
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own untyped errors
        raise InputError(f"{path}: onnxruntime cannot load it: {_first_line(err)}") from err
    declared = {i.name for i in session.get_inputs()}
    missing = declared - feeds.keys()
    if missing:
        raise InputError(f"{path}: model inputs {sorted(missing)} are not in the profile's [[inputs]]; add them")
    return session.run(None, {k: v for k, v in feeds.items() if k in declared})


def max_abs_diff(expected: list[np.ndarray], actual: list[np.ndarray]) -> float:
    if len(expected) != len(actual):
        raise ValueError(f"{len(expected)} outputs vs {len(actual)}")
    worst = 0.0
    for a, b in zip(expected, actual, strict=True):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a64.shape != b64.shape:
            raise ValueError(f"output shapes differ: {a64.shape} vs {b64.shape}")
        if a64.size:
            worst = max(worst, float(np.max(np.abs(a64 - b64))))
    return worst


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def compare_models(reference: Path, candidate: Path, feed_sets: list[dict[str, np.ndarray]]) -> float:
    """Largest |reference - candidate| over all outputs and all feed sets (onnxruntime CPU)."""
    worst = 0.0
    for feeds in feed_sets:
        expected, actual = run_onnx(reference, feeds), run_onnx(candidate, feeds)
        try:
            worst = max(worst, max_abs_diff(expected, actual))
        except ValueError as err:
            raise InputError(f"{candidate}: outputs do not match {reference} ({err})") from err
    return worst
