"""The int8 stage: ModelOpt Q/DQ calibrated on the profile's samples (or --calib), the preset's placement,
the Q/DQ lint, gated on accuracy. `python -m pipeline quantize --int8` calls `quantize` too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline.core.profiles import Profile
from pipeline.generation_stage import GENERATION_INPUTS, GENERATION_READS, fixed_feeds, generation_figures, tokens_note
from pipeline.stage import Job, Stage, StageResult
from pipeline.stages import repair, shared

# what `quantize` reads: the stage and the command declare the same settings
QUANTIZE_READS = (*shared.CALIBRATION_READS, "quant.preset", "quant.calibration_method", "quant.int8_float_dtype", "quant.int8_exclude_nodes")


def quantize(profile: Profile, calib: Path | None, source: Path, target: Path, log: Path | None = None,
             on_step: Callable[[int, int], None] = lambda done, total: None, keep: tuple[str, ...] = (), fixed: dict | None = None):
    """Q/DQ `source` into `target` with the profile's quant settings, the nodes named in `keep` (the repair's) left unquantized;
    returns the result and where the calibration data came from. `fixed`: an encoder-decoder's encoder outputs (cross-attention caches) and mask for its decoder."""
    from pipeline.core.onnxfile import atomic_onnx
    from pipeline.core.quiet import captured
    from quant.calibration import calibration_data, decoder_calibration, fed_as_decoder
    from quant.fp16 import exact_names
    from quant.int8 import quantize_int8

    q = profile.quant
    if calib is None and fed_as_decoder(profile, source):
        calibration, origin = decoder_calibration(profile, source, q.samples, fixed=fixed)
    else:
        calibration, origin = calibration_data(profile, calib, source)
    batch = shared.calibration_batch(profile, source)
    with atomic_onnx(target) as tmp, captured(log):
        result = quantize_int8(source, tmp, calibration, batch, q.preset, q.int8_float_dtype, q.calibration_method, shared.max_sequence(profile),
                               on_step=on_step, nodes_to_exclude=[*q.int8_exclude_nodes, *exact_names(keep)])
        shared.require_quantized("int8", result.qdq_pairs, (
            f"ModelOpt leaves a MatMul/Gemm in float when its M or N is 1 at the calibration batch (here {batch}: a 2-D input's batch "
            f"is M) or its K or N is under 16, and a Conv with too few channels{_removed(result)}; if you deploy at a larger batch, "
            "pass --profile with it, or try another --preset"))
    return result, origin


def _removed(result) -> str:
    removed = len(result.qdq_removed_by_preset) // 2
    return f"; the {result.preset} preset removed {removed} Q/DQ pair(s) that TensorRT's fusion rules reject" if removed else ""


def held_out_int8(profile: Profile, source: Path, fixed: dict | None = None) -> tuple[list[dict], str]:
    """The held-out samples and their kind. A decoder with its cache is checked as it is calibrated, on
    prefill and decode steps over the caches the FP32 model writes: on random caches an INT8 decoder
    calibrated on real ones is far off, and one calibrated on random ones is right only there."""
    from pipeline.core import seeds
    from quant.calibration import decoder_calibration, fed_as_decoder

    if fed_as_decoder(profile, source):
        return decoder_calibration(profile, source, profile.quant.accuracy_samples, seeds.HELD_OUT_SEED, fixed)[0], "decoder steps"
    return shared.held_out(profile), "held-out"


