"""Run a built engine with TensorRT's runtime: the per-layer profile (IProfiler) and device-side latency
(CUDA events around execute_async_v3). What Polygraphy's TrtRunner cannot give without losing device
timing stays here. Device memory, the stream and events come from CuPy (installed with nvidia-modelopt[onnx]).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError, StageFailed
from pipeline.core.fileio import write_json
from trt.build import capture_logger


def device_buffers(trt, engine, context, feeds: dict[str, Any], stream) -> dict[str, Any]:
    """Device memory for every I/O tensor, inputs filled from numpy feeds on `stream`, the engine's (a copy on the
    default stream would race a non-blocking inference stream). Outputs are sized by TensorRT's itemsize, so BF16,
    FP8, INT4 and FP4 outputs, which have no numpy type, get their buffer too."""
    import cupy as cp
    import numpy as np

    arrays = {}
    names = [engine.get_tensor_name(index) for index in range(engine.num_io_tensors)]
    inputs = [name for name in names if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT]
    for name in inputs:
        if name not in feeds:
            raise InputError(f"engine input {name!r} has no data; the profile's [[inputs]] must name it")
        host = np.ascontiguousarray(feeds[name])
        dtype = engine.get_tensor_dtype(name)
        if host.dtype.itemsize != dtype.itemsize:
            raise InputError(f"engine input {name!r} is {dtype.name} but the profile feeds {host.dtype}; make its [[inputs]] dtype match the model")
        if not context.set_input_shape(name, host.shape):
            raise InputError(f"engine input {name!r} does not take shape {host.shape}: outside the engine's optimization profile")
        arrays[name] = cp.empty(host.shape, dtype=host.dtype)
        arrays[name].set(host, stream=stream)
    for name in names:
        if name not in inputs:
            arrays[name] = cp.empty((_output_bytes(trt, engine, context, name),), dtype=cp.uint8)
    for name, array in arrays.items():
        if not context.set_tensor_address(name, array.data.ptr):
            raise InputError(f"TensorRT refused the device address of tensor {name!r}")
    return arrays


def _output_bytes(trt, engine, context, name: str) -> int:
    shape, dtype = tuple(context.get_tensor_shape(name)), engine.get_tensor_dtype(name)
    if any(size < 0 for size in shape):
        raise InputError(f"engine output {name!r} has a data-dependent shape {shape}, which profiling and timing do not support")
    if dtype.itemsize is None:
        raise InputError(f"engine output {name!r} is {dtype.name}, a type without a byte size in TensorRT {trt.__version__}")
    return max(1, math.ceil(math.prod(shape) * dtype.itemsize))


class _Execution:
    """A deserialized engine, one execution context with its buffers, and the stream it runs on, after
    `warmup` runs."""

    def __init__(self, engine_path: Path, feeds: dict[str, Any], warmup: int):
        import cupy as cp
        import tensorrt as trt

        self.trt, self.path, self.log = trt, engine_path, []
        self.runtime = trt.Runtime(capture_logger(trt, "error", self.log))
        self.engine = self.runtime.deserialize_cuda_engine(engine_path.read_bytes())
        if self.engine is None:
            raise InputError(f"{engine_path}: TensorRT {trt.__version__} cannot deserialize this engine "
                             f"({'; '.join(self.log) or 'built by another TensorRT version or for another GPU?'})")
        self.context = self.engine.create_execution_context()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.buffers = device_buffers(trt, self.engine, self.context, feeds, self.stream)  # kept alive while the engine runs
        for _ in range(warmup):
            self.enqueue()
        self.stream.synchronize()

    def enqueue(self) -> None:
        if not self.context.execute_async_v3(self.stream.ptr):
            raise StageFailed(f"{self.path}: TensorRT could not run the engine: {'; '.join(self.log) or 'execute_async_v3 returned False'}")


def profile_engine(engine_path: Path, profile_json: Path, feeds: dict[str, Any], iterations: int = 20, warmup: int = 5) -> int:
    """Per-layer times of `iterations` runs after `warmup` ones, as trtexec --exportProfile writes them; returns the
    layers profiled. TensorRT swallows an exception raised in IProfiler.report_layer_time, so a layer reported
    fewer than `iterations` times fails the profile instead of leaving it silently short."""
    run = _Execution(engine_path, feeds, warmup)
    times: dict[str, list[float]] = {}
    run.context.profiler = _layer_times(run.trt, times)
    observed = 0
    for _ in range(iterations):
        reported = sum(map(len, times.values()))
        run.enqueue()
        run.stream.synchronize()
        observed += sum(map(len, times.values())) > reported
    short = [(name, len(values)) for name, values in times.items() if len(values) < iterations]
    layers = run.engine.num_layers
    if len(times) < layers or short:
        example = f"; e.g. {short[0][0]!r} reported {short[0][1]} times" if short else ""
        raise StageFailed(
            f"{engine_path}: incomplete per-layer profile: {len(times)} of {layers} layers reported, "
            f"{len(short)} of them fewer than {iterations} times{example}; TensorRT drops a report when "
            f"IProfiler.report_layer_time raises (its message is printed above)"
        )
    write_json(profile_json, trtexec_profile(times, observed))
    return len(times)


def _layer_times(trt, times: dict[str, list[float]]):
    class LayerTimes(trt.IProfiler):
        def __init__(self):
            trt.IProfiler.__init__(self)

        def report_layer_time(self, layer_name, ms):
            times.setdefault(layer_name, []).append(ms)

    return LayerTimes()


def trtexec_profile(times: dict[str, list[float]], count: int) -> list[dict[str, Any]]:
    """`[{"count": runs}, {"name", "timeMs", "averageMs", "medianMs", "percentage"}, ...]` as trtexec computes
    them: total, mean and median (the mean of the two middle values for an even number) per layer."""
    total = sum(sum(values) for values in times.values())
    return [{"count": count}] + [
        {"name": name, "timeMs": sum(values), "averageMs": sum(values) / len(values), "medianMs": statistics.median(values),
         "percentage": 100.0 * sum(values) / total if total else 0.0}
        for name, values in times.items()
    ]


def time_engine(engine_path: Path, feeds: dict[str, Any], warmup: int, iterations: int, on_step=lambda done, total: None) -> list[float]:
    """Device-side latency of each run in milliseconds (CUDA events around execute_async_v3)."""
    import cupy as cp

    run = _Execution(engine_path, feeds, warmup)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for step in range(iterations):
        start.record(run.stream)
        run.enqueue()
        end.record(run.stream)
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
        on_step(step + 1, iterations)
    return times
