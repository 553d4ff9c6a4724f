"""The fp16 stage: ModelOpt AutoCast, the result run at the profile's min/opt/max shapes and gated on accuracy.
`python -m pipeline quantize --fp16` calls `convert` too."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.profiles import QuantSection
from pipeline.generation_stage import GENERATION_INPUTS, GENERATION_READS, generation_figures, tokens_note
from pipeline.stage import Job, Stage, StageResult
from pipeline.stages import shared


def convert(quant: QuantSection, source: Path, target: Path, checks: list[dict], log: Path | None = None, reference_feeds: dict | None = None):
    """AutoCast `source` into `target` with the [quant] exclusions; the result keeps the session that ran `checks`."""
    from pipeline.core.quiet import captured
    from quant.fp16 import convert_fp16

    with captured(log):
        return convert_fp16(source, target, quant.fp16_exclude_op_types, quant.fp16_exclude_nodes, checks, reference_feeds)


def run_fp16(job: Job) -> StageResult:
    from pipeline.core.onnxfile import atomic_onnx
    from pipeline.models.decoder import autocast_feeds

    profile = job.settings.profile
    q, source, target = profile.quant, job.input("optimize", "onnx"), job.out / "model.fp16.onnx"
    batches = shared.held_out(profile)
    with shared.fp32_reference(job, batches) as reference, atomic_onnx(target) as tmp:
        job.status("converting to FP16 with ModelOpt AutoCast, checking it runs at the profile's min/opt/max shapes")
        result = convert(q, source, tmp, shared.shape_checks(profile), job.out / "fp16.log", autocast_feeds(profile))
        # the session that ran the shape checks
        figures = shared.accuracy(result.session, reference, batches, q.accuracy_samples, "FP16", job.status)
        shared.gate("fp16", figures, q.min_cosine_fp16, shared.fp16_gate_hint(source, profile))
        generation = generation_figures(job, result.session, "fp16")
    metrics = {"providers": result.providers, "nodes": result.nodes, "fp32_compute_nodes": result.fp32_nodes_kept,
               "placeholder_dims_repaired": result.dims_repaired, "runs_at_shapes": result.checked_shapes,
               "accuracy": figures, "min_cosine": q.min_cosine_fp16, **({"generation": generation} if generation else {})}
    predicted, prediction = shared.predicted_engine(job, "fp16", target)
    return StageResult({"onnx": target, **predicted, **shared.log_output(job.out / "fp16.log")}, metrics | prediction)


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
           *GENERATION_READS, "quant.min_token_agreement_fp16"),
    inputs=("optimize.onnx", *GENERATION_INPUTS),
    packages=("nvidia-modelopt", "onnxruntime-gpu"),
    key_metric=lambda m: (f"cosine_centered={m['accuracy']['cosine_centered']:.5f}, max_abs_diff={m['accuracy']['max_abs_diff']:.2e}{tokens_note(m)}"
                          f"{shared.predicted_line(m)}"),
)
