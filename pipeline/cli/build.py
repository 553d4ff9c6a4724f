"""Commands that make models: build (every stage), export, optimize, quantize."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.cli.app import ProfileOption, app, console, stdout_console
from pipeline.core import DEFAULT_PROFILE
from pipeline.core.errors import PipelineError
from pipeline.core.text import printable


class Exporter(str, Enum):
    dynamo = "dynamo"
    torchscript = "torchscript"


class StageName(str, Enum):
    export = "export"
    optimize = "optimize"
    fp16 = "fp16"
    int8 = "int8"
    fp8 = "fp8"
    int4 = "int4"
    bf16 = "bf16"
    build = "build"
    report = "report"
    diff = "diff"
    bench = "bench"


class Verbosity(str, Enum):
    none = "none"
    layer_names_only = "layer_names_only"
    detailed = "detailed"


class PresetName(str, Enum):
    auto = "auto"
    trt_fusion = "trt-fusion"
    modelopt = "modelopt"
    gemm_only = "gemm-only"
    cnn = "cnn"
    decoder = "decoder"


@app.command(
    help=(
        "Run the pipeline stages for a profile into OUT (default artifacts/<profile>), "
        "recording each in OUT/manifest.json. Unchanged stages are reported `cached`.\n\n"
        "Examples:\n\n"
        "  python -m pipeline build\n\n"
        "  python -m pipeline build --profile my_model.toml --out runs/a --force\n\n"
        "  python -m pipeline build --onnx model.onnx --profile bert-tiny\n\n"
        "  python -m pipeline build --fp16 --int8 --preset trt-fusion\n\n"
        "  python -m pipeline build --profile hf-resnet-tiny --fp8 --int4 --preset cnn"
    )
)
def build(
    profile: ProfileOption = DEFAULT_PROFILE,
    onnx: Annotated[Optional[Path], typer.Option(help="Start from this ONNX file instead of exporting.")] = None,
    fp16: Annotated[bool, typer.Option("--fp16", help="Produce model.fp16.onnx (ModelOpt AutoCast).")] = False,
    int8: Annotated[bool, typer.Option("--int8", help="Produce model.int8.onnx (ModelOpt Q/DQ) and lint its placement.")] = False,
    fp8: Annotated[bool, typer.Option("--fp8", help="Produce model.fp8.onnx (ModelOpt FP8 Q/DQ, opset >= 21); its engine needs a GPU of compute capability 8.9+.")] = False,
    int4: Annotated[bool, typer.Option("--int4", help="Produce model.int4.onnx (ModelOpt weight-only INT4 for MatMul/Gemm weights).")] = False,
    bf16: Annotated[bool, typer.Option("--bf16", help="Produce model.bf16.onnx (ModelOpt AutoCast to BF16).")] = False,
    calib: Annotated[Optional[Path], typer.Option(help="Calibration data .npz (one array per input, samples on axis 0) [default: synthetic from the profile].")] = None,
    preset: Annotated[Optional[PresetName], typer.Option(help="INT8/FP8 Q/DQ placement [default: from the profile; auto: the preset of the model's family, trt-fusion, decoder or cnn].")] = None,
    min_cosine: Annotated[Optional[float], typer.Option(min=0, max=1, help="Accuracy gate vs FP32 (cosine_centered) [default: 0.999 FP16, 0.99 INT8/FP8/BF16, 0.98 INT4].")] = None,
    min_token_agreement: Annotated[Optional[float], typer.Option(min=0, max=1, help="A decoder's gate: share of greedy tokens equal to torch's [default: 0.5 FP16, 0 INT8 (recorded only); docs/decoders.md].")] = None,
    verbosity: Annotated[Optional[Verbosity], typer.Option(help="Engine profiling verbosity [default: detailed, which the report needs].")] = None,
    weak_fp16: Annotated[bool, typer.Option("--weak-fp16", help="TensorRT 10.x only: also let the builder pick FP16 kernels (legacy weak typing).")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder [default: artifacts/<profile>].")] = None,
    until: Annotated[Optional[StageName], typer.Option(help="Stop after this stage.")] = None,
    strict: Annotated[bool, typer.Option(help="Fail (exit 3) instead of skipping a stage this machine cannot run.")] = False,
    force: Annotated[bool, typer.Option(help="Rerun stages even when cached.")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="If another build is writing to OUT, wait for it instead of exiting.")] = False,
) -> None:
    from pipeline.core.fileio import remove_stale_temp_files
    from pipeline.core.manifest import Manifest
    from pipeline.core.profiles import load_profile, shadowed_profile
    from pipeline.lock import folder_lock
    from pipeline.runner import Context, Runner
    from pipeline.stages import build_plan
    from pipeline.summary import print_next_steps, shown_path

    _check_build_flags({"fp16": fp16, "int8": int8, "fp8": fp8, "int4": int4, "bf16": bf16}, calib, preset, min_cosine)
    if min_token_agreement is not None and not (fp16 or int8):
        raise PipelineError("--min-token-agreement is the generation gate of the FP16/INT8 stages, which this build does not run; add --fp16/--int8 or drop it")
    loaded = load_profile(profile)
    out_dir = out or Path("artifacts") / loaded.name
    out_console = stdout_console()
    out_console.print(f"profile {loaded.name} from {shown_path(loaded.source) if loaded.source else 'the built-in defaults'}", highlight=False, markup=False)
    if (outside := _factory_outside(loaded)) is not None:
        out_console.print(f"note: model.factory {loaded.model.factory} runs code from {outside} (outside the profile's folder and the installed packages)",
                          highlight=False, markup=False)
    if (ignored := shadowed_profile(profile)) is not None:
        out_console.print(f"note: {ignored} is not used: the packaged profile {profile!r} is; pass --profile {ignored} to use yours", highlight=False, markup=False)
    created = _missing_folders(out_dir) + ([] if (out_dir / "manifest.json").exists() else [out_dir / "manifest.json"])
    with _leave_as_found_on_bad_input(created), \
         folder_lock(out_dir, wait, on_wait=lambda holder: console.print(f"waiting for the build writing {out_dir} ({printable(holder)})", highlight=False, markup=False)):
        for stale in remove_stale_temp_files(out_dir):
            out_console.print(f"removed {stale.name}, left by an interrupted run", highlight=False, markup=False)
        manifest = Manifest.load_or_new(out_dir / "manifest.json", loaded.name)
        if manifest.profile != loaded.name:
            raise PipelineError(f"{manifest.path} records a build of profile {manifest.profile!r}, not {loaded.name!r}; pass --out for this build (default artifacts/{loaded.name})")
        options = {"onnx": onnx, "fp16": fp16, "int8": int8, "fp8": fp8, "int4": int4, "bf16": bf16, "calib": calib, "preset": preset.value if preset else None, "min_cosine": min_cosine,
                   "min_token_agreement": min_token_agreement,
                   "verbosity": verbosity.value if verbosity else None, "weak_fp16": weak_fp16}
        ctx = Context(loaded, out_dir, manifest, options, rerun_hint=lambda: _docker_hint(loaded, options, out_dir))
        records = Runner(ctx, out_console, force=force, strict=strict).run(build_plan(options), until=until.value if until else None)
    print_next_steps(out_console, loaded, manifest.path, records)


def _factory_outside(profile) -> Optional[Path]:
    """The factory module's file, when it is neither beside the profile nor installed nor ours: the code a build runs
    that the user may not expect (a module that happens to be on PYTHONPATH or in the current folder)."""
    import sysconfig

    from pipeline.export import factory_file

    path = factory_file(profile)
    if path is None:
        return None
    path = path.resolve()
    known = [profile.folder, Path(__file__).resolve().parents[2], *(sysconfig.get_paths()[key] for key in ("purelib", "platlib", "stdlib"))]
    return None if any(path.is_relative_to(Path(folder).resolve()) for folder in known) else path


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


@contextlib.contextmanager
def _leave_as_found_on_bad_input(created: list[Path]) -> Iterator[None]:
    """A build that stops on bad input (exit 2) removes the manifest and folders it created, when nothing
    else was written there: such a manifest records only the refusal, which the error line already says."""
    try:
        yield
    except PipelineError as err:
        if err.exit_code == 2:
            manifests = [p for p in created if p.name == "manifest.json"]
            if manifests and manifests[0].parent.is_dir() and {p.name for p in manifests[0].parent.iterdir()} <= {"manifest.json"}:
                manifests[0].unlink()
            for folder in (p for p in created if p.name != "manifest.json"):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty
        raise


def _docker_hint(profile, options: dict, out: Path) -> str:
    """The command that runs this build, with the user's profile, options and output folder, in our image."""
    from trt.capability import docker_command, profile_argument

    arguments: list[str | Path] = ["build", "--profile", profile_argument(profile)]
    if options.get("onnx"):
        arguments += ["--onnx", Path(options["onnx"])]
    arguments += [flag for key, flag in (("fp16", "--fp16"), ("int8", "--int8"), ("fp8", "--fp8"), ("int4", "--int4"), ("bf16", "--bf16"),
                                                          ("weak_fp16", "--weak-fp16")) if options.get(key)]
    if options.get("calib"):
        arguments += ["--calib", Path(options["calib"])]
    for key, flag in (("preset", "--preset"), ("min_cosine", "--min-cosine"), ("verbosity", "--verbosity")):
        if options.get(key) is not None:
            arguments += [flag, str(options[key])]
    model = profile.onnx_path()
    return docker_command([*arguments, "--out", out, "--strict"], also_mount=[model] if model else [])


