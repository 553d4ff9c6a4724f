"""The export stage: the profile's PyTorch model to ONNX (checked against torch), or the ONNX file given."""

from __future__ import annotations

from pipeline.stage import Job, Stage, StageResult


def run_export(job: Job) -> StageResult:
    s = job.settings
    if s.onnx is not None:
        from pipeline.core.fileio import require_file
        from pipeline.export import check_onnx_file

        source = require_file(s.onnx, "ONNX file", "pass an existing .onnx path")
        nodes = check_onnx_file(source, s.profile)
        return StageResult({"onnx": source}, {"nodes": nodes}, skipped=True, reason=f"starting from {source}")
    from pipeline.export import export_model

    output, reference = job.out / "model.onnx", job.out / "model.generation.npz"
    result = export_model(s.profile, output, status=job.status, generation_reference=reference)
    metrics = {
        "exporter": result.exporter,
        "opset": result.opset,
        "nodes": result.nodes,
        "max_abs_diff": result.max_abs_diff,
        "tolerance": s.profile.export.tolerance,
        "checked_shapes": result.checked_shapes,
        "outputs": result.outputs,
    }
    if result.derived:  # a decoder's cache inputs: later stages use them (the runner applies them to the profile)
        metrics["derived_inputs"] = result.derived
    outputs = {"onnx": output}
    if result.generation:  # a decoder: torch's greedy generation, the reference of later stages
        metrics["generation"] = result.generation
        outputs["generation"] = reference
    return StageResult(outputs, metrics)


def _key_metric(m: dict) -> str:
    from pipeline.generation_stage import tokens_note
    from pipeline.models.decoder import derived_note

    return f"max_abs_diff={m['max_abs_diff']:.2e}, {m['nodes']} nodes{tokens_note(m)}{derived_note(m)}" if "max_abs_diff" in m else f"{m.get('nodes', '?')} nodes"


STAGE = Stage(
    "export", run_export,
    reads=("onnx", "model", "inputs", "dims", "export"),
    packages=("torch", "onnxscript"),
    key_metric=_key_metric,
)
