"""The stages `build` runs, in order, each wired to its stage module's one public entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.fileio import sha256_file
from pipeline.runner import Context, Stage, StageResult, Status


def _onnx_source(ctx: Context) -> Path | None:
    """An ONNX file to start from: --onnx, else the profile's `model.onnx`."""
    given = ctx.options.get("onnx")
    return Path(given).resolve() if given else ctx.profile.onnx_path()


def _export_fingerprint(ctx: Context) -> dict[str, Any]:
    source = _onnx_source(ctx)
    if source is not None:
        return {"onnx": str(source), "sha256": sha256_file(source) if source.is_file() else None}
    from pipeline.export import factory_fingerprint

    return factory_fingerprint(ctx.profile)


def _run_export(ctx: Context, status: Status) -> StageResult:
    source = _onnx_source(ctx)
    if source is not None:
        from pipeline.export import check_onnx_file

        nodes = check_onnx_file(source)
        return StageResult({"onnx": source}, {"nodes": nodes}, skipped=True, reason=f"starting from {source}")
    from pipeline.export import export_model

    output = ctx.out / "model.onnx"
    result = export_model(ctx.profile, output, status=status)
    metrics = {
        "exporter": result.exporter,
        "opset": result.opset,
        "nodes": result.nodes,
        "max_abs_diff": result.max_abs_diff,
        "tolerance": ctx.profile.export.tolerance,
        "checked_shapes": result.checked_shapes,
    }
    return StageResult({"onnx": output}, metrics)


EXPORT = Stage(
    "export",
    _export_fingerprint,
    _run_export,
    key_metric=lambda m: f"max_abs_diff={m['max_abs_diff']:.2e}, {m['nodes']} nodes" if "max_abs_diff" in m else f"{m.get('nodes', '?')} nodes",
)


def build_plan(ctx: Context) -> list[Stage]:
    return [EXPORT]