def _check_build_flags(precisions: dict[str, bool], calib: Optional[Path], preset: Optional["PresetName"], min_cosine: Optional[float]) -> None:
    """Options that only a stage not requested would read are mistakes, not silently ignored."""
    if calib is not None and not (precisions["int8"] or precisions["fp8"] or precisions["int4"]):
        raise PipelineError("--calib is calibration data for the INT8 stage (and the FP8/INT4 ones), which this build does not run; add --int8, --fp8 or --int4, or drop --calib")
    if preset is not None and not (precisions["int8"] or precisions["fp8"]):
        raise PipelineError("--preset chooses the INT8 Q/DQ placement (and the FP8 one), which this build does not run; add --int8 or --fp8, or drop --preset")
    if min_cosine is not None and not any(precisions.values()):
        raise PipelineError("--min-cosine is the accuracy gate of the FP16/INT8/FP8/INT4/BF16 stages, which this build does not run; add one or drop it")


@app.command(
    help=(
        "Export the profile's PyTorch model to ONNX and verify it against torch on onnxruntime (CPU).\n\n"
        "Examples:\n\n"
        "  python -m pipeline export -o model.onnx\n\n"
        "  python -m pipeline export --profile bert-tiny --exporter torchscript -o bert_ts.onnx\n\n"
        "  python -m pipeline export --exporter torchscript --functions EncoderLayer -o bert_fn.onnx"
    )
)
def export(
    output: Annotated[Path, typer.Option("--output", "-o", help="ONNX file to write.")],
    profile: ProfileOption = DEFAULT_PROFILE,
    exporter: Annotated[
        Optional[Exporter], typer.Option(help="Override the profile's exporter [default: from the profile].")
    ] = None,
    functions: Annotated[Optional[str], typer.Option(help="Module classes to export as ONNX local functions, comma-separated (TorchScript exporter), e.g. EncoderLayer.")] = None,
) -> None:
    from pipeline.core.fileio import check_outputs
    from pipeline.core.profiles import load_profile
    from pipeline.export import export_model
    from pipeline.settings import Settings
    from pipeline.stages.export import EXPORT

    check_outputs([output], [])
    loaded = load_profile(profile)
    if not loaded.model.from_pytorch:
        raise PipelineError(f"{loaded.source}: this profile starts from an ONNX file (model.onnx); there is nothing to export")
    # the export stage's settings, with --exporter in place of the profile's
    settings = Settings("export", loaded, {"exporter": exporter.value if exporter else None}, EXPORT.reads)
    with console.status(f"exporting {loaded.name}") as spinner:
        result = export_model(settings.profile, output, status=spinner.update,
                              functions=[n.strip() for n in functions.split(",") if n.strip()] if functions else None)
    stdout_console().print(
        f"wrote {output}: {result.nodes} nodes, {result.exporter} exporter, opset {result.opset}, "
        f"max_abs_diff vs torch {result.max_abs_diff:.2e}",
        highlight=False,
        markup=False,
    )


