"""One builder interface, three implementations (TensorRT's Python API, Polygraphy's loaders, trtexec): a
function `(onnx, paths, shapes, settings) -> metrics` writing what trt/build.py's `BuildPaths` names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trt.build import BuildPaths, BuildSettings, Shapes

Builder = Callable[[Path, BuildPaths, Shapes, BuildSettings], dict[str, Any]]
NAMES = ("python", "polygraphy", "trtexec")


def builder(name: str) -> tuple[Builder, bool]:
    """The builder called `name`, and whether it writes the per-layer profile itself."""
    if name == "python":
        from trt.build import build_engine

        return build_engine, False
    if name == "polygraphy":
        from trt.build_polygraphy import build_engine_polygraphy

        return build_engine_polygraphy, False
    if name == "trtexec":
        from trt.build_trtexec import build_engine_trtexec

        return build_engine_trtexec, True
    raise ValueError(f"no builder {name!r}: use one of {', '.join(NAMES)}")


def build_and_profile(name: str, onnx: Path, paths: BuildPaths, shapes: Shapes, settings: BuildSettings, feeds: dict,
                      iterations: int, warmup: int, status: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """Build with the named builder, then make sure the per-layer profile is written."""
    build, profiles = builder(name)
    metrics = build(onnx, paths, shapes, settings)
    if not profiles:
        from trt.run import profile_engine

        status(f"profiling {paths.engine.name} per layer")
        metrics["profiled_layers"] = profile_engine(paths.engine, paths.profile_json, feeds, iterations, warmup)
    return metrics
