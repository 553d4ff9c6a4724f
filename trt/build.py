"""Build a TensorRT engine with TensorRT's Python API (10.x and 11.x): the `python` builder. The network is
strongly typed (precision comes from the ONNX: AutoCast FP16, Q/DQ INT8); `import tensorrt` happens only inside
these functions. Both this builder and trt/build_polygraphy.py save their results with `save_engine`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError, StageFailed
from pipeline.core.fileio import atomic_path, write_text
from trt.versions import Shapes, check_weak_fp16, for_version


@dataclass(frozen=True)
class BuildSettings:
    verbosity: str = "detailed"  # none | layer_names_only | detailed: trt.ProfilingVerbosity's names in lower case
    workspace_mib: int = 4096
    optimization_level: int = 3
    log_severity: str = "info"  # error | warning | info | verbose: trt.ILogger.Severity's names in lower case
    weak_fp16: bool = False


@dataclass(frozen=True)
class BuildPaths:
    """What one build writes: the engine, its layer information, its log, and the timing cache it shares."""

    engine: Path
    layers_json: Path
    build_log: Path
    timing_cache: Path
    profile_json: Path | None = None  # the per-layer profile (trtexec writes it; trt/builders.py otherwise)


def capture_logger(trt, severity: str, lines: list[str]):
    """An ILogger that keeps every message at or above `severity` (they go to the build log)."""
    threshold = getattr(trt.ILogger.Severity, severity.upper())

    class CaptureLogger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, level, message):
            if int(level) <= int(threshold):
                lines.append(f"[{str(level).rsplit('.', 1)[-1]}] {message}")

    return CaptureLogger()


def use_timing_cache(trt, config, cached: bytes, source: Path, log: list[str]) -> str:
    """Give `config` the timing cache read from `source`: "reused", "new" (no cache yet) or "rejected". TensorRT
    rejects a cache of another TensorRT version or GPU (set_timing_cache returns False): the build then starts
    from an empty cache, which replaces the rejected file."""
    if cached:
        if config.set_timing_cache(config.create_timing_cache(cached), False):
            return "reused"
        log.append(f"[pipeline] TensorRT rejected the timing cache {source} (written by another TensorRT version or GPU); "
                   "building with an empty cache, which replaces it")
    if not config.set_timing_cache(config.create_timing_cache(b""), False):
        raise InputError(f"TensorRT {trt.__version__} rejected an empty timing cache; remove {source} and report this TensorRT behaviour")
    return "rejected" if cached else "new"


def configure(trt, logger, onnx: Path, shapes: Shapes, settings: BuildSettings, timing_cache: Path, log: list[str]):
    """Builder, network parsed from `onnx`, configured builder config, and what became of the timing cache."""
    if settings.weak_fp16:
        check_weak_fp16(for_version(trt.__version__))
    builder = trt.Builder(logger)
    # strongly typed unless the legacy weak FP16 build (10.x) was asked for; STRONGLY_TYPED is renumbered in 11.x
    # (and ignored there): always shift the enum, never a literal
    network = builder.create_network(0 if settings.weak_fp16 else 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx)):
        errors = [_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
        raise StageFailed(f"{onnx}: TensorRT's ONNX parser failed: " + "; ".join(errors))
    config = builder.create_builder_config()
    config.profiling_verbosity = getattr(trt.ProfilingVerbosity, settings.verbosity.upper())
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_mib << 20)
    config.builder_optimization_level = settings.optimization_level
    if settings.weak_fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    cache = use_timing_cache(trt, config, timing_cache.read_bytes() if timing_cache.is_file() else b"", timing_cache, log)
    if shapes:
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in shapes.items():
            profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(profile)
    return builder, network, config, cache


def build_engine(onnx: Path, paths: BuildPaths, shapes: Shapes, settings: BuildSettings) -> dict[str, Any]:
    """Build `onnx` with the Python API; write engine, layer JSON, build log and timing cache (atomically)."""
    import tensorrt as trt

    lines: list[str] = []
    logger = capture_logger(trt, settings.log_severity, lines)
    try:
        builder, network, config, cache = configure(trt, logger, onnx, shapes, settings, paths.timing_cache, lines)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise StageFailed(f"{onnx}: TensorRT could not build an engine; see {paths.build_log}")
        layers = save_engine(trt, logger, bytes(serialized), bytes(config.get_timing_cache().serialize()), paths)
    finally:
        write_text(paths.build_log, "\n".join(lines) + "\n")
    return {"builder": "python", "tensorrt": trt.__version__, "engine_bytes": paths.engine.stat().st_size, "layers": layers, "timing_cache": cache}


def save_engine(trt, logger, engine: bytes, timing_cache: bytes, paths: BuildPaths) -> int:
    """Write the engine and the timing cache, then the engine's layer information; return its layer count."""
    with atomic_path(paths.engine) as tmp:
        tmp.write_bytes(engine)
    with atomic_path(paths.timing_cache) as tmp:
        tmp.write_bytes(timing_cache)
    deserialized = trt.Runtime(logger).deserialize_cuda_engine(engine)
    if deserialized is None:
        raise StageFailed(f"{paths.engine}: TensorRT cannot deserialize the engine it just built; see {paths.build_log}")
    info = deserialized.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
    write_text(paths.layers_json, info)  # what trtexec --exportLayerInfo writes
    return len(json.loads(info).get("Layers", []))


def _parser_error(error) -> str:
    """One line per parser error: the node (name and op) and the message."""
    name, op = error.node_name(), error.node_operator()
    where = f"{name} ({op})" if name else (f"node #{error.node()}" if error.node() >= 0 else "the model")
    return f"{where}: {error.desc()}"