@app.command(
    help=(
        "Rewrite an ONNX graph into the form TensorRT fuses best, with standard ONNX ops only: constant and "
        "shape folding, no-op removal, LayerNorm and GELU fusion (opset >= 17 / 20), attention scale before the "
        "first MatMul. Outputs stay numerically equal (the build stage checks it on onnxruntime).\n\n"
        "Examples:\n\n"
        "  python -m pipeline optimize model.onnx -o model.opt.onnx --stats\n\n"
        "  python -m pipeline optimize model.onnx -o out.onnx --skip-rules fuse-gelu,scale-before-attention-matmul\n\n"
        "  python -m pipeline optimize --list-rules"
    )
)
def optimize(
    source: Annotated[Optional[Path], typer.Argument(help="ONNX file to optimize.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Optimized ONNX file to write.")] = None,
    rules: Annotated[Optional[str], typer.Option(help="Only these rules, comma-separated.")] = None,
    skip_rules: Annotated[Optional[str], typer.Option(help="Rules not to apply, comma-separated.")] = None,
    stats: Annotated[bool, typer.Option("--stats", help="Print per-rule statistics (tried, applied, nodes, time, why not).")] = False,
    list_rules: Annotated[bool, typer.Option("--list-rules", help="List the rules (name, priority, minimum opset, rewrite) and exit.")] = False,
) -> None:
    from pipeline.core.fileio import check_outputs
    from pipeline.optimize import describe_rules, optimize_file

    def names(text: Optional[str]) -> Optional[list[str]]:
        return [n.strip() for n in text.split(",") if n.strip()] if text else None

    if list_rules:
        lines = [f"{'rule':<32} {'priority':<10} {'opset':>5}  rewrite"]
        lines += [f"{r['rule']:<32} {r['priority']:<10} {'>= ' + str(r['min_opset']) if r['min_opset'] > 1 else 'any':>5}  {r['rewrite']}" for r in describe_rules()]
        sys.stdout.write("\n".join(lines) + "\n")
        return
    if source is None or output is None:
        raise PipelineError("optimize: give the ONNX file and -o OUT.onnx (or --list-rules)")
    check_outputs([output], [source])
    with console.status(f"optimizing {source}"):
        result = optimize_file(source, output, names(rules), names(skip_rules))
    out = stdout_console()
    delta = ", ".join(f"{op} {d:+d}" for op, d in result.op_delta.items()) or "no change"
    out.print(f"wrote {output}: {result.nodes_before} -> {result.nodes_after} nodes ({delta})", highlight=False, markup=False)
    if stats:
        from rich.table import Table

        table = Table(title="rewrite rules", title_justify="left")
        for column in ("rule", "priority", "tried", "applied", "nodes +", "nodes -", "ms", "why not (top)"):
            table.add_column(column, justify="right" if column in ("tried", "applied", "nodes +", "nodes -", "ms") else "left")
        for r in result.rules:
            why = "; ".join(f"{reason} ({count})" for reason, count in r["why_not"].items())
            table.add_row(r["rule"], r["priority"], str(r["tried"]), str(r["applied"]), str(r["nodes_added"]), str(r["nodes_removed"]), f"{r['seconds'] * 1000:.1f}", why)
        out.print(table)
        out.print(f"checked before writing: {', '.join(result.checks) or 'nothing the input passes'}", highlight=False, markup=False)

