"""Accuracy of a reduced-precision model against the FP32 one, on held-out samples (onnxruntime CPU).

Recorded per model: max_abs_diff, cosine (of all outputs flattened) and cosine_centered (the
same after subtracting the FP32 outputs' mean). The gate uses cosine_centered: outputs such
as sigmoid scores sit near a constant (bert-tiny: 0.57 +- 0.03), where the plain cosine is
0.9999 even for a broken model; centring measures whether the model follows FP32's variation.

Each model is run once per batch of samples through one session (`model_outputs`), so the
FP32 outputs can be computed once and compared with every candidate. `BackgroundOutputs`
computes them on a worker thread while the conversion being checked runs (AutoCast and
ModelOpt's calibration leave a core mostly idle), so the check itself is the candidate's run.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.verify import OnnxSession


def model_outputs(model: Path | OnnxSession, batches: list[dict[str, np.ndarray]]) -> np.ndarray:
    """Every output of every batch, flattened into one float64 vector, through one session (the one
    given, or a new one for a path)."""
    session = model if isinstance(model, OnnxSession) else OnnxSession(model)
    return flatten([session.run(feeds) for feeds in batches])


class BackgroundOutputs:
    """`model_outputs(path, batches)` on a worker thread with all cores but one.

    `result()` waits for the outputs (or raises what the run raised) and counts the callers it
    served (`served`); `seconds` is the run's own wall time. `cancel()` stops the run
    (onnxruntime's RunOptions.terminate, honoured between operators) and waits for the thread, so
    a failed or interrupted stage leaves nothing running.
    """

    def __init__(self, path: Path, batches: list[dict[str, np.ndarray]]):
        import onnxruntime as ort

        self.seconds = 0.0
        self.served = 0
        self._future: Future[np.ndarray] = Future()
        self._stop = ort.RunOptions()
        self._thread = threading.Thread(target=self._run, args=(path, batches), name="fp32-reference", daemon=True)
        self._thread.start()

    def _run(self, path: Path, batches: list[dict[str, np.ndarray]]) -> None:
        started = time.perf_counter()
        try:
            session = OnnxSession(path, threads=max(1, (os.cpu_count() or 2) - 1))
            outputs = flatten([session.run(feeds, self._stop) for feeds in batches])
        except BaseException as err:  # handed to the thread that asks for the result
            self.seconds = time.perf_counter() - started
            self._future.set_exception(err)
        else:
            self.seconds = time.perf_counter() - started
            self._future.set_result(outputs)

    def result(self) -> np.ndarray:
        outputs = self._future.result()
        self.served += 1
        return outputs

    def cancel(self) -> None:
        self._stop.terminate = True
        self._thread.join()


def flatten(runs: list[list[np.ndarray]]) -> np.ndarray:
    """The outputs of several runs (each a list of arrays, in output order) as one float64 vector."""
    return np.concatenate([np.asarray(output, np.float64).reshape(-1) for outputs in runs for output in outputs])


def agreement(expected: list[list[np.ndarray]], actual: list[list[np.ndarray]]) -> dict[str, Any]:
    """The figures of `actual` against `expected`: per sample, the outputs in the same order."""
    return accuracy(flatten(expected), flatten(actual), len(expected))


def accuracy(reference: np.ndarray, candidate: np.ndarray, samples: int) -> dict[str, Any]:
    """Figures of `candidate` outputs against the FP32 `reference` outputs (both from model_outputs)."""
    if reference.shape != candidate.shape:
        raise ValueError(f"{candidate.size} output values vs {reference.size} of the FP32 model")
    centre = reference.mean()
    return {
        "samples": samples,
        "max_abs_diff": float(np.max(np.abs(reference - candidate))),
        "cosine": _cosine(reference, candidate),
        "cosine_centered": _cosine(reference - centre, candidate - centre),
    }


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    if norms == 0.0:
        return 1.0 if np.array_equal(a, b) else 0.0
    return float(np.dot(a, b) / norms)
