"""Precision stages: FP16 (ModelOpt AutoCast), INT8 Q/DQ (ModelOpt PTQ), calibration data, Q/DQ lint."""

import sys


def silence_lief_leak_report() -> None:
    """ModelOpt imports `lief` (modelopt/onnx/trt_utils.py, to read TensorRT plugin libraries, which we never
    pass); lief's nanobind bindings print tens of "nanobind: leaked ... functions" lines at interpreter exit,
    which read as a broken install. Called after each ModelOpt import; lief's own switch turns them off."""
    lief = sys.modules.get("lief")
    if lief is not None:
        lief.disable_leak_warning()


def before_modelopt() -> None:
    """What every ModelOpt call needs first: lief's leak report off, and onnxruntime's symbolic shape inference,
    which ModelOpt calls, kept from writing its partial model into the current folder (pipeline/core/symbolic_shapes.py)."""
    from pipeline.core.symbolic_shapes import without_stray_files

    silence_lief_leak_report()
    without_stray_files()
