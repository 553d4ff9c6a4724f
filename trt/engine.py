"""Build, inspect and profile TensorRT engines (TensorRT 10.x and 11.x Python API).

`import tensorrt` happens only inside these functions. Calls follow NVIDIA's documented
Python API: Builder / OnnxParser / IBuilderConfig (profiling_verbosity,
set_memory_pool_limit, builder_optimization_level, timing cache, optimization profiles),
Runtime.deserialize_cuda_engine, ICudaEngine.create_engine_inspector +
get_engine_information(LayerInformationFormat.JSON), IProfiler.report_layer_time,
IExecutionContext.set_input_shape / set_tensor_address / execute_async_v3.
Device buffers and streams come from CuPy (installed with nvidia-modelopt[onnx]).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import InputError
from pipeline.fileio import atomic_path, write_json, write_text
from trt.versions import check_weak_fp16, for_version

Shapes = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


@dataclass(frozen=True)
class BuildSettings:
    verbosity: str = "detailed"  # none | layer_names_only | detailed
    workspace_mib: int = 4096
    optimization_level: int = 3
    log_severity: str = "info"  # error | warning | info | verbose
    weak_fp16: bool = False


VERBOSITY = {"none": "NONE", "layer_names_only": "LAYER_NAMES_ONLY", "detailed": "DETAILED"}
SEVERITY = {"error": "ERROR", "warning": "WARNING", "info": "INFO", "verbose": "VERBOSE"}


def _logger(trt, severity: str, lines: list[str]):
    """An ILogger that keeps every message at or above `severity` (they go to build.log)."""
    threshold = getattr(trt.ILogger.Severity, SEVERITY[severity])

    class CaptureLogger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, level, message):
            if int(level) <= int(threshold):
                lines.append(f"[{str(level).rsplit('.', 1)[-1]}] {message}")

    return CaptureLogger()


def configure(trt, logger, onnx: Path, shapes: Shapes, settings: BuildSettings, timing_cache: bytes):
    """Builder, strongly typed network parsed from `onnx`, and a configured builder config."""
    version = for_version(trt.__version__)
    if settings.weak_fp16:
        check_weak_fp16(version)
    builder = trt.Builder(logger)
    # STRONGLY_TYPED is renumbered in 11.x and ignored there: always shift the enum, never a literal
    flags = 0 if settings.weak_fp16 else 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx)):
        errors = [_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
        raise InputError(f"{onnx}: TensorRT's ONNX parser failed: " + "; ".join(errors))
    config = builder.create_builder_config()
    config.profiling_verbosity = getattr(trt.ProfilingVerbosity, VERBOSITY[settings.verbosity])
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_mib << 20)
    config.builder_optimization_level = settings.optimization_level
    if settings.weak_fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    config.set_timing_cache(config.create_timing_cache(timing_cache), False)
    if shapes:
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in shapes.items():
            profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(profile)
    return builder, network, config


def build_engine(onnx: Path, engine: Path, layers_json: Path, build_log: Path, timing_cache: Path, shapes: Shapes, settings: BuildSettings) -> dict[str, Any]:
    """Build `onnx` into `engine`; write its layer JSON, the builder log and the timing cache (all atomically)."""
    import tensorrt as trt

    lines: list[str] = []
    logger = _logger(trt, settings.log_severity, lines)
    try:
        builder, network, config = configure(trt, logger, onnx, shapes, settings, timing_cache.read_bytes() if timing_cache.is_file() else b"")
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise InputError(f"{onnx}: TensorRT could not build an engine; see {build_log}")
        with atomic_path(engine) as tmp:
            tmp.write_bytes(bytes(serialized))
        with atomic_path(timing_cache) as tmp:
            tmp.write_bytes(bytes(config.get_timing_cache().serialize()))
        runtime = trt.Runtime(logger)
        layer_info = runtime.deserialize_cuda_engine(bytes(serialized)).create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
        write_text(layers_json, layer_info)
    finally:
        write_text(build_log, "\n".join(lines) + "\n")
    return {"tensorrt": trt.__version__, "engine_bytes": engine.stat().st_size, "layers": len(json.loads(layer_info).get("Layers", []))}


def _parser_error(error) -> str:
    """One line per parser error: the node (name and op when this TensorRT reports them) and the message."""
    node = getattr(error, "node_name", lambda: "")() or f"node #{error.node()}"
    op = getattr(error, "node_operator", lambda: "")()
    return f"{node}{f' ({op})' if op else ''}: {error.desc()}"


class _Buffers:
    """Device buffers for every I/O tensor of a context, inputs filled from numpy feeds."""

    def __init__(self, trt, engine, context, feeds: dict[str, Any]):
        import cupy as cp

        self.stream = cp.cuda.Stream(non_blocking=True)
        self.arrays = {}
        for index in range(engine.num_io_tensors):
            name = engine.get_tensor_name(index)
            if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                if name not in feeds:
                    raise InputError(f"engine input {name!r} has no data; the profile's [[inputs]] must name it")
                context.set_input_shape(name, feeds[name].shape)
                self.arrays[name] = cp.asarray(feeds[name])
        for index in range(engine.num_io_tensors):
            name = engine.get_tensor_name(index)
            if engine.get_tensor_mode(name) != trt.TensorIOMode.INPUT:
                dtype = trt.nptype(engine.get_tensor_dtype(name))
                self.arrays[name] = cp.empty(tuple(context.get_tensor_shape(name)), dtype=dtype)
        for name, array in self.arrays.items():
            context.set_tensor_address(name, array.data.ptr)


def _load(path: Path):
    import tensorrt as trt

    lines: list[str] = []
    runtime = trt.Runtime(_logger(trt, "error", lines))
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise InputError(f"{path}: TensorRT cannot deserialize this engine ({'; '.join(lines) or 'built by another TensorRT version or GPU?'})")
    return trt, engine


def inspect_engine(engine_path: Path, layers_json: Path) -> int:
    """Write the engine's layer information (the content of trtexec --exportLayerInfo); return the layer count."""
    trt, engine = _load(engine_path)
    info = engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
    write_text(layers_json, info)
    return len(json.loads(info).get("Layers", []))


