"""Latency benchmark of one or more models: TensorRT engines (CUDA events), onnxruntime on CUDA
or CPU (wall time). A build's precisions side by side in one run, results as JSON plus a PNG."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.devices import onnxruntime_cuda_missing
from pipeline.core.errors import CapabilityMissing, InputError
from pipeline.core.fileio import atomic_path
from pipeline.core.onnxfile import load_onnx
from trt.run import time_engine

BACKENDS = ("trt", "ort-cuda", "ort-cpu")
ORT_GRAPH_OPTIMIZATION = "basic"


def _ort_times(path: Path, feeds: dict[str, np.ndarray], provider: str, warmup: int, iterations: int, on_step) -> list[float]:
    import onnxruntime as ort

    if provider not in ort.get_available_providers():
        raise CapabilityMissing(f"onnxruntime has no {provider} here")
    load_onnx(path, hint="pass an ONNX model, or a build's output folder")
    # onnxruntime as the build's own checks run it (basic graph optimizations): its extended fusions crash on some
    # FP16 models (a segfault in 1.24.4) and have no FP8 kernel (MatMulIntegerToFloat)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    try:
        session = ort.InferenceSession(str(path), options, providers=[provider])
    except Exception as err:  # onnxruntime raises its own untyped errors
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "NOT_IMPLEMENTED" in message or "float8" in message:  # ops or types this provider has no kernel for (BF16, FP8 on the CPU)
            raise CapabilityMissing(f"{path}: onnxruntime's {provider} has no kernel for it ({message})") from err
        raise InputError(f"{path}: onnxruntime cannot load it: {message}") from err
    if session.get_providers()[0] != provider:
        raise CapabilityMissing(f"onnxruntime could not start {provider} for {path} (no usable GPU?)")
    wanted = {i.name for i in session.get_inputs()}
    missing = sorted(wanted - feeds.keys())
    if missing:
        raise InputError(f"{path}: model input {missing[0]!r} is not in the profile's [[inputs]] ({', '.join(feeds)}); pass the --profile the model was built with")
    feed = {k: v for k, v in feeds.items() if k in wanted}
    try:
        session.run(None, feed)
    except Exception as err:  # shapes or dtypes the model does not accept
        raise InputError(f"{path}: onnxruntime cannot run it on the profile's inputs ({str(err).strip().splitlines()[0]}); pass the --profile the model was built with") from err
    for _ in range(warmup):
        session.run(None, feed)
    times = []
    for step in range(iterations):
        started = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - started) * 1000.0)
        on_step(step + 1, iterations)
    return times


def summarize(times_ms: list[float], batch: int) -> dict[str, float]:
    t = np.asarray(times_ms)
    return {
        "p50_ms": float(np.percentile(t, 50)), "p90_ms": float(np.percentile(t, 90)), "p99_ms": float(np.percentile(t, 99)),
        "mean_ms": float(t.mean()), "min_ms": float(t.min()), "max_ms": float(t.max()),
        "throughput_per_s": float(batch * 1000.0 / t.mean()), "iterations": len(times_ms),
    }


def bench(models: dict[str, Path], backend: str, feeds: dict[str, np.ndarray], warmup: int, iterations: int, on_step=lambda label, done, total: None,
          skip_unsupported: bool = False) -> dict[str, Any]:
    """Time each model. `skip_unsupported`: a model the backend has no kernels for is listed in `not_timed` with
    why, and the others are timed (a build's BF16 model on onnxruntime's CPU provider); unless none can be."""
    if backend not in BACKENDS:
        raise InputError(f"--backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "ort-cuda" and (missing := onnxruntime_cuda_missing()):  # before onnxruntime prints its own errors, per model
        raise CapabilityMissing(f"--backend ort-cuda: {missing}; run it on a machine with an NVIDIA GPU, or time this CPU with --backend ort-cpu")
    batch = int(next(iter(feeds.values())).shape[0])
    results, not_timed = {}, {}
    for label, path in models.items():
        if not path.is_file():
            raise InputError(f"{path}: no such model file")
        step = lambda done, total, label=label: on_step(label, done, total)  # noqa: E731
        try:
            times = _times(path, backend, feeds, warmup, iterations, step)
        except CapabilityMissing as err:
            if not skip_unsupported:
                raise
            not_timed[label] = str(err)
            continue
        results[label] = {"model": str(path), **summarize(times, batch)}
    if not results and not_timed:
        raise CapabilityMissing(next(iter(not_timed.values())))
    return {
        "backend": backend, "timing": "CUDA events (device)" if backend == "trt" else f"wall clock per run, onnxruntime graph optimization {ORT_GRAPH_OPTIMIZATION}",
        "batch": batch, "input_shapes": {k: list(v.shape) for k, v in feeds.items()}, "warmup": warmup, "models": results,
        **({"not_timed": not_timed} if not_timed else {}),
    }


def _times(path: Path, backend: str, feeds: dict[str, np.ndarray], warmup: int, iterations: int, step) -> list[float]:
    if backend == "trt":
        return time_engine(path, feeds, warmup, iterations, step)
    provider = "CUDAExecutionProvider" if backend == "ort-cuda" else "CPUExecutionProvider"
    return _ort_times(path, feeds, provider, warmup, iterations, step)


def plot(result: dict[str, Any], png: Path) -> None:
    """Bar chart of p50 latency per model with p90 / p99 markers (`chart`), as a PNG."""
    import matplotlib.pyplot as plt

    figure = chart(result)
    with atomic_path(png) as tmp:
        figure.savefig(tmp, format="png")
    plt.close(figure)


def chart(result: dict[str, Any]):
    """The matplotlib figure: p50 bars with p90 / p99 marks, the legend right of the plot (inside, it hid a mark)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(result["models"])
    rows = [result["models"][label] for label in labels]
    figure, axis = plt.subplots(figsize=(max(4, 1.6 * len(labels)) + 1.0, 3.6), dpi=110)
    axis.bar(labels, [r["p50_ms"] for r in rows], color="#76b900", label="p50")
    axis.scatter(labels, [r["p90_ms"] for r in rows], color="#333333", marker="_", s=400, label="p90")
    axis.scatter(labels, [r["p99_ms"] for r in rows], color="#cc3333", marker="_", s=400, label="p99")
    axis.set_ylabel("latency (ms)")
    axis.set_title(f"{result['backend']}, batch {result['batch']} ({result['timing']})", fontsize=9)
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    figure.tight_layout()
    return figure
