"""The optimize stage: the rewrite rules, then the optimized model checked against its input on onnxruntime."""

from __future__ import annotations

from pipeline.core import seeds
from pipeline.generation_stage import GENERATION_INPUTS, GENERATION_READS, generation_figures, tokens_note
from pipeline.stage import Job, Stage, StageResult


def run_optimize(job: Job) -> StageResult:
    from pipeline.core.errors import StageFailed
    from pipeline.core.onnxfile import atomic_onnx
    from pipeline.core.samples import check_sizes, make_inputs
    from pipeline.core.verify import differences
    from pipeline.optimize import optimize_file

    profile = job.settings.profile
    settings, source, target = profile.optimize, job.input("export", "onnx"), job.out / "model.opt.onnx"
    feed_sets = [make_inputs(profile, seed=seeds.OPTIMIZE_CHECK + i, dims=sizes) for i, sizes in enumerate(check_sizes(profile))]
    with atomic_onnx(target) as tmp:
        job.status("applying rewrite rules")
        result = optimize_file(source, tmp, settings.rules, settings.skip_rules)
        job.status("comparing with the input model on onnxruntime (CPU)")
        diff, scaled, session = differences(source, tmp, feed_sets)
        if not scaled <= settings.tolerance:
            scaled_text = f" ({scaled:.3g} divided by the output's largest magnitude)" if diff > scaled else ""
            raise StageFailed(
                f"optimize: the optimized model differs from its input by max_abs_diff={diff:.3g}{scaled_text} > {settings.tolerance:g}; "
                f"last rules applied: {', '.join(result.last_rules()) or 'none'}; skip them with [optimize] skip_rules in the profile"
            )
        generation = generation_figures(job, session, "optimize")  # the same session: one load of the weights, not two
        del session
    metrics = {
        "nodes_before": result.nodes_before,
        "nodes_after": result.nodes_after,
        "op_delta": result.op_delta,
        "max_abs_diff": diff,
        "tolerance": settings.tolerance,
        "checked_shapes": [{k: list(v.shape) for k, v in feeds.items()} for feeds in feed_sets],
        "rules": result.rules,
    }
    if generation:
        metrics["generation"] = generation
    return StageResult({"onnx": target}, metrics)


STAGE = Stage(
    "optimize", run_optimize,
    reads=("optimize", *GENERATION_READS),
    inputs=GENERATION_INPUTS,
    packages=("onnx-ir",),
    key_metric=lambda m: f"{m['nodes_before']} -> {m['nodes_after']} nodes, max_abs_diff={m['max_abs_diff']:.2e}{tokens_note(m)}",
)
