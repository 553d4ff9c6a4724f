"""The TensorRT stages: build (one engine per precision, through trt/builders.py), report, diff, bench.
Without TensorRT or a GPU they are skipped with the reason and the Docker command that runs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.runner import Job, Stage, StageResult
from pipeline.settings import Settings
from pipeline.stages import seeds
from pipeline.stages.accuracy import HELD_OUT_READS, held_out

PRECISION_SOURCES = (("fp32", "optimize"), ("fp16", "fp16"), ("int8", "int8"), ("fp8", "fp8"), ("int4", "int4"), ("bf16", "bf16"))


def _fp8_unbuildable() -> str | None:
    """Why this machine's GPU cannot build the FP8 engine (TensorRT needs compute capability 8.9+), or None."""
    from quant.fp8 import FP8_MIN_COMPUTE_CAPABILITY
    from trt.capability import below_compute_capability, compute_capability

    return below_compute_capability("FP8", FP8_MIN_COMPUTE_CAPABILITY, compute_capability())


def _engine_sources(settings: Settings) -> dict[str, str]:
    """The stage whose ONNX file each precision's engine is built from (FP32 always; the others when requested)."""
    return {prec: stage for prec, stage in PRECISION_SOURCES if prec in settings.precisions}


def _shapes(settings: Settings) -> dict:
    profile = settings.profile
    if not profile.dynamic:
        return {}
    return {spec.name: tuple(profile.shape(spec, which) for which in ("min", "opt", "max")) for spec in profile.inputs}


def _skip_without_tensorrt(what: str, job: Job) -> StageResult | None:
    from trt.capability import tensorrt_missing

    missing = tensorrt_missing()
    if missing is None:
        return None
    reason = f"{what} needs TensorRT and a GPU: {missing}; run it in our image on a machine with an NVIDIA GPU, from this folder: {job.rerun_hint()}"
    requirements = {}
    if "precisions" in job.settings.names and "fp8" in job.settings.precisions:  # the build stage (bench reads no precisions)
        from quant.fp8 import FP8_MIN_COMPUTE_CAPABILITY

        requirements = {"fp8": {"requires_compute_capability": ".".join(map(str, FP8_MIN_COMPUTE_CAPABILITY))}}
        reason += f" (the FP8 engine also needs compute capability {requirements['fp8']['requires_compute_capability']}+)"
    return StageResult({}, requirements, skipped=True, reason=reason, capability_missing=True)


def run_build(job: Job) -> StageResult:
    skipped = _skip_without_tensorrt("building engines", job)
    if skipped:
        return skipped
    from pipeline.core.samples import make_inputs
    from trt.build import BuildPaths, BuildSettings
    from trt.builders import build_and_profile

    s = job.settings
    b, out = s.profile.build, job.out
    settings = BuildSettings(b.verbosity, b.workspace_mib, b.optimization_level, b.log_severity, s.weak_fp16)
    batches = held_out(s.profile)
    outputs, metrics = {}, {}
    for prec, source in _engine_sources(s).items():
        if prec == "fp8" and (why := _fp8_unbuildable()):
            from quant.fp8 import FP8_MIN_COMPUTE_CAPABILITY

            metrics[prec] = {"skipped": why, "requires_compute_capability": ".".join(map(str, FP8_MIN_COMPUTE_CAPABILITY))}
            job.status(f"not building the fp8 engine: {why}")
            continue
        onnx_path = job.input(source, "onnx")
        paths = BuildPaths(out / f"{prec}.engine", out / f"{prec}.layers.json", out / f"{prec}.build.log", out / "timing.cache",
                           out / f"{prec}.profile.json")
        job.status(f"building the {prec} engine ({b.builder})")
        metrics[prec] = build_and_profile(b.builder, onnx_path, paths, _shapes(s), settings, make_inputs(s.profile, seed=seeds.ENGINE_PROFILE),
                                          b.profile_iterations, b.profile_warmup, job.status)
        job.status(f"running the {prec} engine and onnxruntime FP32 on {s.profile.quant.accuracy_samples} held-out samples (Polygraphy)")
        metrics[prec]["accuracy"] = _engine_accuracy(paths.engine, job.input("optimize", "onnx"), batches, s.profile.quant.accuracy_samples)
        outputs |= {f"{prec}_engine": paths.engine, f"{prec}_layers": paths.layers_json, f"{prec}_profile": paths.profile_json,
                    f"{prec}_log": paths.build_log}
    return StageResult(outputs, metrics)


def _engine_accuracy(engine: Path, reference: Path, batches: list[dict], samples: int) -> dict[str, Any]:
    """The engine against onnxruntime running the FP32 model on the held-out batches, figures as the
    fp16/int8 stages compute them."""
    from quant.accuracy import agreement
    from trt.engine_accuracy import run_engine_and_onnx

    run = run_engine_and_onnx(engine, reference, batches)
    if run.not_compared:
        return {"not_compared": run.not_compared}
    return {"reference": "onnxruntime CPU, FP32 model"} | agreement(run.onnx, run.engine) | {"samples": samples}


def _engines_built(job: Job) -> list[str]:
    labels = job.outputs_of("build")
    return [prec for prec, _ in PRECISION_SOURCES if f"{prec}_layers" in labels]


def _no_engine(what: str, job: Job) -> StageResult:
    status = job.status_of("build")
    why = f"the build stage was {status}" if status else "no build stage ran"
    return StageResult({}, skipped=True, reason=f"{what}: no engine layer information ({why})", capability_missing=False)