def profile_engine(engine_path: Path, profile_json: Path, feeds: dict[str, Any], iterations: int = 20) -> int:
    """Per-layer times over `iterations` runs, written in trtexec's --exportProfile schema."""
    trt, engine = _load(engine_path)
    totals: dict[str, list[float]] = {}

    class LayerTimes(trt.IProfiler):
        def __init__(self):
            trt.IProfiler.__init__(self)

        def report_layer_time(self, layer_name, ms):
            totals.setdefault(layer_name, []).append(ms)

    context = engine.create_execution_context()
    buffers = _Buffers(trt, engine, context, feeds)
    context.profiler = LayerTimes()
    for _ in range(iterations):
        context.execute_async_v3(buffers.stream.ptr)
        buffers.stream.synchronize()
    total = sum(sum(times) for times in totals.values()) or 1.0
    records = [{"count": iterations}] + [
        {"name": name, "timeMs": sum(times), "averageMs": sum(times) / len(times), "medianMs": sorted(times)[len(times) // 2],
         "percentage": 100.0 * sum(times) / total}
        for name, times in totals.items()
    ]
    write_json(profile_json, records)
    return len(totals)


def time_engine(engine_path: Path, feeds: dict[str, Any], warmup: int, iterations: int, on_step=lambda done, total: None) -> list[float]:
    """Device-side latency of each run in milliseconds (CUDA events around execute_async_v3)."""
    import cupy as cp

    trt, engine = _load(engine_path)
    context = engine.create_execution_context()
    buffers = _Buffers(trt, engine, context, feeds)
    for _ in range(warmup):
        context.execute_async_v3(buffers.stream.ptr)
    buffers.stream.synchronize()
    times = []
    for step in range(iterations):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(buffers.stream)
        context.execute_async_v3(buffers.stream.ptr)
        end.record(buffers.stream)
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
        on_step(step + 1, iterations)
    return times
