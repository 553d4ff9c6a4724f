"""The fp8 stage: ModelOpt FP8 (E4M3) Q/DQ, max calibration on the profile's samples (or --calib), the
preset's placement, the Q/DQ lint, gated on accuracy; written at opset >= 21. `python -m pipeline
quantize --fp8` calls `quantize` too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline.core.profiles import Profile
from pipeline.stage import Job, Stage, StageResult
from pipeline.stages import shared


def quantize(profile: Profile, calib: Path | None, source: Path, target: Path, reference=None, log: Path | None = None,
             on_step: Callable[[int, int], None] = lambda done, total: None):
    """FP8 Q/DQ of `source` into `target`, written only if it passes the gate; `reference`: the FP32 outputs
    on the held-out samples (BackgroundOutputs), or None to run `source`. Returns the result and the data's origin."""
    from pipeline.core.onnxfile import atomic_onnx
    from quant.fp8 import quantize_fp8

    q = profile.quant
    data, batch, origin = shared.calibration(profile, calib, source)
    with atomic_onnx(target) as tmp, shared.logged(log):
        result = quantize_fp8(source, tmp, data, batch, shared.held_out(profile), reference, q.preset, max_sequence=shared.max_sequence(profile),
                              min_cosine=q.min_cosine_fp8, on_step=on_step)
        shared.require_quantized("fp8", result.qdq["quantize"], "; ".join(result.notes) + "; try another --preset (modelopt keeps ModelOpt's placement)")
        shared.gate("fp8", result.accuracy, q.min_cosine_fp8)
    return result, origin


def run_fp8(job: Job) -> StageResult:
    from pipeline.core.fileio import write_json
    from quant.lint import findings_json

    s = job.settings
    source, target = job.input("optimize", "onnx"), job.out / "model.fp8.onnx"
    job.status("preparing calibration data")

    def step(done: int, total: int) -> None:
        job.status(f"calibrating FP8 ({s.profile.quant.preset}) {done}/{total}")

    with shared.fp32_reference(job, shared.held_out(s.profile)) as reference:
        result, origin = quantize(s.profile, s.calib, source, target, reference, job.out / "fp8.log", on_step=step)
    write_json(job.out / "fp8.lint.json", findings_json(result.findings))
    predicted, prediction = shared.predicted_engine(job, "fp8", target)
    return StageResult({"onnx": target, "lint": job.out / "fp8.lint.json", **predicted, **shared.log_output(job.out / "fp8.log")},
                       shared.ptq_metrics(result, origin) | prediction)


def quantize_command(request: shared.QuantizeRequest) -> str:
    """quantize --fp8: the stage's `quantize` with the profile's settings and the command's flags (gated like the stage)."""
    settings = shared.request_settings("fp8", request, STAGE.reads)
    result, origin = quantize(settings.profile, settings.calib, request.source, request.output, on_step=request.on_step)
    return shared.ptq_command_line("FP8", request, result, origin)


STAGE = Stage(
    "fp8", run_fp8,
    reads=tuple(dict.fromkeys((*shared.CALIBRATION_READS, "quant.preset", *shared.HELD_OUT_READS, "quant.min_cosine_fp8"))),
    inputs=("optimize.onnx",),
    packages=("nvidia-modelopt", "onnxruntime-gpu"),
    key_metric=lambda m: f"{m['preset']} " + shared.ptq_line(m) + shared.predicted_line(m),
)
