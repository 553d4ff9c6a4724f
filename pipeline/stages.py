"""The stages `build` runs, in order, each wired to its stage module's one public entry."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import InputError
from pipeline.core.fileio import sha256_file
from pipeline.generation_stage import generation_figures
from pipeline.models.decoder import autocast_feeds, derived_note
from pipeline.runner import Context, Stage, StageResult, Status

if TYPE_CHECKING:
    from pipeline.core.verify import OnnxSession
    from quant.accuracy import BackgroundOutputs


def _onnx_source(ctx: Context) -> Path | None:
    """An ONNX file to start from: --onnx, else the profile's `model.onnx`."""
    given = ctx.options.get("onnx")
    return Path(given).resolve() if given else ctx.profile.onnx_path()


def _export_fingerprint(ctx: Context) -> dict[str, Any]:
    source = _onnx_source(ctx)
    if source is not None:
        from pipeline.core.fileio import require_file

        return {"onnx": str(source), "sha256": sha256_file(require_file(source, "ONNX file", "pass an existing .onnx path"))}
    from pipeline.export import factory_fingerprint

    return factory_fingerprint(ctx.profile)


def _run_export(ctx: Context, status: Status) -> StageResult:
    source = _onnx_source(ctx)
    if source is not None:
        from pipeline.export import check_onnx_file

        nodes = check_onnx_file(source, ctx.profile)
        return StageResult({"onnx": source}, {"nodes": nodes}, skipped=True, reason=f"starting from {source}")
    from pipeline.export import export_model

    output, reference = ctx.out / "model.onnx", ctx.out / "model.generation.npz"
    result = export_model(ctx.profile, output, status=status, generation_reference=reference)
    metrics = {
        "exporter": result.exporter,
        "opset": result.opset,
        "nodes": result.nodes,
        "max_abs_diff": result.max_abs_diff,
        "tolerance": ctx.profile.export.tolerance,
        "checked_shapes": result.checked_shapes,
        "outputs": result.outputs,
    }
    if result.derived:  # a decoder's cache inputs: later stages use them (Runner applies them to ctx.profile)
        metrics["derived_inputs"] = result.derived
    outputs = {"onnx": output}
    if result.generation:  # a decoder: torch's greedy generation, the reference of later stages
        metrics["generation"] = result.generation
        outputs["generation"] = reference
    return StageResult(outputs, metrics)


