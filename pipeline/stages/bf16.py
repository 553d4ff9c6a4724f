"""The bf16 stage: ModelOpt AutoCast to BF16 with the FP16 stage's exclusions. With a CUDA device it is
run at the profile's min/opt/max shapes and gated on accuracy like FP16; onnxruntime's CPU provider
has no BF16 kernels for Conv/MatMul, so elsewhere it is written unchecked and the manifest says why.
`python -m pipeline quantize --bf16` calls `convert` too."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.profiles import QuantSection
from pipeline.stage import Job, Stage, StageResult
from pipeline.stages import repair, shared
from pipeline.stages.fp16 import shape_checked


def convert(quant: QuantSection, source: Path, target: Path, checks: list[dict], log: Path | None = None, keep: tuple[str, ...] = ()):
    """AutoCast `source` to BF16 into `target` with the [quant] exclusions and the nodes named in `keep` (the repair's)
    kept in FP32 (quant.fp16.convert_bf16)."""
    from pipeline.core.quiet import captured
    from quant.fp16 import convert_bf16, exact_names

    with captured(log):
        return convert_bf16(source, target, quant.fp16_exclude_op_types, [*quant.fp16_exclude_nodes, *exact_names(keep)], checks)


def run_bf16(job: Job) -> StageResult:
    from pipeline.core.onnxfile import atomic_onnx

    profile = job.settings.profile
    q, source, target, log = profile.quant, job.input("optimize", "onnx"), job.out / "model.bf16.onnx", job.out / "bf16.log"
    batches, checks, found = shared.held_out(profile), shared.shape_checks(profile), None
    with shared.fp32_reference(job, batches) as reference, atomic_onnx(target) as tmp:
        job.status("converting to BF16 with ModelOpt AutoCast")
        started = repair.start_clock("modelopt.onnx.autocast", log)
        result = convert(q, source, tmp, checks, log)
        if result.session is not None:
            figures = shared.accuracy(result.session, reference, batches, q.accuracy_samples, "BF16", job.status)
            found = repair.repair_gate(
                job, source, batches, q.min_cosine_bf16, repair.Trial((), tmp, figures, shared.passes(figures, q.min_cosine_bf16), result),
                started, lambda kept, path: convert(q, source, path, [], log, kept),
                lambda converted, path: shared.accuracy(converted.session, reference, batches, q.accuracy_samples, "BF16", job.status))
            if found is not None and found.passed is not None:
                result, figures = shape_checked(found.passed.result, tmp, checks, "bf16"), found.passed.figures
            shared.gate("bf16", figures, q.min_cosine_bf16, "exclude sensitive nodes ([quant] fp16_exclude_nodes)" + repair.failed_note(found, "in FP32"))
        else:
            figures = {"not_compared": result.unchecked}
    metrics = {"providers": result.providers, "nodes": result.nodes, "fp32_compute_nodes": result.fp32_nodes_kept,
               "placeholder_dims_repaired": result.dims_repaired, "runs_at_shapes": result.checked_shapes,
               "accuracy": figures, "min_cosine": q.min_cosine_bf16, **repair.recorded(found, "quant.fp16_exclude_nodes"), **shared.kernel_metrics(result)}
    predicted, prediction = shared.predicted_engine(job, "bf16", target)
    return StageResult({"onnx": target, **predicted, **shared.log_output(job.out / "bf16.log")}, metrics | prediction)


def quantize_command(request: shared.QuantizeRequest) -> str:
    """quantize --bf16: `convert` with the profile's exclusions and shape checks, or without --profile none, checked
    at the zero-filled shapes the source runs at."""
    if request.profile is None:
        return shared.autocast_line("BF16", request, convert(QuantSection(), request.source, request.output, shared.zero_checks(request.source)))
    profile = shared.request_settings("bf16", request, STAGE.reads).profile
    return shared.autocast_line("BF16", request, convert(profile.quant, request.source, request.output, shared.shape_checks(profile)))


def _summary(m: dict) -> str:
    figures = m["accuracy"]
    if "cosine_centered" in figures:
        return (f"{shared.kernel_note(m, 'BF16')}{repair.stage_note(m, 'in FP32')}cosine_centered={figures['cosine_centered']:.5f}, "
                f"max_abs_diff={figures['max_abs_diff']:.2e}{shared.predicted_line(m)}")
    return f"{m['nodes']} nodes, unchecked: {figures['not_compared']}{shared.predicted_line(m)}"


STAGE = Stage(
    "bf16", run_bf16,
    reads=(*shared.HELD_OUT_READS, "quant.fp16_exclude_op_types", "quant.fp16_exclude_nodes", "quant.min_cosine_bf16", "repair"),
    inputs=("optimize.onnx",),
    packages=("nvidia-modelopt", "onnxruntime-gpu"),
    key_metric=_summary,
)
