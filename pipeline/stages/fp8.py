"""The fp8 stage: ModelOpt FP8 (E4M3) Q/DQ, max calibration on the profile's samples (or --calib), the
preset's placement, the Q/DQ lint, gated on accuracy and, where the gate fails, repaired (the fewest nodes
left unquantized, pipeline/stages/repair.py); written at opset >= 21. `python -m pipeline quantize --fp8`
calls `quantize` too, gated like the stage."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline.core.profiles import Profile
from pipeline.stage import Job, Stage, StageResult
from pipeline.stages import repair, shared

HINT = "exclude sensitive nodes ([quant] fp8_exclude_nodes), try another preset or more calibration data"


def quantize(profile: Profile, calib: Path | None, source: Path, target: Path, reference=None, log: Path | None = None,
             on_step: Callable[[int, int], None] = lambda done, total: None, keep: tuple[str, ...] = ()):
    """FP8 Q/DQ of `source` into `target` with the nodes named in `keep` (the repair's) left unquantized, its accuracy
    measured (not gated); `reference`: the FP32 outputs on the held-out samples (BackgroundOutputs), or None to run
    `source`. Returns the result and the data's origin."""
    from pipeline.core.onnxfile import atomic_onnx
    from quant.fp8 import quantize_fp8
    from quant.fp16 import exact_names

    q = profile.quant
    data, batch, origin = shared.calibration(profile, calib, source)
    with atomic_onnx(target) as tmp, shared.logged(log):
        result = quantize_fp8(source, tmp, data, batch, shared.held_out(profile), reference, q.preset, max_sequence=shared.max_sequence(profile),
                              min_cosine=q.min_cosine_fp8, on_step=on_step, nodes_to_exclude=[*q.fp8_exclude_nodes, *exact_names(keep)])
        shared.require_quantized("fp8", result.qdq["quantize"], "; ".join(result.notes) + "; try another --preset (modelopt keeps ModelOpt's placement)")
    return result, origin


def run_fp8(job: Job) -> StageResult:
    from pipeline.core.fileio import write_json
    from pipeline.core.onnxfile import atomic_onnx
    from quant import check_room_for_modelopt
    from quant.lint import findings_json

    s = job.settings
    q, source, target, log = s.profile.quant, job.input("optimize", "onnx"), job.out / "model.fp8.onnx", job.out / "fp8.log"
    check_room_for_modelopt(source, "fp8", "fp8")  # before the calibration and reference runs, not after them
    batches = shared.held_out(s.profile)
    job.status("preparing calibration data")

    def step(done: int, total: int) -> None:
        job.status(f"calibrating FP8 ({q.preset}) {done}/{total}")

    with shared.fp32_reference(job, batches, beside="fp8") as reference, atomic_onnx(target) as tmp:
        started = repair.start_clock("modelopt.onnx.quantization", log)
        result, origin = quantize(s.profile, s.calib, source, tmp, reference, log, on_step=step)
        found = repair.repair_gate(
            job, source, batches, q.min_cosine_fp8, repair.Trial((), tmp, result.accuracy, result.passed, result),
            started, lambda kept, path: quantize(s.profile, s.calib, source, path, reference, log, step, kept)[0],
            lambda quantized, path: quantized.accuracy)
        if found is not None and found.passed is not None:
            result = found.passed.result
        shared.gate("fp8", result.accuracy, q.min_cosine_fp8, HINT + repair.failed_note(found, "unquantized"))
    write_json(job.out / "fp8.lint.json", findings_json(result.findings))
    predicted, prediction = shared.predicted_engine(job, "fp8", target)
    return StageResult({"onnx": target, "lint": job.out / "fp8.lint.json", **predicted, **shared.log_output(log)},
                       result.metrics() | {"calibration": origin} | repair.recorded(found, "quant.fp8_exclude_nodes") | prediction)


def quantize_command(request: shared.QuantizeRequest) -> str:
    """quantize --fp8: the stage's `quantize` with the profile's settings and the command's flags, gated like the stage."""
    from pipeline.core.onnxfile import atomic_onnx

    settings = shared.request_settings("fp8", request, STAGE.reads)
    with atomic_onnx(request.output) as tmp:
        result, origin = quantize(settings.profile, settings.calib, request.source, tmp, on_step=request.on_step)
        shared.gate("fp8", result.accuracy, settings.profile.quant.min_cosine_fp8, HINT)
    return shared.ptq_command_line("FP8", request, result, origin)


STAGE = Stage(
    "fp8", run_fp8,
    reads=tuple(dict.fromkeys((*shared.CALIBRATION_READS, "quant.preset", "quant.fp8_exclude_nodes", *shared.HELD_OUT_READS, "quant.min_cosine_fp8",
                               "repair"))),
    inputs=("optimize.onnx",),
    packages=("nvidia-modelopt", "onnxruntime-gpu"),
    key_metric=lambda m: f"{repair.stage_note(m, 'unquantized')}{m['preset']} " + shared.ptq_line(m) + shared.predicted_line(m),
)