def run_report(job: Job) -> StageResult:
    if not _engines_built(job):
        return _no_engine("report", job)
    from pipeline.core.fileio import write_text
    from trt.render import render
    from trt.report import report_from_files

    outputs, metrics = {}, {}
    sources = dict(PRECISION_SOURCES)
    for prec in _engines_built(job):
        job.status(f"reporting the {prec} engine")
        data = report_from_files(job.input("build", f"{prec}_layers"), job.input(sources[prec], "onnx"), job.input("build", f"{prec}_profile"))
        for fmt in ("json", "html"):
            write_text(job.out / f"{prec}.report.{fmt}", render(data, fmt, "report"))
            outputs[f"{prec}_{fmt}"] = job.out / f"{prec}.report.{fmt}"
        metrics[prec] = data["summary"] | {"verdict": data["verdict"], "findings": data["findings"]}
    return StageResult(outputs, metrics)


def run_diff(job: Job) -> StageResult:
    built = _engines_built(job)
    if not {"fp16", "int8"} <= set(built):
        return _no_engine("diff (FP16 vs INT8)", job) if not built else StageResult({}, skipped=True, reason="diff needs both the FP16 and the INT8 engine (--fp16 --int8)")
    from pipeline.core.fileio import write_text
    from trt.diff import diff_from_files
    from trt.render import render

    job.status("diffing the FP16 and INT8 engines")
    data = diff_from_files(job.input("build", "fp16_layers"), job.input("build", "int8_layers"), job.input("fp16", "onnx"), job.input("int8", "onnx"),
                           job.input("build", "fp16_profile"), job.input("build", "int8_profile"))
    for fmt in ("json", "html"):
        write_text(job.out / f"diff.{fmt}", render(data, fmt, "diff"))
    return StageResult({"json": job.out / "diff.json", "html": job.out / "diff.html"},
                       {"join": data["join"], "verdict": data["verdict"], "totals": data["totals"], "splits": len(data["splits"]),
                        "merges": len(data["merges"]), "findings": data["findings"]})


def run_bench(job: Job) -> StageResult:
    skipped = _skip_without_tensorrt("benchmarking engines", job)
    if skipped:
        return skipped
    built = _engines_built(job)
    if not built:
        return _no_engine("bench", job)
    from pipeline.core.fileio import write_json
    from pipeline.core.samples import make_inputs
    from trt.bench import bench, plot

    profile = job.settings.profile
    engines = {prec: job.input("build", f"{prec}_engine") for prec in built}
    result = bench(engines, "trt", make_inputs(profile, seed=seeds.BENCH), profile.build.bench_warmup, profile.build.bench_iterations,
                   on_step=lambda label, done, total: job.status(f"timing {label} {done}/{total}"))
    write_json(job.out / "bench.trt.json", result)
    plot(result, job.out / "bench.trt.png")
    return StageResult({"json": job.out / "bench.trt.json", "png": job.out / "bench.trt.png"}, {k: v["p50_ms"] for k, v in result["models"].items()})


def _build_summary(metrics: dict[str, Any]) -> str:
    parts = []
    for prec, built in metrics.items():
        if "skipped" in built:
            parts.append(f"{prec}: not built ({built['skipped']})")
            continue
        accuracy = built.get("accuracy", {})
        figure = f"cosine_centered={accuracy['cosine_centered']:.5f} vs onnxruntime FP32" if "cosine_centered" in accuracy else "accuracy not compared"
        parts.append(f"{prec}: {built.get('layers', '?')} layers, {figure}")
    return ", ".join(parts)


def _onnx_of_engines(settings: Settings) -> tuple[str, ...]:
    return tuple(dict.fromkeys(("optimize.onnx", *(f"{stage}.onnx" for stage in _engine_sources(settings).values()))))


BUILD = Stage(
    "build", run_build,
    reads=("precisions", "weak_fp16", *HELD_OUT_READS, "build.builder", "build.verbosity", "build.workspace_mib", "build.optimization_level",
           "build.log_severity", "build.profile_warmup", "build.profile_iterations"),
    inputs=_onnx_of_engines,
    code=("trt.build", "trt.builders", "trt.build_polygraphy", "trt.build_trtexec", "trt.run", "trt.engine_accuracy", "trt.versions"),
    packages=("tensorrt", "polygraphy"),
    key_metric=_build_summary,
)
REPORT = Stage(
    "report", run_report,
    reads=("precisions",),
    inputs=lambda s: ("build.*", *_onnx_of_engines(s)),
    code=("trt.report", "trt.parsers", "trt.render"),
    key_metric=lambda m: ", ".join(f"{p}: {v['myelin_graphs']} Myelin graphs / {v['layers']} layers" for p, v in m.items()),
)
# cheap, or measuring this machine: never cached
DIFF = Stage(
    "diff", run_diff, inputs=("build.*", "fp16.onnx", "int8.onnx"), cached=False,
    key_metric=lambda m: f"{m['splits']} fused groups split; layers {m['totals']['layers']['a']} -> {m['totals']['layers']['b']}",
)
BENCH = Stage(
    "bench", run_bench, reads=("inputs", "dims", "build.bench_warmup", "build.bench_iterations"), inputs=("build.*",), cached=False,
    key_metric=lambda m: ", ".join(f"{p} p50 {v:.3f} ms" for p, v in m.items()),
)
