"""Build a TensorRT engine with the trtexec command: the `trtexec` builder. The command line comes from
trt/versions.py; everything trtexec prints is the build log."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from pipeline.core.errors import StageFailed
from pipeline.core.fileio import write_text
from trt.build import BuildPaths, BuildSettings, Shapes
from trt.versions import for_version, trtexec_command


def build_engine_trtexec(onnx: Path, paths: BuildPaths, shapes: Shapes, settings: BuildSettings) -> dict[str, Any]:
    """Build `onnx` with trtexec; it writes engine, layer JSON, per-layer profile and timing cache, we write its log."""
    import tensorrt as trt

    command = trtexec_command(for_version(trt.__version__), onnx, paths.engine, paths.layers_json, paths.profile_json, settings.verbosity,
                              shapes, settings.workspace_mib, settings.optimization_level, paths.timing_cache, settings.weak_fp16)
    try:
        run = subprocess.run(command, capture_output=True, text=True)
    except OSError as err:
        raise StageFailed(f"build: cannot run trtexec ({err.strerror}); install it or set [build] builder = \"python\"") from err
    write_text(paths.build_log, run.stdout + run.stderr)
    if run.returncode != 0:
        errors = [line.strip() for line in (run.stdout + run.stderr).splitlines() if "[E]" in line][:1]
        raise StageFailed(f"build: trtexec failed (exit {run.returncode}){': ' + errors[0] if errors else ''}; see {paths.build_log}")
    return {"builder": "trtexec", "tensorrt": trt.__version__, "command": command}
