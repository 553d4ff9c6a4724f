"""Numerical checks on onnxruntime's CPU provider (onnxruntime is imported lazily)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from pipeline.errors import InputError, StageFailed


def run_onnx(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run an ONNX file on onnxruntime's CPU provider; only the inputs the model declares are fed."""
    return list(run_onnx_named(path, feeds).values())


def run_onnx_named(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`run_onnx`, each output under its graph output name, in the graph's order."""
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
    try:
        values = session.run(None, {k: v for k, v in feeds.items() if k in declared})
    except Exception as err:  # onnxruntime raises its own untyped errors
        raise StageFailed(f"{path}: onnxruntime cannot run it: {_run_failure(err)}") from err
    return {output.name: value for output, value in zip(session.get_outputs(), values, strict=True)}


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


def _run_failure(err: Exception) -> str:
    """onnxruntime's run error as "<op> node '<name>': <message>" without its source locations."""
    text = " ".join(str(err).split())
    match = re.search(r"running (\w+) node\. Name:'([^']*)' Status Message: (.*)", text)
    if not match:
        return _first_line(err)
    message = re.sub(r"^(\S+\.(cc|h):\d+ )?(.*?\) )?(status\.IsOK\(\) was false\. )?", "", match[3])
    return f"{match[1]} node '{match[2]}': {message}"


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