def run_int8(job: Job) -> StageResult:
    from pipeline.core.fileio import write_json
    from pipeline.core.onnxfile import atomic_onnx
    from quant import check_room_for_modelopt
    from quant.lint import findings_json

    s = job.settings
    q, source, target = s.profile.quant, job.input("optimize", "onnx"), job.out / "model.int8.onnx"
    check_room_for_modelopt(source, "int8", "int8")  # before the calibration and held-out runs, not after them
    job.status("preparing calibration data")

    def step(done: int, total: int) -> None:
        filled = round(24 * done / total)
        job.status(f"calibrating ({q.preset}) [{'#' * filled}{'.' * (24 - filled)}] {done}/{total}")

    fixed = fixed_feeds(job)  # an encoder-decoder's decoder: calibrated and checked on the encoder's real output
    batches, kind = held_out_int8(s.profile, source, fixed)
    log = job.out / "int8.log"
    with shared.fp32_reference(job, batches, kind, beside="int8") as reference, atomic_onnx(target) as tmp:
        started = repair.start_clock("modelopt.onnx.quantization", log)
        result, origin = quantize(s.profile, s.calib, source, tmp, log, on_step=step, fixed=fixed)
        figures = shared.accuracy(tmp, reference, batches, q.accuracy_samples, "INT8", job.status)
        found = repair.repair_gate(
            job, source, batches, q.min_cosine_int8, repair.Trial((), tmp, figures, shared.passes(figures, q.min_cosine_int8), result),
            started, lambda kept, path: quantize(s.profile, s.calib, source, path, log, step, kept, fixed)[0],
            lambda quantized, path: shared.accuracy(path, reference, batches, q.accuracy_samples, "INT8", job.status))
        if found is not None and found.passed is not None:
            result, figures = found.passed.result, found.passed.figures
        lint = findings_json(result.findings)
        limit = "" if shared.passes(figures, q.min_cosine_int8) else shared.rounding_limit("INT8", source, reference, batches, q.accuracy_samples,
                                                                                            q.min_cosine_int8, job.status)
        shared.gate("int8", figures, q.min_cosine_int8, limit or "exclude sensitive nodes ([quant] int8_exclude_nodes), try another preset or "
                    "more calibration data" + repair.failed_note(found, "unquantized"))
        generation = generation_figures(job, tmp, "int8")
    write_json(job.out / "int8.lint.json", lint)
    metrics = {
        "preset": result.preset, "high_precision_dtype": result.high_precision_dtype, "calibration": origin,
        "calibration_samples": result.calibration_samples, "calibration_method": result.calibration_method,
        "disable_mha_qdq": result.disable_mha_qdq, "qdq_pairs": result.qdq_pairs,
        "qdq_removed_by_preset": len(result.qdq_removed_by_preset) // 2, "notes": result.notes,
        "lint": {"count": lint["count"], "by_rule": lint["by_rule"]}, "accuracy": figures, "min_cosine": q.min_cosine_int8,
        **({"generation": generation} if generation else {}), **repair.recorded(found, "quant.int8_exclude_nodes"),
    }
    predicted, prediction = shared.predicted_engine(job, "int8", target)
    return StageResult({"onnx": target, "lint": job.out / "int8.lint.json", **predicted, **shared.log_output(job.out / "int8.log")}, metrics | prediction)


def quantize_command(request: shared.QuantizeRequest) -> str:
    """quantize --int8 (with --fp16: its float parts in FP16): the stage's `quantize` with the profile's settings, or
    with --calib alone the [quant] defaults and no sequence range or batch taken from another model's profile."""
    from pipeline.core import DEFAULT_PROFILE
    from pipeline.core.errors import PipelineError
    from pipeline.core.profiles import QuantSection, load_profile
    from pipeline.settings import Options, Settings

    if request.calib is None and request.profile is None:
        raise PipelineError("quantize --int8 needs calibration data: --calib FILE.npz, or --profile NAME for synthetic samples")
    if request.profile is not None:
        loaded = request.profile
    else:
        loaded = load_profile(DEFAULT_PROFILE).model_copy(update={"dims": {}, "quant": QuantSection()})
    if request.float_parts == "fp16":
        loaded = loaded.model_copy(update={"quant": loaded.quant.model_copy(update={"int8_float_dtype": "fp16"})})
    profile = Settings("int8", loaded, Options(calib=request.calib, preset=request.preset), QUANTIZE_READS).profile
    result, origin = quantize(profile, request.calib, request.source, request.output, on_step=request.on_step, fixed=request.fixed)
    return (f"wrote {request.output}: INT8 ({result.preset}), {result.qdq_pairs} Q/DQ pairs, calibration: {origin}; "
            f"lint-qdq: {len(result.findings)} findings")


STAGE = Stage(
    "int8", run_int8,
    reads=tuple(dict.fromkeys((*QUANTIZE_READS, *shared.HELD_OUT_READS, "quant.min_cosine_int8", *GENERATION_READS, "quant.min_token_agreement_int8", "repair"))),
    inputs=("optimize.onnx", *GENERATION_INPUTS),
    packages=("nvidia-modelopt", "onnxruntime-gpu"),
    key_metric=lambda m: (f"{repair.stage_note(m, 'unquantized')}{m['preset']}: cosine_centered={m['accuracy']['cosine_centered']:.4f}, {m['qdq_pairs']} Q/DQ, {shared.lint_count(m)}"
                          f"{tokens_note(m)}{shared.predicted_line(m)}"),
)
