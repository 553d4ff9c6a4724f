"""The export stage: the profile's PyTorch model to ONNX (checked against torch), or the ONNX file given."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import InputError
from pipeline.core.profiles import Profile
from pipeline.stage import Job, Stage, StageResult


def run_export(job: Job) -> StageResult:
    s = job.settings
    if s.onnx is not None:
        from pipeline.core.fileio import require_file

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
    if result.generation:  # a decoder: torch's greedy generation, the reference of later stages (unless skipped, and why)
        metrics["generation"] = result.generation
        if "skipped" not in result.generation:
            outputs["generation"] = reference
    return StageResult(outputs, metrics)


def check_onnx_file(path: Path, profile: Profile) -> int:
    """Check a user's ONNX file can start a build with this profile (weights not read); return its node count."""
    from pipeline.core.onnxfile import load_onnx

    model = load_onnx(path)
    if not model.graph.node:
        raise InputError(f"{path}: the ONNX graph has no nodes; export the model again")
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    if not inputs:
        raise InputError(f"{path}: the model has no inputs, so there is nothing to feed or calibrate; export it with its inputs")
    declared = [spec.name for spec in profile.inputs]
    missing = [name for name in inputs if name not in declared]
    if missing:
        fix = "pass --profile with a profile of your model" if profile.packaged else f"add it to {profile.source}"
        raise InputError(f"{path}: model input {missing[0]!r} is not in profile {profile.name}'s [[inputs]] ({', '.join(declared)}); "
                         f"{fix} (the model's inputs: {', '.join(inputs)})")
    return len(model.graph.node)


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
