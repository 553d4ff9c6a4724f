"""Commands that make models: build (every stage), export, optimize, quantize."""

from __future__ import annotations

import sys
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
    build = "build"
    report = "report"
    diff = "diff"
    bench = "bench"


class Verbosity(str, Enum):
    none = "none"
    layer_names_only = "layer_names_only"
    detailed = "detailed"


class PresetName(str, Enum):
    trt_fusion = "trt-fusion"
    modelopt = "modelopt"
    gemm_only = "gemm-only"


@app.command(
    help=(
        "Run the pipeline stages for a profile into OUT (default artifacts/<profile>), "
        "recording each in OUT/manifest.json. Unchanged stages are reported `cached`.\n\n"
        "Examples:\n\n"
        "  python -m pipeline build\n\n"
        "  python -m pipeline build --profile my_model.toml --out runs/a --force\n\n"
        "  python -m pipeline build --onnx model.onnx --profile bert-tiny\n\n"
        "  python -m pipeline build --fp16 --int8 --preset trt-fusion"
    )
)
def build(
    profile: ProfileOption = DEFAULT_PROFILE,
    onnx: Annotated[Optional[Path], typer.Option(help="Start from this ONNX file instead of exporting.")] = None,
    fp16: Annotated[bool, typer.Option("--fp16", help="Produce model.fp16.onnx (ModelOpt AutoCast).")] = False,
    int8: Annotated[bool, typer.Option("--int8", help="Produce model.int8.onnx (ModelOpt Q/DQ) and lint its placement.")] = False,
    calib: Annotated[Optional[Path], typer.Option(help="Calibration data .npz (one array per input, samples on axis 0) [default: synthetic from the profile].")] = None,
    preset: Annotated[Optional[PresetName], typer.Option(help="INT8 Q/DQ placement [default: from the profile, trt-fusion].")] = None,
    min_cosine: Annotated[Optional[float], typer.Option(min=0, max=1, help="Accuracy gate vs FP32 (cosine_centered) [default: 0.999 FP16, 0.99 INT8].")] = None,
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

    _check_build_flags(fp16, int8, calib, preset, min_cosine)
    if min_token_agreement is not None and not (fp16 or int8):
        raise PipelineError("--min-token-agreement is the generation gate of the FP16/INT8 stages, which this build does not run; add --fp16/--int8 or drop it")
    loaded = load_profile(profile)
    out_dir = out or Path("artifacts") / loaded.name
    out_console = stdout_console()
    out_console.print(f"profile {loaded.name} from {loaded.source}", highlight=False, markup=False)
    if (ignored := shadowed_profile(profile)) is not None:
        out_console.print(f"note: {ignored} is not used: the packaged profile {profile!r} is; pass --profile {ignored} to use yours", highlight=False, markup=False)
    with folder_lock(out_dir, wait, on_wait=lambda holder: console.print(f"waiting for the build writing {out_dir} ({printable(holder)})", highlight=False, markup=False)):
        for stale in remove_stale_temp_files(out_dir):
            out_console.print(f"removed {stale.name}, left by an interrupted run", highlight=False, markup=False)
        manifest = Manifest.load_or_new(out_dir / "manifest.json", loaded.name)
        if manifest.profile != loaded.name:
            raise PipelineError(f"{manifest.path} records a build of profile {manifest.profile!r}, not {loaded.name!r}; pass --out for this build (default artifacts/{loaded.name})")
        options = {"onnx": onnx, "fp16": fp16, "int8": int8, "calib": calib, "preset": preset.value if preset else None, "min_cosine": min_cosine,
                   "min_token_agreement": min_token_agreement, "verbosity": verbosity.value if verbosity else None, "weak_fp16": weak_fp16}
        ctx = Context(loaded, out_dir, manifest, options)
        Runner(ctx, out_console, force=force, strict=strict).run(build_plan(ctx), until=until.value if until else None)


def _check_build_flags(fp16: bool, int8: bool, calib: Optional[Path], preset: Optional["PresetName"], min_cosine: Optional[float]) -> None:
    """Options that only a stage not requested would read are mistakes, not silently ignored."""
    if calib is not None and not int8:
        raise PipelineError("--calib is calibration data for the INT8 stage, which this build does not run; add --int8 or drop --calib")
    if preset is not None and not int8:
        raise PipelineError("--preset chooses the INT8 Q/DQ placement, which this build does not run; add --int8 or drop --preset")
    if min_cosine is not None and not (fp16 or int8):
        raise PipelineError("--min-cosine is the accuracy gate of the FP16/INT8 stages, which this build does not run; add --fp16/--int8 or drop it")


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

    check_outputs([output], [])
    loaded = load_profile(profile)
    if not loaded.model.from_pytorch:
        raise PipelineError(f"{loaded.source}: this profile starts from an ONNX file (model.onnx); there is nothing to export")
    with console.status(f"exporting {loaded.name}") as spinner:
        result = export_model(loaded, output, exporter.value if exporter else None, status=spinner.update,
                              functions=[n.strip() for n in functions.split(",") if n.strip()] if functions else None)
    stdout_console().print(
        f"wrote {output}: {result.nodes} nodes, {result.exporter} exporter, opset {result.opset}, "
        f"max_abs_diff vs torch {result.max_abs_diff:.2e}",
        highlight=False,
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
    from pipeline import deferred_sympy
    from pipeline.core.fileio import check_outputs

    deferred_sympy.defer()  # this process never imports torch: onnx_ir's sympy import can wait (never comes)
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
    out.print(f"wrote {output}: {result.nodes_before} -> {result.nodes_after} nodes ({delta})", highlight=False)
    if stats:
        from rich.table import Table

        table = Table(title="rewrite rules", title_justify="left")
        for column in ("rule", "priority", "tried", "applied", "nodes +", "nodes -", "ms", "why not (top)"):
            table.add_column(column, justify="right" if column in ("tried", "applied", "nodes +", "nodes -", "ms") else "left")
        for r in result.rules:
            why = "; ".join(f"{reason} ({count})" for reason, count in r["why_not"].items())
            table.add_row(r["rule"], r["priority"], str(r["tried"]), str(r["applied"]), str(r["nodes_added"]), str(r["nodes_removed"]), f"{r['seconds'] * 1000:.1f}", why)
        out.print(table)

@app.command(
    help=(
        "Produce an FP16 (ModelOpt AutoCast) or INT8 (ModelOpt Q/DQ, calibrated) model from an ONNX file; with "
        "both flags, an INT8 model whose float parts are FP16. Calibration: --calib FILE.npz, or synthetic samples "
        "from --profile.\n\n"
        "Examples:\n\n"
        "  python -m pipeline quantize model.opt.onnx -o model.fp16.onnx --fp16\n\n"
        "  python -m pipeline quantize model.opt.onnx -o model.int8.onnx --int8 --calib calib.npz --preset trt-fusion"
    )
)
def quantize(
    source: Annotated[Path, typer.Argument(help="FP32 ONNX file.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="ONNX file to write.")],
    fp16: Annotated[bool, typer.Option("--fp16", help="FP16 (alone) or FP16 float parts (with --int8).")] = False,
    int8: Annotated[bool, typer.Option("--int8", help="INT8 Q/DQ.")] = False,
    calib: Annotated[Optional[Path], typer.Option(help="Calibration .npz: one array per model input, samples on axis 0.")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", "-p", help="Profile for synthetic calibration data (when no --calib) and, with --fp16, the input shapes the result must run at [default: zeros with dynamic dims at 1 and 3].")] = None,
    preset: Annotated[PresetName, typer.Option(help="INT8 Q/DQ placement.")] = PresetName.trt_fusion,
) -> None:
    from pipeline.core.fileio import check_outputs
    from pipeline.core.onnxfile import load_onnx
    from pipeline.core.profiles import load_profile
    from pipeline.core.quiet import captured

    if not (fp16 or int8):
        raise PipelineError("quantize: give --fp16, --int8 or both")
    if calib is not None and not int8:
        raise PipelineError("--calib is calibration data for --int8, which this command was not given; add --int8 or drop --calib")
    check_outputs([output], [source, calib])
    load_onnx(source)
    out = stdout_console()
    if fp16 and not int8:
        from pipeline.core.samples import make_inputs, model_feeds, range_sizes
        from quant.calibration import model_inputs
        from quant.fp16 import convert_fp16

        if profile is not None:
            loaded = load_profile(profile)
            checks = [make_inputs(loaded, seed=5000 + i, dims=sizes) for i, sizes in enumerate(range_sizes(loaded))]
        else:  # zeros with dynamic dims at 1 and 3, where the source model itself runs
            checks = [feeds for feeds in model_feeds(model_inputs(source)) if _runs(source, feeds)]
        with console.status("converting to FP16 with ModelOpt AutoCast, checking that it runs"), captured():
            result = convert_fp16(source, output, [], [], checks)
        if result.checked_shapes:
            first = next(iter(result.checked_shapes[0]))
            checked = f"runs at {first} {', '.join('x'.join(map(str, s[first])) for s in result.checked_shapes)}"
        else:
            checked = "not run: the source runs at none of the zero-filled shapes; pass --profile to check at its shapes"
        out.print(f"wrote {output}: {result.nodes} nodes, FP16 (AutoCast, providers {result.providers}); {checked}", highlight=False)
        return
    from quant.calibration import calibration_data
    from quant.int8 import quantize_int8

    if calib is None and profile is None:
        raise PipelineError("quantize --int8 needs calibration data: --calib FILE.npz, or --profile NAME for synthetic samples")
    loaded = load_profile(profile or "bert-tiny")
    data, origin = calibration_data(loaded, calib, source)
    batch = loaded.shape(loaded.inputs[0])[0]
    from rich.progress import Progress

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"calibrating ({preset.value})", total=None)
        with captured():
            result = quantize_int8(source, output, data, batch, preset.value, "fp16" if fp16 else "fp32",
                                   on_step=lambda done, total: progress.update(task, completed=done, total=total))
    findings = result.findings
    out.print(f"wrote {output}: INT8 ({result.preset}), {result.qdq_pairs} Q/DQ pairs, calibration: {origin}; "
              f"lint-qdq: {len(findings)} findings", highlight=False)

def _runs(model: Path, feeds: dict) -> bool:
    from pipeline.core.verify import run_onnx

    try:
        run_onnx(model, feeds)
    except PipelineError:
        return False
    return True
