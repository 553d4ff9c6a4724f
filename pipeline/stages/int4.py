"""The int4 stage: weight-only INT4 for MatMul/Gemm weights (ModelOpt `quantize_mode="int4"`, AWQ on the
profile's samples or --calib, or round to nearest), gated on accuracy; a model without eligible weights
is one line. `python -m pipeline quantize --int4` calls `quantize` too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline.core.profiles import Profile
from pipeline.stage import Job, Stage, StageResult
from pipeline.stages import shared

HINTS = {  # by [quant] int4_method: INT4 has no placement preset and no nodes to exclude, what it has to try is this
    "rtn_dq": 'round to nearest uses no data: try [quant] int4_method = "awq_clip" (AWQ fits each group\'s scale to the calibration data), '
              "or --int8/--fp8 for this model",
    "awq_clip": "try more or more representative calibration data (--calib, [quant] samples), or --int8/--fp8 for this model",
}


def quantize(profile: Profile, calib: Path | None, source: Path, target: Path, reference=None, log: Path | None = None,
             on_step: Callable[[int, int], None] = lambda done, total: None):
    """INT4 weights of `source` into `target`, written only if it passes the gate; as pipeline.stages.fp8.quantize."""
    from pipeline.core.onnxfile import atomic_onnx
    from quant.int4 import quantize_int4

    q = profile.quant
    data, batch, origin = shared.calibration(profile, calib, source)
    if q.int4_method == "rtn_dq":
        origin = "none (round to nearest uses no data)"
    with atomic_onnx(target) as tmp, shared.logged(log):
        result = quantize_int4(source, tmp, data, batch, shared.held_out(profile), reference, q.int4_method, min_cosine=q.min_cosine_int4,
                               on_step=on_step)
        shared.require_quantized("int4", result.qdq["dequantize"], "; ".join(result.notes) or "ModelOpt quantized no weight")
        shared.gate("int4", result.accuracy, q.min_cosine_int4, HINTS[q.int4_method])
    return result, origin


def run_int4(job: Job) -> StageResult:
    from quant import check_room_for_modelopt, modelopt_step
    s = job.settings
    source, target = job.input("optimize", "onnx"), job.out / "model.int4.onnx"
    step = modelopt_step("int4", s.profile.quant.int4_method)
    check_room_for_modelopt(source, step, "int4")  # before the calibration and reference runs, not after them
    job.status(f"quantizing MatMul/Gemm weights to INT4 ({s.profile.quant.int4_method})")
    with shared.fp32_reference(job, shared.held_out(s.profile), beside=step) as reference:
        result, origin = quantize(s.profile, s.calib, source, target, reference, job.out / "int4.log",
                                  on_step=lambda done, total: job.status(f"AWQ calibration {done}/{total}"))
    return StageResult({"onnx": target, **shared.log_output(job.out / "int4.log")}, result.metrics() | {"calibration": origin})


def quantize_command(request: shared.QuantizeRequest) -> str:
    """quantize --int4: the stage's `quantize` with the profile's settings and the command's flags (gated like the stage)."""
    settings = shared.request_settings("int4", request, STAGE.reads)
    result, origin = quantize(settings.profile, settings.calib, request.source, request.output, on_step=request.on_step)
    return shared.ptq_command_line("INT4", request, result, origin)


STAGE = Stage(
    "int4", run_int4,
    reads=tuple(dict.fromkeys((*shared.CALIBRATION_READS, "quant.int4_method", *shared.HELD_OUT_READS, "quant.min_cosine_int4"))),
    inputs=("optimize.onnx",),
    packages=("nvidia-modelopt", "onnxruntime-gpu"),
    key_metric=shared.ptq_line,
)
