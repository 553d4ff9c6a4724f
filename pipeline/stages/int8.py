"""The int8 stage: ModelOpt Q/DQ calibrated on the profile's samples (or --calib), the preset's placement,
the Q/DQ lint, gated on accuracy. `python -m pipeline quantize --int8` calls `quantize` too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline.core.profiles import Profile
from pipeline.generation_stage import GENERATION_INPUTS, GENERATION_READS, generation_figures, tokens_note
from pipeline.runner import Job, Stage, StageResult
from pipeline.stages.accuracy import HELD_OUT_READS, accuracy, fp32_reference, gate, held_out

SEQUENCE_DIMS = ("seq", "sequence", "seq_len")
# what `quantize` reads: the stage and the command declare the same settings
QUANTIZE_READS = ("calib", "inputs", "dims", "quant.preset", "quant.samples", "quant.calibration_method", "quant.int8_float_dtype")


def calibration_batch(profile: Profile, source: Path) -> int:
    """Samples per calibration run: the model's static batch dim, else the profile's batch size (at opt) for
    the model's first input it describes, else 1 (a profile describing another model says nothing of this one)."""
    from quant.calibration import model_inputs

    inputs = model_inputs(source)
    first = next(iter(inputs.values()), ("", []))[1]
    if first and first[0] is not None:
        return first[0]
    named = {spec.name: spec for spec in profile.inputs}
    return next((profile.shape(named[name])[0] for name in inputs if name in named), 1)


def quantize(profile: Profile, calib: Path | None, source: Path, target: Path, log: Path | None = None,
             on_step: Callable[[int, int], None] = lambda done, total: None):
    """Q/DQ `source` into `target` with the profile's quant settings; returns the result and where the calibration data came from."""
    from pipeline.core.quiet import captured
    from quant.calibration import calibration_data, decoder_calibration, fed_as_decoder
    from quant.int8 import quantize_int8

    q = profile.quant
    if calib is None and fed_as_decoder(profile, source):
        calibration, origin = decoder_calibration(profile, source, q.samples)
    else:
        calibration, origin = calibration_data(profile, calib, source)
    max_sequence = max((d.max for name, d in profile.dims.items() if name in SEQUENCE_DIMS), default=None)
    with captured(log):
        result = quantize_int8(source, target, calibration, calibration_batch(profile, source), q.preset, q.int8_float_dtype,
                               q.calibration_method, max_sequence, on_step=on_step)
    return result, origin


def held_out_int8(profile: Profile, source: Path) -> tuple[list[dict], str]:
    """The held-out samples and their kind. A decoder with its cache is checked as it is calibrated, on
    prefill and decode steps over the caches the FP32 model writes: on random caches an INT8 decoder
    calibrated on real ones is far off, and one calibrated on random ones is right only there."""
    from pipeline.stages import seeds
    from quant.calibration import decoder_calibration, fed_as_decoder

    if fed_as_decoder(profile, source):
        return decoder_calibration(profile, source, profile.quant.accuracy_samples, seed=seeds.HELD_OUT_SEED)[0], "decoder steps"
    return held_out(profile), "held-out"


def run_int8(job: Job) -> StageResult:
    from pipeline.core.fileio import atomic_path, write_json
    from quant.lint import findings_json

    s = job.settings
    q, source, target = s.profile.quant, job.input("optimize", "onnx"), job.out / "model.int8.onnx"
    job.status("preparing calibration data")

    def step(done: int, total: int) -> None:
        filled = round(24 * done / total)
        job.status(f"calibrating ({q.preset}) [{'#' * filled}{'.' * (24 - filled)}] {done}/{total}")

    batches, kind = held_out_int8(s.profile, source)
    with fp32_reference(job, batches, kind) as reference, atomic_path(target) as tmp:
        result, origin = quantize(s.profile, s.calib, source, tmp, job.out / "int8.log", on_step=step)
        lint = findings_json(result.findings)
        figures = accuracy(tmp, reference, batches, q.accuracy_samples, "INT8", job.status)
        gate("int8", figures, q.min_cosine_int8)
        generation = generation_figures(job, tmp, "int8")
    write_json(job.out / "int8.lint.json", lint)
    metrics = {
        "preset": result.preset, "high_precision_dtype": result.high_precision_dtype, "calibration": origin,
        "calibration_samples": result.calibration_samples, "calibration_method": result.calibration_method,
        "disable_mha_qdq": result.disable_mha_qdq, "qdq_pairs": result.qdq_pairs,
        "qdq_removed_by_preset": len(result.qdq_removed_by_preset) // 2, "notes": result.notes,
        "lint": {"count": lint["count"], "by_rule": lint["by_rule"]}, "accuracy": figures, "min_cosine": q.min_cosine_int8,
        **({"generation": generation} if generation else {}),
    }
    return StageResult({"onnx": target, "lint": job.out / "int8.lint.json", "log": job.out / "int8.log"}, metrics)


INT8 = Stage(
    "int8", run_int8,
    reads=tuple(dict.fromkeys((*QUANTIZE_READS, *HELD_OUT_READS, "quant.min_cosine_int8", *GENERATION_READS, "quant.min_token_agreement_int8"))),
    inputs=("optimize.onnx", *GENERATION_INPUTS),
    code=("quant.int8", "quant.presets", "quant.lint", "quant.calibration", "quant.accuracy", "pipeline.stages.accuracy",
          "pipeline.generation_stage", "pipeline.core.generation"),
    packages=("nvidia-modelopt", "onnxruntime-gpu"),
    key_metric=lambda m: (f"{m['preset']}: cosine_centered={m['accuracy']['cosine_centered']:.4f}, {m['qdq_pairs']} Q/DQ, {m['lint']['count']} lint findings"
                          f"{tokens_note(m)}"),
)