EXPORT = Stage(
    "export",
    _export_fingerprint,
    _run_export,
    key_metric=lambda m: (f"max_abs_diff={m['max_abs_diff']:.2e}, {m['nodes']} nodes{derived_note(m)}" if "max_abs_diff" in m
                          else f"{m.get('nodes', '?')} nodes"),
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
    from pipeline.core.errors import StageFailed
    from pipeline.core.fileio import atomic_path
    from pipeline.core.samples import check_sizes, make_inputs
    from pipeline.core.verify import compare_models
    from pipeline.optimize import optimize_file

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
        generation = generation_figures(ctx, tmp, "optimize")
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


OPTIMIZE = Stage(
    "optimize",
    _optimize_fingerprint,
    _run_optimize,
    key_metric=lambda m: f"{m['nodes_before']} -> {m['nodes_after']} nodes, max_abs_diff={m['max_abs_diff']:.2e}",
)


def _code_hashes(*modules: str) -> list[str]:
    import importlib.util

    return [sha256_file(Path(importlib.util.find_spec(m).origin)) for m in modules]


def _modelopt_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-modelopt")
    except PackageNotFoundError:
        return None


def _held_out(ctx: Context) -> list[dict]:
    """The held-out accuracy samples (seeds apart from calibration's), stacked into as few runs as the batch dim allows."""
    from pipeline.core.samples import make_inputs, stack_batches
    from quant.calibration import HELD_OUT_SEED

    return stack_batches(ctx.profile, [make_inputs(ctx.profile, seed=HELD_OUT_SEED + i) for i in range(ctx.profile.quant.accuracy_samples)])


@contextmanager
def _fp32_reference(ctx: Context, batches: list[dict]) -> Iterator[BackgroundOutputs]:
    """The optimized FP32 model's outputs on the held-out samples, started on a worker thread so
    they are computed while the stage converts (AutoCast, ModelOpt's calibration). Computed once per
    build: the fp16 and int8 stages share them, keyed by the FP32 model's sha256. A stage that
    fails or is interrupted stops the run."""
    from quant.accuracy import BackgroundOutputs

    source = ctx.input("optimize", "onnx")
    key = ("fp32 outputs", ctx.manifest.get("optimize").output_sha256.get("onnx") or sha256_file(source))
    if key not in ctx.cache:
        ctx.cache[key] = BackgroundOutputs(source, batches)
    reference = ctx.cache[key]
    try:
        yield reference
    except BaseException:
        reference.cancel()
        ctx.cache.pop(key, None)
        raise


def _accuracy(candidate: Path | OnnxSession, reference: BackgroundOutputs, batches: list[dict], samples: int, label: str,
              status: Status) -> dict[str, Any]:
    """Accuracy of `candidate` against the FP32 reference. The figures record the check's wall time in the
    stage (`check_seconds`: the candidate's run, then any wait for the reference), within it the wait
    (`reference_wait_seconds`), and the reference run's own time beside the conversion (`reference_seconds`,
    0 in a stage that reused it), so the check's share of the stage is on record."""
    from quant.accuracy import accuracy, model_outputs

    started = time.perf_counter()
    status(f"running the {label} model on {samples} held-out samples")
    outputs = model_outputs(candidate, batches)
    status("waiting for the FP32 model's run on the held-out samples")
    waiting = time.perf_counter()
    expected = reference.result()
    waited = time.perf_counter() - waiting
    figures = accuracy(expected, outputs, samples)
    return {**figures, "check_seconds": round(time.perf_counter() - started, 3), "reference_wait_seconds": round(waited, 3),
            "reference_seconds": round(reference.seconds, 3) if reference.served == 1 else 0.0}


def _gate(stage: str, metrics: dict[str, Any], minimum: float) -> None:
    from pipeline.core.errors import StageFailed

    if not metrics["cosine_centered"] >= minimum:
        raise StageFailed(
            f"{stage}: accuracy below the gate: cosine_centered={metrics['cosine_centered']:.5f} < {minimum} "
            f"(cosine={metrics['cosine']:.6f}, max_abs_diff={metrics['max_abs_diff']:.3g} vs FP32 on {metrics['samples']} held-out samples); "
            "exclude sensitive nodes, try another preset or more calibration data, or lower --min-cosine"
        )


def _fp16_fingerprint(ctx: Context) -> dict[str, Any]:
    q = ctx.profile.quant
    return {
        "onnx_sha256": sha256_file(ctx.input("optimize", "onnx")),
        "exclude": [q.fp16_exclude_op_types, q.fp16_exclude_nodes],
        "run_check": [{k: v.model_dump() for k, v in ctx.profile.dims.items()}, [s.model_dump() for s in ctx.profile.inputs]],
        "gate": [ctx.options.get("min_cosine") or q.min_cosine_fp16, q.accuracy_samples, ctx.options.get("min_token_agreement"), q.min_token_agreement_fp16],
        "code": _code_hashes("quant.fp16", "quant.accuracy"),
        "modelopt": _modelopt_version(),
    }


def _run_fp16(ctx: Context, status: Status) -> StageResult:
    from pipeline.core.fileio import atomic_path
    from pipeline.core.quiet import captured
    from pipeline.core.samples import make_inputs, range_sizes
    from quant.fp16 import convert_fp16

    q, source, target = ctx.profile.quant, ctx.input("optimize", "onnx"), ctx.out / "model.fp16.onnx"
    shape_checks = [make_inputs(ctx.profile, seed=5000 + i, dims=sizes) for i, sizes in enumerate(range_sizes(ctx.profile))]
    held_out = _held_out(ctx)
    with _fp32_reference(ctx, held_out) as reference, atomic_path(target) as tmp:
        status("converting to FP16 with ModelOpt AutoCast, checking it runs at the profile's min/opt/max shapes")
        with captured(ctx.out / "fp16.log"):
            result = convert_fp16(source, tmp, q.fp16_exclude_op_types, q.fp16_exclude_nodes, shape_checks, autocast_feeds(ctx.profile))
        # the session that ran the shape checks
        figures = _accuracy(result.session, reference, held_out, q.accuracy_samples, "FP16", status)
        minimum = ctx.options.get("min_cosine") or q.min_cosine_fp16
        _gate("fp16", figures, minimum)
        generation = generation_figures(ctx, result.session, "fp16")
    metrics = {"providers": result.providers, "nodes": result.nodes, "fp32_compute_nodes": result.fp32_nodes_kept,
               "placeholder_dims_repaired": result.dims_repaired, "runs_at_shapes": result.checked_shapes,
               "accuracy": figures, "min_cosine": minimum, **({"generation": generation} if generation else {})}
    return StageResult({"onnx": target, "log": ctx.out / "fp16.log"}, metrics)


def _int8_fingerprint(ctx: Context) -> dict[str, Any]:
    q, calib = ctx.profile.quant, ctx.options.get("calib")
    return {
        "onnx_sha256": sha256_file(ctx.input("optimize", "onnx")),
        "calibration": sha256_file(Path(calib)) if calib and Path(calib).is_file() else [str(calib), q.samples],
        "settings": [ctx.options.get("preset") or q.preset, q.calibration_method, q.int8_float_dtype,
                     ctx.options.get("min_cosine") or q.min_cosine_int8, q.accuracy_samples, ctx.options.get("min_token_agreement"), q.min_token_agreement_int8],
        "code": _code_hashes("quant.int8", "quant.presets", "quant.lint", "quant.calibration", "quant.accuracy"),
        "modelopt": _modelopt_version(),
    }


def _run_int8(ctx: Context, status: Status) -> StageResult:
    from pipeline.core.fileio import atomic_path, write_json
    from pipeline.core.quiet import captured
    from quant.calibration import calibration_data
    from quant.int8 import quantize_int8
    from quant.lint import findings_json

    q, source, target = ctx.profile.quant, ctx.input("optimize", "onnx"), ctx.out / "model.int8.onnx"
    preset = ctx.options.get("preset") or q.preset
    status("preparing calibration data")
    calibration, origin = calibration_data(ctx.profile, ctx.options.get("calib"), source)
    batch = ctx.profile.shape(ctx.profile.inputs[0])[0]
    max_sequence = max((d.max for name, d in ctx.profile.dims.items() if name in ("seq", "sequence", "seq_len")), default=None)

    def step(done: int, total: int) -> None:
        filled = round(24 * done / total)
        status(f"calibrating ({preset}) [{'#' * filled}{'.' * (24 - filled)}] {done}/{total}")

    held_out = _held_out(ctx)
    with _fp32_reference(ctx, held_out) as reference, atomic_path(target) as tmp:
        with captured(ctx.out / "int8.log"):
            result = quantize_int8(source, tmp, calibration, batch, preset, q.int8_float_dtype, q.calibration_method, max_sequence, on_step=step)
        lint = findings_json(result.findings)
        figures = _accuracy(tmp, reference, held_out, q.accuracy_samples, "INT8", status)
        minimum = ctx.options.get("min_cosine") or q.min_cosine_int8
        _gate("int8", figures, minimum)
        generation = generation_figures(ctx, tmp, "int8")
    write_json(ctx.out / "int8.lint.json", lint)
    metrics = {
        "preset": result.preset, "high_precision_dtype": result.high_precision_dtype, "calibration": origin,
        "calibration_samples": result.calibration_samples, "calibration_method": result.calibration_method,
        "disable_mha_qdq": result.disable_mha_qdq, "qdq_pairs": result.qdq_pairs,
        "qdq_removed_by_preset": len(result.qdq_removed_by_preset) // 2, "notes": result.notes,
        "lint": {"count": lint["count"], "by_rule": lint["by_rule"]}, "accuracy": figures, "min_cosine": minimum,
        **({"generation": generation} if generation else {}),
    }
    return StageResult({"onnx": target, "lint": ctx.out / "int8.lint.json", "log": ctx.out / "int8.log"}, metrics)


FP16 = Stage(
    "fp16", _fp16_fingerprint, _run_fp16,
    key_metric=lambda m: f"cosine_centered={m['accuracy']['cosine_centered']:.5f}, max_abs_diff={m['accuracy']['max_abs_diff']:.2e}",
)
INT8 = Stage(
    "int8", _int8_fingerprint, _run_int8,
    key_metric=lambda m: f"{m['preset']}: cosine_centered={m['accuracy']['cosine_centered']:.4f}, {m['qdq_pairs']} Q/DQ, {m['lint']['count']} lint findings",
)


PRECISION_SOURCES = (("fp32", "optimize"), ("fp16", "fp16"), ("int8", "int8"))


def _engine_inputs(ctx: Context) -> dict[str, Path]:
    """The ONNX file each precision's engine is built from (FP32 always; FP16 / INT8 when requested)."""
    wanted = {"fp32": True, "fp16": ctx.options.get("fp16"), "int8": ctx.options.get("int8")}
    return {prec: ctx.input(stage, "onnx") for prec, stage in PRECISION_SOURCES if wanted[prec]}


def _shapes(ctx: Context) -> dict:
    if not ctx.profile.dynamic:
        return {}
    return {spec.name: tuple(ctx.profile.shape(spec, which) for which in ("min", "opt", "max")) for spec in ctx.profile.inputs}


def _docker_hint(ctx: Context) -> str:
    """The command that runs this build, with the user's profile, options and output folder, in our image."""
    from trt.capability import docker_command, profile_argument

    options = ctx.options
    arguments: list[str | Path] = ["build", "--profile", profile_argument(ctx.profile)]
    if options.get("onnx"):
        arguments += ["--onnx", Path(options["onnx"])]
    arguments += [flag for key, flag in (("fp16", "--fp16"), ("int8", "--int8"), ("weak_fp16", "--weak-fp16")) if options.get(key)]
    if options.get("calib"):
        arguments += ["--calib", Path(options["calib"])]
    for key, flag in (("preset", "--preset"), ("min_cosine", "--min-cosine"), ("verbosity", "--verbosity")):
        if options.get(key) is not None:
            arguments += [flag, str(options[key])]
    model = ctx.profile.onnx_path()
    return docker_command([*arguments, "--out", ctx.out, "--strict"], also_mount=[model] if model else [])


def _skip_without_tensorrt(what: str, ctx: Context) -> StageResult | None:
    from trt.capability import tensorrt_missing

    missing = tensorrt_missing()
    if missing is None:
        return None
    reason = f"{what} needs TensorRT and a GPU: {missing}; run it in our image on a machine with an NVIDIA GPU, from this folder: {_docker_hint(ctx)}"
    return StageResult({}, skipped=True, reason=reason, capability_missing=True)


def _build_fingerprint(ctx: Context) -> dict[str, Any]:
    return {
        "onnx": {prec: sha256_file(path) for prec, path in _engine_inputs(ctx).items()},
        "reference": sha256_file(ctx.input("optimize", "onnx")),
        "settings": ctx.profile.build.model_dump(), "options": [ctx.options.get("verbosity"), ctx.options.get("weak_fp16")],
        "accuracy_samples": ctx.profile.quant.accuracy_samples,
        "code": _code_hashes("trt.build", "trt.build_polygraphy", "trt.run", "trt.engine_accuracy", "trt.versions"),
    }


def _run_build(ctx: Context, status: Status) -> StageResult:
    skipped = _skip_without_tensorrt("building engines", ctx)
    if skipped:
        return skipped
    from pipeline.core.samples import make_inputs
    from trt.build import BuildPaths, BuildSettings, build_engine
    from trt.build_polygraphy import build_engine_polygraphy
    from trt.run import profile_engine

    b = ctx.profile.build
    settings = BuildSettings(ctx.options.get("verbosity") or b.verbosity, b.workspace_mib, b.optimization_level, b.log_severity, bool(ctx.options.get("weak_fp16")))
    held_out = _held_out(ctx)
    outputs, metrics = {}, {}
    for prec, onnx_path in _engine_inputs(ctx).items():
        paths = BuildPaths(ctx.out / f"{prec}.engine", ctx.out / f"{prec}.layers.json", ctx.out / f"{prec}.build.log", ctx.out / "timing.cache")
        profile = ctx.out / f"{prec}.profile.json"
        status(f"building the {prec} engine ({b.builder})")
        if b.builder == "trtexec":
            metrics[prec] = _build_with_trtexec(ctx, onnx_path, paths, profile, settings)
        else:
            build = build_engine_polygraphy if b.builder == "polygraphy" else build_engine
            metrics[prec] = build(onnx_path, paths, _shapes(ctx), settings)
            status(f"profiling the {prec} engine per layer")
            metrics[prec]["profiled_layers"] = profile_engine(paths.engine, profile, make_inputs(ctx.profile, seed=3), b.profile_iterations, b.profile_warmup)
        status(f"running the {prec} engine and onnxruntime FP32 on {ctx.profile.quant.accuracy_samples} held-out samples (Polygraphy)")
        metrics[prec]["accuracy"] = _engine_accuracy(paths.engine, ctx.input("optimize", "onnx"), held_out, ctx.profile.quant.accuracy_samples)
        outputs |= {f"{prec}_engine": paths.engine, f"{prec}_layers": paths.layers_json, f"{prec}_profile": profile, f"{prec}_log": paths.build_log}
    return StageResult(outputs, metrics)


def _build_with_trtexec(ctx: Context, onnx_path: Path, paths, profile: Path, settings) -> dict[str, Any]:
    import subprocess

    import tensorrt as trt

    from pipeline.core.fileio import write_text
    from trt.versions import for_version, trtexec_command

    b = ctx.profile.build
    command = trtexec_command(for_version(trt.__version__), onnx_path, paths.engine, paths.layers_json, profile, settings.verbosity, _shapes(ctx),
                              b.workspace_mib, b.optimization_level, paths.timing_cache, settings.weak_fp16)
    run = subprocess.run(command, capture_output=True, text=True)
    write_text(paths.build_log, run.stdout + run.stderr)
    if run.returncode != 0:
        raise InputError(f"build: trtexec failed (exit {run.returncode}); see {paths.build_log}")
    return {"builder": "trtexec", "command": command}


def _engine_accuracy(engine: Path, reference: Path, held_out: list[dict], samples: int) -> dict[str, Any]:
    """The engine against onnxruntime running the FP32 model on the held-out batches, figures as the
    fp16/int8 stages compute them."""
    from quant.accuracy import agreement
    from trt.engine_accuracy import run_engine_and_onnx

    run = run_engine_and_onnx(engine, reference, held_out)
    if run.not_compared:
        return {"not_compared": run.not_compared}
    return {"reference": "onnxruntime CPU, FP32 model"} | agreement(run.onnx, run.engine) | {"samples": samples}


def _engines_built(ctx: Context) -> list[str]:
    record = ctx.manifest.get("build")
    if record is None or record.status not in ("done", "cached"):
        return []
    return [prec for prec, _ in PRECISION_SOURCES if f"{prec}_layers" in record.outputs]


def _no_engine(what: str, ctx: Context) -> StageResult:
    record = ctx.manifest.get("build")
    why = f"the build stage was {record.status}" if record else "no build stage ran"
    return StageResult({}, skipped=True, reason=f"{what}: no engine layer information ({why})", capability_missing=False)


def _report_fingerprint(ctx: Context) -> dict[str, Any]:
    return {"layers": {p: sha256_file(ctx.input("build", f"{p}_layers")) for p in _engines_built(ctx)}, "code": _code_hashes("trt.report", "trt.parsers", "trt.render")}


def _run_report(ctx: Context, status: Status) -> StageResult:
    if not _engines_built(ctx):
        return _no_engine("report", ctx)
    from pipeline.core.fileio import write_text
    from trt.render import render
    from trt.report import report_from_files

    outputs, metrics = {}, {}
    sources = dict(PRECISION_SOURCES)
    for prec in _engines_built(ctx):
        status(f"reporting the {prec} engine")
        data = report_from_files(ctx.input("build", f"{prec}_layers"), ctx.input(sources[prec], "onnx"), ctx.input("build", f"{prec}_profile"))
        for fmt in ("json", "html"):
            write_text(ctx.out / f"{prec}.report.{fmt}", render(data, fmt, "report"))
            outputs[f"{prec}_{fmt}"] = ctx.out / f"{prec}.report.{fmt}"
        metrics[prec] = data["summary"] | {"verdict": data["verdict"], "findings": data["findings"]}
    return StageResult(outputs, metrics)


def _run_diff(ctx: Context, status: Status) -> StageResult:
    built = _engines_built(ctx)
    if not {"fp16", "int8"} <= set(built):
        return _no_engine("diff (FP16 vs INT8)", ctx) if not built else StageResult({}, skipped=True, reason="diff needs both the FP16 and the INT8 engine (--fp16 --int8)")
    from pipeline.core.fileio import write_text
    from trt.diff import diff_from_files
    from trt.render import render

    status("diffing the FP16 and INT8 engines")
    data = diff_from_files(ctx.input("build", "fp16_layers"), ctx.input("build", "int8_layers"), ctx.input("fp16", "onnx"), ctx.input("int8", "onnx"),
                           ctx.input("build", "fp16_profile"), ctx.input("build", "int8_profile"))
    for fmt in ("json", "html"):
        write_text(ctx.out / f"diff.{fmt}", render(data, fmt, "diff"))
    return StageResult({"json": ctx.out / "diff.json", "html": ctx.out / "diff.html"}, {"join": data["join"], "verdict": data["verdict"], "totals": data["totals"], "splits": len(data["splits"]), "merges": len(data["merges"]), "findings": data["findings"]})


def _run_bench(ctx: Context, status: Status) -> StageResult:
    skipped = _skip_without_tensorrt("benchmarking engines", ctx)
    if skipped:
        return skipped
    built = _engines_built(ctx)
    if not built:
        return _no_engine("bench", ctx)
    from pipeline.core.fileio import write_json
    from pipeline.core.samples import make_inputs
    from trt.bench import bench, plot

    b = ctx.profile.build
    engines = {prec: ctx.input("build", f"{prec}_engine") for prec in built}
    result = bench(engines, "trt", make_inputs(ctx.profile, seed=4), b.bench_warmup, b.bench_iterations,
                   on_step=lambda label, done, total: status(f"timing {label} {done}/{total}"))
    write_json(ctx.out / "bench.trt.json", result)
    plot(result, ctx.out / "bench.trt.png")
    return StageResult({"json": ctx.out / "bench.trt.json", "png": ctx.out / "bench.trt.png"}, {k: v["p50_ms"] for k, v in result["models"].items()})


def _always(ctx: Context) -> dict[str, Any]:
    """Fingerprint of stages that are cheap or depend on this machine: never cached."""
    import time

    return {"run": time.time_ns()}


def _build_summary(metrics: dict[str, Any]) -> str:
    parts = []
    for prec, built in metrics.items():
        accuracy = built.get("accuracy", {})
        figure = f"cosine_centered={accuracy['cosine_centered']:.5f} vs onnxruntime FP32" if "cosine_centered" in accuracy else "accuracy not compared"
        parts.append(f"{prec}: {built.get('layers', '?')} layers, {figure}")
    return ", ".join(parts)


BUILD = Stage("build", _build_fingerprint, _run_build, key_metric=_build_summary)
REPORT = Stage("report", _report_fingerprint, _run_report, key_metric=lambda m: ", ".join(f"{p}: {v['myelin_graphs']} Myelin graphs / {v['layers']} layers" for p, v in m.items()))
DIFF = Stage("diff", _always, _run_diff, key_metric=lambda m: f"{m['splits']} fused groups split; layers {m['totals']['layers']['a']} -> {m['totals']['layers']['b']}")
BENCH = Stage("bench", _always, _run_bench, key_metric=lambda m: ", ".join(f"{p} p50 {v:.3f} ms" for p, v in m.items()))


def build_plan(ctx: Context) -> list[Stage]:
    plan = [EXPORT, OPTIMIZE]
    if ctx.options.get("fp16"):
        plan.append(FP16)
    if ctx.options.get("int8"):
        plan.append(INT8)
    return [*plan, BUILD, REPORT, DIFF, BENCH]
