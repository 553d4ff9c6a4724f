"""Commands that make one model from another: export (torch -> ONNX), optimize (the rewrite rules), quantize
(one precision's stage, on any ONNX file)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Annotated, Optional, get_args

import typer

from pipeline import precisions as registry
from pipeline.cli.app import ProfileOption, app, choices, console, precision_flags, stdout_console
from pipeline.cli.build import PresetOption
from pipeline.core import DEFAULT_PROFILE
from pipeline.core.errors import PipelineError
from pipeline.core.profiles import ExportSection

Exporter = choices("Exporter", get_args(ExportSection.model_fields["exporter"].annotation))


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
    from pipeline.settings import Options, Settings
    from pipeline.stages.export import STAGE as EXPORT

    check_outputs([output], [])
    loaded = load_profile(profile)
    if not loaded.model.from_pytorch:
        raise PipelineError(f"{loaded.source}: this profile starts from an ONNX file (model.onnx); there is nothing to export")
    # the export stage's settings, with --exporter in place of the profile's
    settings = Settings("export", loaded, Options(exporter=exporter.value if exporter else None), EXPORT.reads)
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

        from trt.render.text import DASHED

        table = Table(title="rewrite rules", title_justify="left", box=DASHED, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
        for column in ("rule", "priority", "tried", "applied", "nodes +", "nodes -", "ms", "why not (top)"):
            table.add_column(column, justify="right" if column in ("tried", "applied", "nodes +", "nodes -", "ms") else "left")
        for r in result.rules:
            why = "; ".join(f"{reason} ({count})" for reason, count in r["why_not"].items())
            table.add_row(r["rule"], r["priority"], str(r["tried"]), str(r["applied"]), str(r["nodes_added"]), str(r["nodes_removed"]), f"{r['seconds'] * 1000:.1f}", why)
        out.print(table)
        out.print(f"checked before writing: {', '.join(result.checks) or 'nothing the input passes'}", highlight=False, markup=False)

@app.command(
    help=(
        "Make one precision's model from an ONNX file, as the build's stage of that name does (gated on accuracy where "
        "the stage is): " + ", ".join(f"--{p.name}" for p in registry.optional()) + "; --int8 --fp16 makes an INT8 model whose "
        "float parts are FP16. Calibration: --calib FILE.npz, or synthetic samples from --profile.\n\n"
        "Examples:\n\n"
        "  python -m pipeline quantize model.opt.onnx -o model.fp16.onnx --fp16\n\n"
        "  python -m pipeline quantize model.opt.onnx -o model.int8.onnx --int8 --calib calib.npz --preset trt-fusion\n\n"
        "  python -m pipeline quantize model.opt.onnx -o model.fp8.onnx --fp8 --profile hf-vit-tiny"
    )
)
@precision_flags
def quantize(
    source: Annotated[Path, typer.Argument(help="FP32 ONNX file.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="ONNX file to write.")],
    precisions: frozenset[str] = frozenset(),
    calib: Annotated[Optional[Path], typer.Option(help="Calibration .npz: one array per model input, samples stacked on its batch axis, axis 0 for most models.")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", "-p", help="Profile of the stage's settings, its synthetic calibration data (when no --calib), held-out accuracy samples and the input shapes the result must run at [default: the [quant] defaults, zeros with dynamic dims at 1 and 3].")] = None,
    preset: PresetOption = None,
) -> None:
    from rich.progress import Progress

    from pipeline.artifacts import as_built, fixed_feeds_beside
    from pipeline.core.fileio import check_outputs
    from pipeline.core.onnxfile import load_onnx
    from pipeline.core.profiles import load_profile
    from pipeline.stages.shared import QuantizeRequest

    precision, float_parts = _chosen(precisions)
    if calib is not None and not precision.calibrated:
        raise PipelineError(f"--calib is calibration data for {registry.listed(p for p in registry.optional() if p.calibrated)}, "
                            "which this command was not given; add one or drop --calib")
    if preset is not None and not precision.placed:
        raise PipelineError(f"--preset chooses the Q/DQ placement of {registry.listed(p for p in registry.optional() if p.placed)}; "
                            "add one or drop --preset")
    check_outputs([output], [source, calib])
    load_onnx(source)
    # in a build folder, the profile as its stages saw it: the inputs its export derived, a decoder part's encoder outputs
    loaded = as_built(load_profile(profile), source) if profile is not None else None
    module = importlib.import_module(precision.module)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task(f"making the {precision.label} model", total=None)
        request = QuantizeRequest(source, output, loaded, calib, preset.value if preset else None, float_parts,
                                  fixed_feeds_beside(source), lambda done, total: progress.update(task, completed=done, total=total))
        line = module.quantize_command(request)
    stdout_console().print(line, highlight=False, markup=False)


def _chosen(precisions: frozenset[str]) -> tuple[registry.Precision, str | None]:
    """The precision to make and the one given for its float parts, from the flags (one, or two the registry combines)."""
    chosen = [p for p in registry.optional() if p.name in precisions]
    if not chosen:
        raise PipelineError(f"quantize: give {registry.listed(registry.optional())}")
    if len(chosen) == 1:
        return chosen[0], None
    main = next((p for p in chosen if p.combines_with and {p.name, p.combines_with} == set(precisions)), None)
    if main is None:
        raise PipelineError(f"quantize: {' and '.join('--' + p.name for p in chosen)} make different models; give one of them "
                            f"(only {', '.join(f'--{p.name} --{p.combines_with}' for p in registry.optional() if p.combines_with)} combine)")
    return main, main.combines_with