@app.command(
    help=(
        "Produce an FP16 (ModelOpt AutoCast) or INT8 (ModelOpt Q/DQ, calibrated) model from an ONNX file; with "
        "both flags, an INT8 model whose float parts are FP16. --fp8 (FP8 Q/DQ), --int4 (weight-only INT4) and --bf16 "
        "(AutoCast to BF16) call the build's stages of those names. Calibration: --calib FILE.npz, or synthetic samples "
        "from --profile.\n\n"
        "Examples:\n\n"
        "  python -m pipeline quantize model.opt.onnx -o model.fp16.onnx --fp16\n\n"
        "  python -m pipeline quantize model.opt.onnx -o model.int8.onnx --int8 --calib calib.npz --preset trt-fusion\n\n"
        "  python -m pipeline quantize model.opt.onnx -o model.fp8.onnx --fp8 --profile hf-vit-tiny"
    )
)
def quantize(
    source: Annotated[Path, typer.Argument(help="FP32 ONNX file.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="ONNX file to write.")],
    fp16: Annotated[bool, typer.Option("--fp16", help="FP16 (alone) or FP16 float parts (with --int8).")] = False,
    int8: Annotated[bool, typer.Option("--int8", help="INT8 Q/DQ.")] = False,
    fp8: Annotated[bool, typer.Option("--fp8", help="FP8 Q/DQ (opset >= 21), gated on accuracy; needs --profile.")] = False,
    int4: Annotated[bool, typer.Option("--int4", help="Weight-only INT4 for MatMul/Gemm weights, gated on accuracy; needs --profile.")] = False,
    bf16: Annotated[bool, typer.Option("--bf16", help="BF16 (AutoCast).")] = False,
    calib: Annotated[Optional[Path], typer.Option(help="Calibration .npz: one array per model input, samples on axis 0.")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", "-p", help="Profile for synthetic calibration data (when no --calib), the held-out accuracy samples (--fp8, --int4) and, with --fp16/--bf16, the input shapes the result must run at [default: zeros with dynamic dims at 1 and 3].")] = None,
    preset: Annotated[Optional[PresetName], typer.Option(help="INT8/FP8 Q/DQ placement [default: from the profile; auto: the preset of the model's family, trt-fusion, decoder or cnn].")] = None,
) -> None:
    from pipeline.core.fileio import check_outputs
    from pipeline.core.onnxfile import load_onnx

    chosen = [flag for flag, on in (("--fp16", fp16), ("--int8", int8), ("--fp8", fp8), ("--int4", int4), ("--bf16", bf16)) if on]
    if not chosen:
        raise PipelineError("quantize: give --fp16, --int8 (or both), --fp8, --int4 or --bf16")
    if len(chosen) > 1 and set(chosen) != {"--fp16", "--int8"}:
        raise PipelineError(f"quantize: {' and '.join(chosen)} make different models; give one of them (only --fp16 --int8 combine)")
    if calib is not None and not (int8 or fp8 or int4):
        raise PipelineError("--calib is calibration data for --int8, --fp8 or --int4, which this command was not given; add one or drop --calib")
    if preset is not None and not (int8 or fp8):
        raise PipelineError("--preset chooses the INT8 Q/DQ placement (and the FP8 one); add --int8 or --fp8, or drop --preset")
    check_outputs([output], [source, calib])
    load_onnx(source)
    if (fp16 or bf16) and not int8:
        _autocast("bf16" if bf16 else "fp16", source, output, profile)
    elif fp8 or int4:
        _post_training(source, output, "fp8" if fp8 else "int4", calib, profile, preset)
    else:
        _int8(source, output, fp16, calib, profile, preset)


def _autocast(precision: str, source: Path, output: Path, profile: Optional[str]) -> None:
    """quantize --fp16 / --bf16: the stage's `convert`, with the profile's exclusions and shape checks."""
    from pipeline.core.profiles import load_profile
    from pipeline.core.samples import model_feeds
    from pipeline.settings import Settings
    from pipeline.stages import bf16, fp16
    from pipeline.stages.fp16 import shape_checks
    from quant.calibration import model_inputs

    stage, reads = (bf16, bf16.BF16.reads) if precision == "bf16" else (fp16, fp16.FP16.reads)
    if profile is not None:  # the stage's settings and shape checks, from the profile
        from pipeline.models.decoder import autocast_feeds

        settings = Settings(precision, load_profile(profile), {}, reads)
        checks = shape_checks(settings.profile)
        reference_feeds = autocast_feeds(settings.profile) if precision == "fp16" else None  # a decoder's, as the stage passes
    else:  # zeros with dynamic dims at 1 and 3, where the source model itself runs; the [quant] defaults (no exclusions)
        from pipeline.core.profiles import QuantSection

        defaults = load_profile(DEFAULT_PROFILE).model_copy(update={"quant": QuantSection()})
        settings = Settings(precision, defaults, {}, ("quant.fp16_exclude_op_types", "quant.fp16_exclude_nodes"))
        checks = [feeds for feeds in model_feeds(model_inputs(source)) if _runs(source, feeds)]
        reference_feeds = None
    with console.status(f"converting to {precision.upper()} with ModelOpt AutoCast, checking that it runs"):
        result = stage.convert(settings.profile, source, output, checks, **({"reference_feeds": reference_feeds} if reference_feeds else {}))
    if result.checked_shapes:
        first = next(iter(result.checked_shapes[0]))
        checked = f"runs at {first} {', '.join('x'.join(map(str, s[first])) for s in result.checked_shapes)}"
    elif getattr(result, "unchecked", None):
        checked = result.unchecked
    else:
        checked = "not run: the source runs at none of the zero-filled shapes; pass --profile to check at its shapes"
    stdout_console().print(f"wrote {output}: {result.nodes} nodes, {precision.upper()} (AutoCast, providers {result.providers}); {checked}",
                           highlight=False, markup=False)


def _post_training(source: Path, output: Path, precision: str, calib: Optional[Path], profile: Optional[str], preset: Optional["PresetName"]) -> None:
    """quantize --fp8 / --int4: the stage's `quantize` with the profile's settings and this command's flags (gated like the stage)."""
    from rich.progress import Progress

    from pipeline.core.profiles import load_profile
    from pipeline.settings import Settings
    from pipeline.stages import fp8, int4

    if profile is None:
        raise PipelineError(f"quantize --{precision} needs --profile NAME: its accuracy gate runs on held-out samples made from the profile")
    stage, reads = (fp8, fp8.FP8.reads) if precision == "fp8" else (int4, int4.INT4.reads)
    settings = Settings(precision, load_profile(profile), {"calib": calib, "preset": preset.value if preset else None}, reads)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"quantizing to {precision.upper()}", total=None)
        result, origin = stage.quantize(settings.profile, settings.calib, source, output,
                                        on_step=lambda done, total: progress.update(task, completed=done, total=total))
    figures = result.accuracy
    stdout_console().print(f"wrote {output}: {precision.upper()} ({result.method}), opset {result.opset}, {result.qdq['quantize']} Q / "
                           f"{result.qdq['dequantize']} DQ, cosine_centered={figures['cosine_centered']:.5f} (gate {result.min_cosine}), "
                           f"calibration: {origin}; lint-qdq: {len(result.findings)} findings", highlight=False, markup=False)


def _int8(source: Path, output: Path, fp16: bool, calib: Optional[Path], profile: Optional[str], preset: Optional["PresetName"]) -> None:
    from rich.progress import Progress

    from pipeline.core.profiles import load_profile
    from pipeline.settings import Settings
    from pipeline.stages.int8 import QUANTIZE_READS, calibration_batch
    from pipeline.stages.int8 import quantize as quantize_int8

    if calib is None and profile is None:
        raise PipelineError("quantize --int8 needs calibration data: --calib FILE.npz, or --profile NAME for synthetic samples")
    # the int8 stage's settings: the profile's, with this command's flags in place of the build's
    if profile is not None:
        loaded = load_profile(profile)
    else:  # --calib alone: the [quant] defaults, and no sequence range or batch taken from another model's profile
        from pipeline.core.profiles import QuantSection

        loaded = load_profile(DEFAULT_PROFILE).model_copy(update={"dims": {}, "quant": QuantSection()})
    if fp16:
        loaded = loaded.model_copy(update={"quant": loaded.quant.model_copy(update={"int8_float_dtype": "fp16"})})
    settings = Settings("int8", loaded, {"calib": calib, "preset": preset.value if preset else None}, QUANTIZE_READS)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"calibrating ({settings.profile.quant.preset})", total=None)
        result, origin = quantize_int8(settings.profile, settings.calib, source, output,
                                       on_step=lambda done, total: progress.update(task, completed=done, total=total))
    stdout_console().print(f"wrote {output}: INT8 ({result.preset}), {result.qdq_pairs} Q/DQ pairs, calibration: {origin}; "
                           f"lint-qdq: {len(result.findings)} findings", highlight=False, markup=False)
    if result.qdq_pairs == 0:
        stdout_console().print(f"note: nothing was quantized. ModelOpt leaves a MatMul/Gemm in float when its M or N is 1 at the calibration "
                               f"batch (here {calibration_batch(settings.profile, source)}: a 2-D input's batch is M) or its K or N is under 16, "
                               "and a Conv with too few channels; if you deploy at a larger batch, pass --profile with it", highlight=False, markup=False)


def _runs(model: Path, feeds: dict) -> bool:
    from pipeline.core.verify import run_onnx

    try:
        run_onnx(model, feeds)
    except PipelineError:
        return False
    return True
