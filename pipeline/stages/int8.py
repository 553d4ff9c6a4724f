"""The int8 stage: ModelOpt Q/DQ calibrated on the profile's samples (or --calib), the preset's placement,
the Q/DQ lint, gated on accuracy. `python -m pipeline quantize --int8` calls `quantize` too."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.profiles import Profile
from pipeline.generation_stage import GENERATION_INPUTS, GENERATION_READS, fixed_feeds, generation_figures, tokens_note
from pipeline.stage import Job, Stage, StageResult
from pipeline.stages import repair, shared

# what `quantize` reads: the stage and the command declare the same settings
QUANTIZE_READS = (*shared.CALIBRATION_READS, "quant.preset", "quant.calibration_method", "quant.int8_float_dtype", "quant.int8_exclude_nodes")
Calibration = tuple[dict | list, str]  # (ModelOpt's calibration data: {input: samples} or a list of feeds, where it came from)


def quantize(profile: Profile, calib: Path | None, source: Path, target: Path, log: Path | None = None,
             on_step: Callable[[int, int], None] = lambda done, total: None, keep: tuple[str, ...] = (), fixed: dict | None = None,
             calibration: Calibration | None = None):
    """Q/DQ `source` into `target` with the profile's quant settings, the nodes named in `keep` (the repair's) left unquantized;
    returns the result and where the calibration data came from. `fixed`: an encoder-decoder's encoder outputs (cross-attention
    caches) and mask for its decoder. `calibration`: the data made already (`int8_samples`), else made here."""
    from pipeline.core.onnxfile import atomic_onnx
    from pipeline.core.quiet import captured
    from quant.fp16 import exact_names
    from quant.int8 import quantize_int8

    q = profile.quant
    data, origin = calibration if calibration is not None else calibration_of(profile, calib, source, fixed)
    batch = shared.calibration_batch(profile, source)
    with atomic_onnx(target) as tmp, captured(log):
        result = quantize_int8(source, tmp, data, batch, q.preset, q.int8_float_dtype, q.calibration_method, shared.max_sequence(profile),
                               on_step=on_step, nodes_to_exclude=[*q.int8_exclude_nodes, *exact_names(keep)])
        shared.require_quantized("int8", result.qdq_pairs, (
            f"ModelOpt leaves a MatMul/Gemm in float when its M or N is 1 at the calibration batch (here {batch}: a 2-D input's batch "
            f"is M) or its K or N is under 16, and a Conv with too few channels{_removed(result)}; if you deploy at a larger batch, "
            "pass --profile with it, or try another --preset"))
    return result, origin


def calibration_of(profile: Profile, calib: Path | None, source: Path, fixed: dict | None = None, session=None) -> Calibration:
    """The calibration data and where it came from: a decoder's prefill and decode steps on the caches its FP32 model
    writes (run by `session`, if given), else the profile's synthetic samples or --calib's."""
    from quant.calibration import calibration_data, decoder_calibration, fed_as_decoder

    if calib is None and fed_as_decoder(profile, source):
        steps = decoder_calibration(profile, source, profile.quant.samples, fixed=fixed, session=session)
        return steps.feeds, steps.origin
    return calibration_data(profile, calib, source)


def _removed(result) -> str:
    removed = len(result.qdq_removed_by_preset) // 2
    return f"; the {result.preset} preset removed {removed} Q/DQ pair(s) that TensorRT's fusion rules reject" if removed else ""


@dataclass(frozen=True)
class Int8Samples:
    calibration: Calibration
    held_out: list[dict]  # the accuracy check's batches
    kind: str  # of held_out: "held-out" or "decoder steps"
    reference: tuple[list | None, float] | None  # the FP32 outputs of held_out (None past the check's budget) and their seconds, where making them ran that model


def int8_samples(profile: Profile, calib: Path | None, source: Path, fixed: dict | None = None) -> Int8Samples:
    """The calibration data and the held-out batches. A decoder with its cache is checked as it is calibrated, on
    prefill and decode steps over the caches the FP32 model writes: on random caches an INT8 decoder calibrated on
    real ones is far off, and one calibrated on random ones is right only there. Both are made by one FP32 session,
    which is gone before ModelOpt starts, and the held-out steps' outputs are the accuracy check's reference."""
    from pipeline.core import seeds
    from pipeline.core.rss import release_freed_memory
    from pipeline.core.verify import OnnxSession
    from quant.calibration import decoder_calibration, fed_as_decoder

    if not fed_as_decoder(profile, source):
        return Int8Samples(calibration_of(profile, calib, source), shared.held_out(profile), "held-out", None)
    session, started = OnnxSession(source), time.perf_counter()
    held_out = decoder_calibration(profile, source, profile.quant.accuracy_samples, seeds.HELD_OUT_SEED, fixed, session, keep_outputs=True)
    reference = (held_out.outputs, time.perf_counter() - started)
    calibration = calibration_of(profile, calib, source, fixed, session)
    del session
    release_freed_memory()
    return Int8Samples(calibration, held_out.feeds, "decoder steps", reference)


def run_int8(job: Job) -> StageResult:
    from pipeline.core.fileio import write_json
    from pipeline.core.onnxfile import atomic_onnx
    from pipeline.core.verify import OnnxSession
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
    samples = int8_samples(s.profile, s.calib, source, fixed)
    batches, log = samples.held_out, job.out / "int8.log"
    with shared.fp32_reference(job, batches, samples.kind, "int8", samples.reference) as reference, atomic_onnx(target) as tmp:
        started = repair.start_clock("modelopt.onnx.quantization", log)
        result, origin = quantize(s.profile, s.calib, source, tmp, log, step, fixed=fixed, calibration=samples.calibration)
        checked: Path | OnnxSession = OnnxSession(tmp)  # the accuracy check's session runs the generation check too
        figures = shared.accuracy(checked, reference, batches, q.accuracy_samples, "INT8", job.status)
        if not shared.passes(figures, q.min_cosine_int8):
            checked = tmp  # its memory goes to the repair's trials; one that passes replaces the file
        found = repair.repair_gate(
            job, source, batches, q.min_cosine_int8, repair.Trial((), tmp, figures, shared.passes(figures, q.min_cosine_int8), result),
            started, lambda kept, path: quantize(s.profile, s.calib, source, path, log, step, kept, fixed, samples.calibration)[0],
            lambda quantized, path: shared.accuracy(path, reference, batches, q.accuracy_samples, "INT8", job.status))
        if found is not None and found.passed is not None:
            result, figures = found.passed.result, found.passed.figures
        lint = findings_json(result.findings)
        limit = "" if shared.passes(figures, q.min_cosine_int8) else shared.rounding_limit("INT8", source, reference, batches, q.accuracy_samples,
                                                                                            q.min_cosine_int8, job.status)
        shared.gate("int8", figures, q.min_cosine_int8, limit or "exclude sensitive nodes ([quant] int8_exclude_nodes), try another preset or "
                    "more calibration data" + repair.failed_note(found, "unquantized"))
        generation = generation_figures(job, checked, "int8")
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
