"""The fp16 stage: ModelOpt AutoCast, the result run at the profile's min/opt/max shapes and gated on accuracy.
`python -m pipeline quantize --fp16` calls `convert` too."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.core.profiles import QuantSection
from pipeline.generation_stage import GENERATION_INPUTS, GENERATION_READS, generation_figures, tokens_note
from pipeline.stage import Job, Stage, StageResult
from pipeline.stages import repair, shared


def convert(quant: QuantSection, source: Path, target: Path, checks: list[dict], log: Path | None = None, reference_feeds: dict | None = None,
            keep: tuple[str, ...] = ()):
    """AutoCast `source` into `target` with the [quant] exclusions and the nodes named in `keep` (the repair's) kept in
    FP32; the result keeps the session that ran `checks`."""
    from pipeline.core.quiet import captured
    from quant.fp16 import convert_fp16, exact_names

    with captured(log):
        return convert_fp16(source, target, quant.fp16_exclude_op_types, [*quant.fp16_exclude_nodes, *exact_names(keep)], checks, reference_feeds)


def run_fp16(job: Job) -> StageResult:
    from pipeline.core.onnxfile import atomic_onnx
    from pipeline.models.decoder import autocast_feeds
    from quant import check_room_for_modelopt

    profile = job.settings.profile
    q, source, target, log = profile.quant, job.input("optimize", "onnx"), job.out / "model.fp16.onnx", job.out / "fp16.log"
    check_room_for_modelopt(source, "autocast", "fp16")  # before the FP32 reference run starts beside it
    batches, checks, feeds = shared.held_out(profile), shared.shape_checks(profile), autocast_feeds(profile)
    with shared.fp32_reference(job, batches, beside="autocast") as reference, atomic_onnx(target) as tmp:
        job.status("converting to FP16 with ModelOpt AutoCast, checking it runs at the profile's min/opt/max shapes")
        started = repair.start_clock("modelopt.onnx.autocast", log)
        result = convert(q, source, tmp, checks, log, feeds)
        # the session that ran the shape checks
        figures = shared.accuracy(result.session, reference, batches, q.accuracy_samples, "FP16", job.status)
        found = repair.repair_gate(
            job, source, batches, q.min_cosine_fp16, repair.Trial((), tmp, figures, shared.passes(figures, q.min_cosine_fp16), result),
            started, lambda kept, path: convert(q, source, path, [], log, feeds, kept),
            lambda converted, path: shared.accuracy(converted.session, reference, batches, q.accuracy_samples, "FP16", job.status))
        if found is not None and found.passed is not None:
            result, figures = shape_checked(found.passed.result, tmp, checks), found.passed.figures
        limit = "" if shared.passes(figures, q.min_cosine_fp16) else shared.rounding_limit("FP16", source, reference, batches, q.accuracy_samples,
                                                                                            q.min_cosine_fp16, job.status)
        shared.gate("fp16", figures, q.min_cosine_fp16, limit or shared.fp16_gate_hint(source, profile) + repair.failed_note(found, "in FP32"))
        generation = generation_figures(job, result.session, "fp16")
    metrics = {"providers": result.providers, "nodes": result.nodes, "fp32_compute_nodes": result.fp32_nodes_kept,
               "placeholder_dims_repaired": result.dims_repaired, "runs_at_shapes": result.checked_shapes,
               "accuracy": figures, "min_cosine": q.min_cosine_fp16, **({"generation": generation} if generation else {}),
               **repair.recorded(found, "quant.fp16_exclude_nodes"), **shared.kernel_metrics(result)}
    predicted, prediction = shared.predicted_engine(job, "fp16", target)
    return StageResult({"onnx": target, **predicted, **shared.log_output(job.out / "fp16.log")}, metrics | prediction)


def shape_checked(result, model: Path, checks: list[dict], stage: str = "fp16"):
    """`result` (a repair's trial, converted unchecked) once its model has run at the shape checks, on the provider its
    session ran on (BF16's on CUDA)."""
    from quant.fp16 import check_runs

    session, checked = check_runs(model, checks, stage, result.session.provider)
    return dataclasses.replace(result, session=session, checked_shapes=checked)


def quantize_command(request: shared.QuantizeRequest) -> str:
    """quantize --fp16: `convert` with the profile's exclusions and shape checks (and a decoder's reference feeds, as
    the stage passes them); without --profile, no exclusions, checked at the zero-filled shapes the source runs at."""
    if request.profile is None:
        return shared.autocast_line("FP16", request, convert(QuantSection(), request.source, request.output, shared.zero_checks(request.source)))
    from pipeline.models.decoder import autocast_feeds

    profile = shared.request_settings("fp16", request, STAGE.reads).profile
    return shared.autocast_line("FP16", request, convert(profile.quant, request.source, request.output, shared.shape_checks(profile),
                                                  reference_feeds=autocast_feeds(profile)))


STAGE = Stage(
    "fp16", run_fp16,
    reads=(*shared.HELD_OUT_READS, "quant.fp16_exclude_op_types", "quant.fp16_exclude_nodes", "quant.min_cosine_fp16",
           *GENERATION_READS, "quant.min_token_agreement_fp16", "repair"),
    inputs=("optimize.onnx", *GENERATION_INPUTS),
    packages=("nvidia-modelopt", "onnxruntime-gpu"),
    key_metric=lambda m: (f"{shared.kernel_note(m, 'FP16')}{repair.stage_note(m, 'in FP32')}cosine_centered={m['accuracy']['cosine_centered']:.5f}, "
                          f"max_abs_diff={m['accuracy']['max_abs_diff']:.2e}{tokens_note(m)}{shared.predicted_line(m)}"),
)
