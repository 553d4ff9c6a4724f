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




def _optimize_fingerprint(ctx: Context) -> dict[str, Any]:
    from pipeline import optimize

    rules_dir = Path(optimize.__file__).parent
    return {
        "onnx_sha256": sha256_file(ctx.input("export", "onnx")),
        "settings": ctx.profile.optimize.model_dump(),
        "code": sorted(sha256_file(p) for p in rules_dir.rglob("*.py")),
    }


def _run_optimize(ctx: Context, status: Status) -> StageResult:
    from pipeline.errors import StageFailed
    from pipeline.fileio import atomic_path
    from pipeline.optimize import optimize_file
    from pipeline.samples import check_sizes, make_inputs
    from pipeline.verify import compare_models

    settings, source, target = ctx.profile.optimize, ctx.input("export", "onnx"), ctx.out / "model.opt.onnx"
    feed_sets = [make_inputs(ctx.profile, seed=2000 + i, dims=sizes) for i, sizes in enumerate(check_sizes(ctx.profile))]
    with atomic_path(target) as tmp:
        status("applying rewrite rules")
        result = optimize_file(source, tmp, settings.rules, settings.skip_rules)
        status("comparing with the input model on onnxruntime (CPU)")
        diff = compare_models(source, tmp, feed_sets)
        if not diff <= settings.tolerance:
            raise StageFailed(
                f"optimize: the optimized model differs from its input by max_abs_diff={diff:.3g} > {settings.tolerance:g}; "
                f"last rules applied: {', '.join(result.last_rules()) or 'none'}; skip them with [optimize] skip_rules in the profile"
            )
    metrics = {
        "nodes_before": result.nodes_before,
        "nodes_after": result.nodes_after,
        "op_delta": result.op_delta,
        "max_abs_diff": diff,
        "tolerance": settings.tolerance,
        "checked_shapes": [{k: list(v.shape) for k, v in feeds.items()} for feeds in feed_sets],
        "rules": result.rules,
    }
    return StageResult({"onnx": target}, metrics)


OPTIMIZE = Stage(
    "optimize",
    _optimize_fingerprint,
    _run_optimize,
    key_metric=lambda m: f"{m['nodes_before']} -> {m['nodes_after']} nodes, max_abs_diff={m['max_abs_diff']:.2e}",
)


def build_plan(ctx: Context) -> list[Stage]:
    return [EXPORT, OPTIMIZE]
