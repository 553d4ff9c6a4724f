"""Precision stages: FP16 (ModelOpt AutoCast), INT8 Q/DQ (ModelOpt PTQ), calibration data, Q/DQ lint."""

import sys
from pathlib import Path

# The least peak resident memory each ModelOpt step took over the bytes of the FP32 model it was given, the step alone in
# a process, on the models of each kind measured (bench/results/modelopt_memory.json; a decoder is a model with a KV
# cache, measured at the size ladder's sizes): a model whose bytes times this exceed the memory available cannot fit.
# The factor falls as a model grows (ModelOpt's fixed part spreads), so the least is the largest model's: AutoCast
# 15.9x a 118M decoder, 9.6x a 494M one; INT8 21.6x and 7.8x (9.8x in a run before: the peak varies by run); INT4 with
# AWQ was measured on the 118M one only (its search takes hours at 494M on 2 cores), INT4 round to nearest
# (`int4_rtn_dq`) 8.9x at 494M. FP8 calibrates as INT8 does.
MODELOPT_LEAST_PEAK = {
    "decoder": {"autocast": 9, "int8": 7, "fp8": 7, "int4": 15, "int4_rtn_dq": 8},
    "other": {"autocast": 9, "int8": 13, "fp8": 13, "int4": 9, "int4_rtn_dq": 9},
}
MODELOPT_STEPS = {"autocast": "AutoCast", "int8": "INT8 calibration", "fp8": "FP8 calibration", "int4": "INT4 weight quantization (AWQ)",
                  "int4_rtn_dq": "INT4 weight quantization (round to nearest)"}


def modelopt_step(quantize_mode: str, calibration_method: str | None = None) -> str:
    """The MODELOPT_LEAST_PEAK step of a ModelOpt quantize call: INT4's two methods take different memory."""
    return "int4_rtn_dq" if quantize_mode == "int4" and calibration_method == "rtn_dq" else quantize_mode


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


def modelopt_need(source: Path, step: str) -> tuple[int, int, str, int]:
    """(the least memory ModelOpt's `step` took on a model of `source`'s kind, scaled to its bytes; the memory available
    now, after giving back what earlier work freed; the kind; the model's bytes)."""
    import onnx

    from pipeline.core.generation import PAST_INPUT
    from pipeline.core.memory import available_bytes
    from pipeline.core.onnxfile import stored_bytes
    from pipeline.core.rss import release_freed_memory

    model = onnx.load(str(source), load_external_data=False)
    kind = "decoder" if any(PAST_INPUT.fullmatch(value.name) for value in model.graph.input) else "other"
    weights = stored_bytes(source, model)
    release_freed_memory()
    return MODELOPT_LEAST_PEAK[kind][step] * weights, available_bytes(), kind, weights


def check_room_for_modelopt(source: Path, step: str, stage: str) -> None:
    """Fail the stage before ModelOpt's `step` runs on `source` where it cannot fit in the memory available now
    (MODELOPT_LEAST_PEAK): one line, instead of the kernel killing the whole build part way."""
    from pipeline.core.errors import StageFailed
    from pipeline.core.memory import gib

    needed, available, kind, weights = modelopt_need(source, step)
    if needed > available:
        raise StageFailed(f"{stage}: ModelOpt's {MODELOPT_STEPS[step]} needs at least {gib(needed)} of memory for {source.name} "
                          f"({MODELOPT_LEAST_PEAK[kind][step]}x its {gib(weights)}, the least it took on a model of this kind ({kind}) in "
                          f"bench/results/modelopt_memory.json) and this machine has {gib(available)} available; run this stage on a "
                          f"machine with more memory free (our Docker image), or leave out --{stage}")


def room_for_a_session_beside_modelopt(source: Path, step: str) -> bool:
    """Whether an onnxruntime session of `source` (counted at twice its bytes: its weights, and the copies of the GEMM
    weights onnxruntime prepacks) fits beside ModelOpt's `step` in the memory available now."""
    needed, available, _, weights = modelopt_need(source, step)
    return needed + 2 * weights <= available
