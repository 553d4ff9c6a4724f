"""The fp16 stage: ModelOpt AutoCast, the result run at the profile's min/opt/max shapes and gated on accuracy."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.profiles import Profile
from pipeline.generation_stage import GENERATION_INPUTS, GENERATION_READS, generation_figures, tokens_note
from pipeline.runner import Job, Stage, StageResult
from pipeline.stages import seeds
from pipeline.stages.accuracy import HELD_OUT_READS, accuracy, fp32_reference, gate, held_out


def shape_checks(profile: Profile) -> list[dict]:
    """Inputs at the profile's min, opt and max shapes: the FP16 model must run at each."""
    from pipeline.core.samples import make_inputs, range_sizes

    return [make_inputs(profile, seed=seeds.FP16_SHAPE_CHECK + i, dims=sizes) for i, sizes in enumerate(range_sizes(profile))]


def convert(profile: Profile, source: Path, target: Path, checks: list[dict], log: Path | None = None, reference_feeds: dict | None = None):
    """AutoCast `source` into `target` with the profile's exclusions; the result keeps the session that ran `checks`."""
    from pipeline.core.quiet import captured
    from quant.fp16 import convert_fp16

    q = profile.quant
    with captured(log):
        return convert_fp16(source, target, q.fp16_exclude_op_types, q.fp16_exclude_nodes, checks, reference_feeds)


def run_fp16(job: Job) -> StageResult:
    from pipeline.core.fileio import atomic_path
    from pipeline.models.decoder import autocast_feeds

    profile = job.settings.profile
    q, source, target = profile.quant, job.input("optimize", "onnx"), job.out / "model.fp16.onnx"
    batches = held_out(profile)
    with fp32_reference(job, batches) as reference, atomic_path(target) as tmp:
        job.status("converting to FP16 with ModelOpt AutoCast, checking it runs at the profile's min/opt/max shapes")
        result = convert(profile, source, tmp, shape_checks(profile), job.out / "fp16.log", autocast_feeds(profile))
        # the session that ran the shape checks
        figures = accuracy(result.session, reference, batches, q.accuracy_samples, "FP16", job.status)
        gate("fp16", figures, q.min_cosine_fp16)
        generation = generation_figures(job, result.session, "fp16")
    metrics = {"providers": result.providers, "nodes": result.nodes, "fp32_compute_nodes": result.fp32_nodes_kept,
               "placeholder_dims_repaired": result.dims_repaired, "runs_at_shapes": result.checked_shapes,
               "accuracy": figures, "min_cosine": q.min_cosine_fp16, **({"generation": generation} if generation else {})}
    return StageResult({"onnx": target, "log": job.out / "fp16.log"}, metrics)


FP16 = Stage(
    "fp16", run_fp16,
    reads=(*HELD_OUT_READS, "quant.fp16_exclude_op_types", "quant.fp16_exclude_nodes", "quant.min_cosine_fp16",
           *GENERATION_READS, "quant.min_token_agreement_fp16"),
    inputs=("optimize.onnx", *GENERATION_INPUTS),
    code=("quant.fp16", "quant.accuracy", "pipeline.stages.accuracy", "pipeline.generation_stage", "pipeline.core.generation"),
    packages=("nvidia-modelopt", "onnxruntime-gpu"),
    key_metric=lambda m: f"cosine_centered={m['accuracy']['cosine_centered']:.5f}, max_abs_diff={m['accuracy']['max_abs_diff']:.2e}{tokens_note(m)}",
)
