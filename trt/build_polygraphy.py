"""Build a TensorRT engine through Polygraphy's loaders: the `polygraphy` builder. CreateConfig turns TF32 off
unless asked (tf32=True keeps TensorRT's default, as the python builder does) and ignores what set_timing_cache
returns, so the cache is applied again, checked, by `use_timing_cache` in a PostprocessConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.errors import StageFailed
from pipeline.core.fileio import write_text
from trt.build import BuildPaths, BuildSettings, Shapes, save_engine, use_timing_cache
from trt.polygraphy_log import polygraphy_log
from trt.versions import check_weak_fp16, for_version


def build_engine_polygraphy(onnx: Path, paths: BuildPaths, shapes: Shapes, settings: BuildSettings) -> dict[str, Any]:
    """Build `onnx` with Polygraphy's loaders; write engine, layer JSON, build log and timing cache (atomically)."""
    import tensorrt as trt
    from polygraphy.backend.trt import CreateConfig, PostprocessConfig, Profile, engine_bytes_from_network, get_trt_logger, network_from_onnx_path
    from polygraphy.exception import PolygraphyException

    if settings.weak_fp16:
        check_weak_fp16(for_version(trt.__version__))  # CreateConfig(fp16=True) aborts on 11.x
    lines: list[str] = []
    cached = paths.timing_cache.read_bytes() if paths.timing_cache.is_file() else b""
    applied: dict[str, Any] = {}

    def timing_cache(builder, network, config) -> None:
        applied["cache"] = use_timing_cache(trt, config, cached, paths.timing_cache, lines)
        applied["config"] = config

    try:
        with polygraphy_log(lines, settings.log_severity):
            profile = Profile()  # one optimization profile from the profile's min/opt/max shapes
            for name, (low, opt, high) in shapes.items():
                profile.add(name, min=low, opt=opt, max=high)
            config = CreateConfig(
                tf32=True,
                fp16=settings.weak_fp16,
                profiles=[profile] if shapes else None,
                profiling_verbosity=getattr(trt.ProfilingVerbosity, settings.verbosity.upper()),
                memory_pool_limits={trt.MemoryPoolType.WORKSPACE: settings.workspace_mib << 20},
                builder_optimization_level=settings.optimization_level,
            )
            network = network_from_onnx_path(str(onnx), strongly_typed=not settings.weak_fp16)
            engine = engine_bytes_from_network(network, PostprocessConfig(config, timing_cache))
            layers = save_engine(trt, get_trt_logger(), bytes(engine), bytes(applied["config"].get_timing_cache().serialize()), paths)
    except PolygraphyException as err:
        errors = [line for line in lines if line.startswith("[E]")][:3]
        detail = "; ".join(" ".join(text.split()) for text in [str(err), *errors])
        raise StageFailed(f"{onnx}: Polygraphy could not build an engine: {detail}; see {paths.build_log}") from err
    finally:
        write_text(paths.build_log, "\n".join(lines) + "\n")
    return {"builder": "polygraphy", "tensorrt": trt.__version__, "engine_bytes": paths.engine.stat().st_size, "layers": layers,
            "timing_cache": applied["cache"]}
