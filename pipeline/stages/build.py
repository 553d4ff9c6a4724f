"""The build stage: one TensorRT engine per precision (through trt/builders.py), each profiled per layer and
checked against onnxruntime FP32. Without TensorRT or a GPU it is skipped with the reason and the Docker
command that runs it; an engine this GPU cannot build (FP8 below compute capability 8.9) alone is not built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core import seeds
from pipeline.settings import Settings
from pipeline.stage import Job, Stage, StageResult
from pipeline.stages import shared
from pipeline.stages.engines import engine_inputs, precisions_of, skip_without_tensorrt


def _unbuildable(precision) -> str | None:
    """Why this machine's GPU cannot build the precision's engine, or None."""
    from trt.capability import below_compute_capability, compute_capability

    if precision.min_compute_capability is None:
        return None
    return below_compute_capability(precision.label, precision.min_compute_capability, compute_capability())


def _shapes(settings: Settings) -> dict:
    profile = settings.profile
    if not profile.dynamic:
        return {}
    return {spec.name: tuple(profile.shape(spec, which) for which in ("min", "opt", "max")) for spec in profile.inputs}


def run_build(job: Job) -> StageResult:
    s = job.settings
    skipped = skip_without_tensorrt("building engines", job, precisions_of(s))
    if skipped:
        return skipped
    from pipeline.core.samples import make_inputs
    from trt.build import BuildPaths, BuildSettings
    from trt.builders import build_and_profile

    b, out = s.profile.build, job.out
    settings = BuildSettings(b.verbosity, b.workspace_mib, b.optimization_level, b.log_severity, s.weak_fp16)
    batches = shared.held_out(s.profile)
    outputs, metrics = {}, {}
    for precision in precisions_of(s):
        prec = precision.name
        if why := _unbuildable(precision):
            metrics[prec] = {"skipped": why, "requires_compute_capability": ".".join(map(str, precision.min_compute_capability))}
            job.status(f"not building the {prec} engine: {why}")
            continue
        paths = BuildPaths(out / precision.engine, out / f"{prec}.layers.json", out / f"{prec}.build.log", out / "timing.cache",
                           out / f"{prec}.profile.json")
        job.status(f"building the {prec} engine ({b.builder})")
        metrics[prec] = build_and_profile(b.builder, job.input(precision.stage, "onnx"), paths, _shapes(s), settings,
                                          make_inputs(s.profile, seed=seeds.ENGINE_PROFILE), b.profile_iterations, b.profile_warmup, job.status)
        job.status(f"running the {prec} engine and onnxruntime FP32 on {s.profile.quant.accuracy_samples} held-out samples (Polygraphy)")
        metrics[prec]["accuracy"] = _engine_accuracy(paths.engine, job.input("optimize", "onnx"), batches, s.profile.quant.accuracy_samples)
        outputs |= {f"{prec}_engine": paths.engine, f"{prec}_layers": paths.layers_json, f"{prec}_profile": paths.profile_json,
                    f"{prec}_log": paths.build_log}
    return StageResult(outputs, metrics)


def _engine_accuracy(engine: Path, reference: Path, batches: list[dict], samples: int) -> dict[str, Any]:
    """The engine against onnxruntime running the FP32 model on the held-out batches, figures as the
    precision stages compute them."""
    from quant.accuracy import agreement
    from trt.engine_accuracy import run_engine_and_onnx

    run = run_engine_and_onnx(engine, reference, batches)
    if run.not_compared:
        return {"not_compared": run.not_compared}
    return {"reference": "onnxruntime CPU, FP32 model"} | agreement(run.onnx, run.engine) | {"samples": samples}


def _summary(metrics: dict[str, Any]) -> str:
    parts = []
    for prec, built in metrics.items():
        if "skipped" in built:
            parts.append(f"{prec}: not built ({built['skipped']})")
            continue
        accuracy = built.get("accuracy", {})
        figure = f"cosine_centered={accuracy['cosine_centered']:.5f} vs onnxruntime FP32" if "cosine_centered" in accuracy else "accuracy not compared"
        parts.append(f"{prec}: {built.get('layers', '?')} layers, {figure}")
    return ", ".join(parts)


STAGE = Stage(
    "build", run_build,
    reads=("precisions", "weak_fp16", *shared.HELD_OUT_READS, "build.builder", "build.verbosity", "build.workspace_mib", "build.optimization_level",
           "build.log_severity", "build.profile_warmup", "build.profile_iterations"),
    inputs=engine_inputs(),
    packages=("tensorrt", "polygraphy"),
    key_metric=_summary,
)
