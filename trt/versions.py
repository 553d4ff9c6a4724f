"""What differs between TensorRT 10.x and 11.x, as data (sources: NVIDIA's "Migrating from TensorRT 10.x to 11.x"
pages). 11.x is always strongly typed: weak-typing builder flags are gone, STRONGLY_TYPED is ignored and renumbered,
trtexec's --fp16/--int8/--best are errors and --stronglyTyped / --separateProfileRun no-ops."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import InputError

Shapes = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]  # input -> (min, opt, max) shape


@dataclass(frozen=True)
class TrtVersion:
    major: int
    weak_fp16: bool  # BuilderFlag.FP16 exists (weak typing)
    trtexec_strongly_typed: bool  # --stronglyTyped is needed (10.x) or a no-op (11.x)
    trtexec_separate_profile_run: bool  # --separateProfileRun is needed (10.x) or a no-op (11.x)


VERSIONS = {
    10: TrtVersion(10, weak_fp16=True, trtexec_strongly_typed=True, trtexec_separate_profile_run=True),
    11: TrtVersion(11, weak_fp16=False, trtexec_strongly_typed=False, trtexec_separate_profile_run=False),
}


def for_version(version: str) -> TrtVersion:
    """The row for a TensorRT version string such as "10.13.3.9" or "11.4.0"."""
    try:
        major = int(version.split(".")[0])
    except ValueError as err:
        raise InputError(f"TensorRT version {version!r} not understood") from err
    if major < 10:
        raise InputError(f"TensorRT {version} is not supported: use 10.x or 11.x (our Docker image carries one)")
    return VERSIONS[min(major, 11)]


def check_weak_fp16(version: TrtVersion) -> None:
    if not version.weak_fp16:
        raise InputError(
            f"--weak-fp16 needs TensorRT 10.x; TensorRT {version.major}.x removed weak typing (BuilderFlag.FP16): "
            "build the FP16 model from `--fp16` (ModelOpt AutoCast) instead"
        )


def shapes_argument(shapes: Shapes, which: int) -> str:
    return ",".join(f"{name}:{'x'.join(str(d) for d in dims[which])}" for name, dims in shapes.items())


def trtexec_command(
    version: TrtVersion,
    onnx: Path,
    engine: Path,
    layers_json: Path,
    profile_json: Path,
    verbosity: str,
    shapes: Shapes,
    workspace_mib: int,
    optimization_level: int,
    timing_cache: Path,
    weak_fp16: bool = False,
) -> list[str]:
    """The trtexec command line for one build + layer export + per-layer profile, right for the version."""
    command = [
        "trtexec", f"--onnx={onnx}", f"--saveEngine={engine}", f"--profilingVerbosity={verbosity}",
        f"--exportLayerInfo={layers_json}", f"--exportProfile={profile_json}",
        f"--memPoolSize=workspace:{workspace_mib}M", f"--builderOptimizationLevel={optimization_level}",
        f"--timingCacheFile={timing_cache}",
    ]
    if shapes:
        command += [f"--minShapes={shapes_argument(shapes, 0)}", f"--optShapes={shapes_argument(shapes, 1)}", f"--maxShapes={shapes_argument(shapes, 2)}"]
    if weak_fp16:
        check_weak_fp16(version)
        command.append("--fp16")
    elif version.trtexec_strongly_typed:
        command.append("--stronglyTyped")
    if version.trtexec_separate_profile_run:
        command.append("--separateProfileRun")
    return command
