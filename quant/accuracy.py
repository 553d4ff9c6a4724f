"""Accuracy of a reduced-precision model against the FP32 one, on held-out samples (onnxruntime CPU).

Recorded per model: max_abs_diff, cosine (of all outputs flattened) and cosine_centered (the
same after subtracting the FP32 outputs' mean). The gate uses cosine_centered: outputs such
as sigmoid scores sit near a constant (bert-tiny: 0.57 +- 0.03), where the plain cosine is
0.9999 even for a broken model; centring measures whether the model follows FP32's variation. The FP32 outputs are computed once
(`BackgroundOutputs`: beside the conversion, which leaves a core mostly idle) and compared with every candidate.
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


def model_outputs(path: Path, batches: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """Every output of every batch, each flattened (`flatten`), through one session."""
    session = OnnxSession(path)
    return flatten([session.run_fitting(feeds, path) for feeds in batches])


OUTPUT_BUDGET = 1 << 27  # output values the FP32 reference keeps for the checks (512 MB of float32)


class BackgroundOutputs:
    """`model_outputs(path, batches)` on a worker thread with all cores but one; `result()` is None past
    OUTPUT_BUDGET values (`checked` then runs both models batch by batch). `cancel()` stops the run (onnxruntime's
    RunOptions.terminate, honoured between operators) and waits for it: a failed stage leaves nothing running."""

    def __init__(self, path: Path, batches: list[dict[str, np.ndarray]], known: tuple[list[np.ndarray] | None, float] | None = None):
        """`known`: the outputs (None: past the budget) and the seconds they took, computed already (a decoder's held-out
        steps run the FP32 model as they are made): nothing runs."""
        import onnxruntime as ort

        self.path = path
        self.seconds = self.waited = 0.0  # its run's wall time; how long callers of result() waited for it
        self.served = 0
        self._future: Future[list[np.ndarray] | None] = Future()
        self._stop = ort.RunOptions()
        self._thread = threading.Thread(target=self._run, args=(path, batches), name="fp32-reference", daemon=True)
        if known is None:
            self._thread.start()
            return
        outputs, self.seconds = known
        self._future.set_result(outputs if outputs is not None and sum(o.size for o in outputs) <= OUTPUT_BUDGET else None)

    def _run(self, path: Path, batches: list[dict[str, np.ndarray]]) -> None:
        started = time.perf_counter()
        try:
            session = OnnxSession(path, threads=max(1, (os.cpu_count() or 2) - 1))
            outputs: list[np.ndarray] | None = []
            for feeds in batches:
                outputs += flatten([session.run_fitting(feeds, path, self._stop)])
                if sum(o.size for o in outputs) > OUTPUT_BUDGET:  # the check runs both models batch by batch instead
                    outputs = None
                    break
        except BaseException as err:  # handed to the thread that asks for the result
            self.seconds = time.perf_counter() - started
            self._future.set_exception(err)
        else:
            self.seconds = time.perf_counter() - started
            self._future.set_result(outputs)

    def result(self) -> list[np.ndarray] | None:
        waiting = time.perf_counter()
        outputs = self._future.result()
        self.waited += time.perf_counter() - waiting
        self.served += 1
        return outputs

    def finish(self) -> None:
        """Wait for the run to end, its session closed (its outputs, or its error, stay for `result()`)."""
        if self._thread.is_alive():
            self._thread.join()

    def cancel(self) -> None:
        self._stop.terminate = True
        self.finish()


CHUNK = 1 << 20  # output values taken to float64 at a time: the figures' memory is one chunk's, not the outputs'


def flatten(runs: list[list[np.ndarray]]) -> list[np.ndarray]:
    """The outputs of several runs (each a list of arrays, in output order) as flat arrays in their own dtype. The
    figures read them a chunk at a time: one float64 vector of them, and its differences, took EfficientNet's FP16
    check (64 x 2560 x 56 x 56 outputs, 2 GB a copy) past 20 GB."""
    return [np.asarray(output).reshape(-1) for outputs in runs for output in outputs]


def agreement(expected: list[list[np.ndarray]], actual: list[list[np.ndarray]]) -> dict[str, Any]:
    """The figures of `actual` against `expected`: per sample, the outputs in the same order."""
    return accuracy(flatten(expected), flatten(actual), len(expected))


def accuracy(reference: list[np.ndarray], candidate: list[np.ndarray], samples: int) -> dict[str, Any]:
    """Figures of `candidate` outputs against the FP32 `reference` outputs (both from model_outputs)."""
    return Figures().add(reference, candidate).result(samples)


def checked(candidate: Path | OnnxSession, batches: list[dict[str, np.ndarray]], reference: BackgroundOutputs | list[np.ndarray] | None,
            source: Path, samples: int) -> dict[str, Any]:
    """The figures of `candidate` on `batches` against the FP32 model `source`: against `reference` (its outputs, or a
    BackgroundOutputs still running beside the conversion). Outputs of more than OUTPUT_BUDGET values (which the
    reference did not keep either: the two models' outputs are the same size), or no reference: both models run batch
    by batch, each batch's outputs dropped once counted."""
    session = candidate if isinstance(candidate, OnnxSession) else OnnxSession(candidate)
    if reference is not None:
        outputs: list[np.ndarray] = []
        for feeds in batches:
            outputs += flatten([session.run_fitting(feeds, source)])
            if isinstance(reference, BackgroundOutputs) and sum(o.size for o in outputs) > OUTPUT_BUDGET:
                break
        else:
            expected = reference.result() if isinstance(reference, BackgroundOutputs) else reference
            if expected is not None:
                return accuracy(expected, outputs, samples)
        del outputs
    if isinstance(reference, BackgroundOutputs):
        reference.result()  # it stopped at the budget: let it end before the FP32 model runs again here
    fp32, figures = OnnxSession(source), Figures()
    for feeds in batches:
        figures.add(flatten([fp32.run_fitting(feeds, source)]), flatten([session.run_fitting(feeds, source)]))
    return figures.result(samples)


class Figures:
    """max_abs_diff, cosine and cosine_centered accumulated in float64 a chunk at a time. The centred sums are taken
    about the first chunk's reference mean and moved to the whole mean at the end (exact algebra), so a large common
    offset (sigmoid scores at 0.57 +- 0.03) costs no precision. A NaN anywhere makes every figure NaN."""

    def __init__(self) -> None:
        self.values, self.shift, self.equal = 0, None, True
        self.worst = np.float64(0.0)
        self.sums = np.zeros(8)  # a.b, a.a, b.b, then about the shift: sum a, sum b, a.b, a.a, b.b

    def add(self, reference: list[np.ndarray], candidate: list[np.ndarray]) -> Figures:
        if [a.size for a in reference] != [b.size for b in candidate]:
            raise ValueError(f"{sum(b.size for b in candidate)} output values vs {sum(a.size for a in reference)} of the FP32 model")
        for a, b in _chunks(reference, candidate):
            self.shift = float(a.mean()) if self.shift is None else self.shift
            self.worst = np.maximum(self.worst, np.max(np.abs(a - b)))
            self.equal = self.equal and bool(np.array_equal(a, b))
            sa, sb = a - self.shift, b - self.shift
            self.sums += (a @ b, a @ a, b @ b, sa.sum(), sb.sum(), sa @ sb, sa @ sa, sb @ sb)
            self.values += a.size
        return self

    def result(self, samples: int) -> dict[str, Any]:
        ab, aa, bb, sa, sb, sab, saa, sbb = (float(v) for v in self.sums)
        n = self.values
        d = sa / max(1, n)  # the reference's mean, less the shift
        centred = (sab - d * sa - d * sb + n * d * d, saa - 2 * d * sa + n * d * d, sbb - 2 * d * sb + n * d * d)
        return {"samples": samples, "max_abs_diff": float(self.worst), "cosine": _cosine((ab, aa, bb), self.equal),
                "cosine_centered": _cosine(centred, self.equal)}


def _chunks(reference: list[np.ndarray], candidate: list[np.ndarray]):
    for a, b in zip(reference, candidate, strict=True):
        for start in range(0, a.size, CHUNK):
            yield a[start:start + CHUNK].astype(np.float64), b[start:start + CHUNK].astype(np.float64)


def _cosine(sums: tuple[float, float, float], equal: bool) -> float:
    """a.b / (|a| |b|) from (a.b, a.a, b.b); 1 for equal outputs (zeros included)."""
    dot, aa, bb = sums
    if equal:
        return 1.0
    norms = float(np.sqrt(aa * bb))
    return 0.0 if norms == 0.0 else dot / norms
