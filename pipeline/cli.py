"""`python -m pipeline ...`: the command-line interface (typer + rich).

Only light modules are imported here; each command imports its stage's heavy
dependencies (torch, onnxruntime, modelopt, tensorrt) when it runs.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from pipeline import __version__, interrupts
from pipeline.core import DEFAULT_PROFILE
from pipeline.core.errors import PipelineError
from pipeline.core.text import printable, printable_json

app = typer.Typer(
    name="pipeline",
    help=(
        "PyTorch/ONNX -> TensorRT deployment pipeline with fusion reports.\n\n"
        "Examples:\n\n"
        "  python -m pipeline build                      # default profile bert-tiny\n\n"
        "  python -m pipeline build --profile bert-base --until export\n\n"
        "  python -m pipeline export --exporter torchscript -o bert.onnx"
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console(stderr=True)


def stdout_console() -> Console:
    """Rich output on stdout; 140 columns when piped so tables and paths are not cut."""
    probe = Console(file=sys.stdout)
    # bound to the real stdout now: stages capture sys.stdout while third-party code runs
    return probe if probe.is_terminal else Console(file=sys.stdout, width=140)
_debug = False


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


ProfileOption = Annotated[
    str, typer.Option("--profile", "-p", help="Profile name (profiles/NAME.toml) or path to a .toml file.")
]


def _version(value: bool) -> None:
    if value:
        print(f"trt-pipeline {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show the full traceback on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    global _debug
    _debug = debug


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
                   "verbosity": verbosity.value if verbosity else None, "weak_fp16": weak_fp16}
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
        "  python -m pipeline export --profile bert-tiny --exporter torchscript -o bert_ts.onnx"
    )
)
def export(
    output: Annotated[Path, typer.Option("--output", "-o", help="ONNX file to write.")],
    profile: ProfileOption = DEFAULT_PROFILE,
    exporter: Annotated[
        Optional[Exporter], typer.Option(help="Override the profile's exporter [default: from the profile].")
    ] = None,
) -> None:
    from pipeline.core.fileio import check_outputs
    from pipeline.core.profiles import load_profile
    from pipeline.export import export_model

    check_outputs([output], [])
    loaded = load_profile(profile)
    if not loaded.model.from_pytorch:
        raise PipelineError(f"{loaded.source}: this profile starts from an ONNX file (model.onnx); there is nothing to export")
    with console.status(f"exporting {loaded.name}") as spinner:
        result = export_model(loaded, output, exporter.value if exporter else None, status=spinner.update)
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
        "List the packaged profiles (and those in ./profiles): name, model, inputs, description. Use one with "
        "--profile NAME.\n\n"
        "Examples:\n\n"
        "  python -m pipeline profiles"
    )
)
def profiles() -> None:
    from pipeline.core.profiles import describe_profiles

    rows = describe_profiles()
    width = max(len(r["name"]) for r in rows)
    lines = [f"{r['name']:<{width}}  {r['model']}  inputs: {r['inputs']}" + (f"\n{'':<{width}}  {r['description']}" if r["description"] else "") for r in rows]
    sys.stdout.write("\n".join(lines) + "\n")


class HfTask(str, Enum):
    base = "base"
    sequence_classification = "sequence-classification"
    token_classification = "token-classification"
    masked_lm = "masked-lm"
    causal_lm = "causal-lm"
    image_classification = "image-classification"


@app.command(
    help=(
        "Write a starter profile for a Hugging Face model: SOURCE is a folder written by save_pretrained, or a "
        "model_type (random weights from its default config). Inputs come from the model's forward (input_ids, "
        "attention_mask, token_type_ids; or pixel_values), dims from the config; edit them to your shapes.\n\n"
        "Examples:\n\n"
        "  python -m pipeline init --hf ./my-checkpoint --task sequence-classification -o my-model.toml\n\n"
        "  python -m pipeline init --hf bert -o bert.toml"
    )
)
def init(
    hf: Annotated[str, typer.Option("--hf", help="save_pretrained folder, or a model_type such as bert, gpt2, vit.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Profile file to write (never overwritten).")],
    task: Annotated[HfTask, typer.Option(help="The head to load.")] = HfTask.base,
) -> None:
    if output.exists():
        raise PipelineError(f"{output} exists; choose another -o or remove it")
    from pipeline.core.fileio import write_text
    from pipeline.core.profiles import load_profile
    from pipeline.models.hf import starter_profile

    name = output.stem if output.suffix == ".toml" else output.name
    text = starter_profile(hf, task.value, name, output.resolve().parent)
    write_text(output, text)
    load_profile(str(output))  # what was written is a valid profile
    stdout_console().print(f"wrote {output}; set its [dims] to your shapes, then: python -m pipeline build --profile {output} --fp16 --int8",
                           highlight=False, markup=False)


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


@app.command(
    name="lint-qdq",
    help=(
        "List the Q/DQ placements in an ONNX model (ours or anyone's) that TensorRT's rules say prevent a fusion, "
        "with the nodes and the change to make.\n\n"
        "Examples:\n\n"
        "  python -m pipeline lint-qdq model.int8.onnx\n\n"
        "  python -m pipeline lint-qdq model.int8.onnx --format json -o lint.json\n\n"
        "  python -m pipeline lint-qdq model.int8.onnx --fail-on-findings   # CI: exit 1 when there are findings"
    ),
)
def lint_qdq(
    model: Annotated[Path, typer.Argument(help="ONNX model with QuantizeLinear/DequantizeLinear nodes.")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="text or json.")] = "text",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
    max_sequence: Annotated[Optional[int], typer.Option(help="Longest sequence the engine will see (for the attention rule).")] = None,
    fail_on_findings: Annotated[bool, typer.Option("--fail-on-findings", help="Exit 1 when there are findings (for CI) [default: exit 0].")] = False,
) -> None:
    import json

    from pipeline.core.fileio import check_outputs
    from quant.lint import findings_json, lint_file

    if fmt not in ("text", "json"):
        raise PipelineError(f"--format {fmt!r}: use text or json")
    check_outputs([output], [model])
    findings = lint_file(model, max_sequence)
    if fmt == "json":
        _emit(json.dumps(findings_json(findings), indent=2) + "\n", output, is_json=True)
    else:
        lines = [f"{model}: {len(findings)} finding{'s' if len(findings) != 1 else ''}"]
        for finding in findings:
            lines += [f"[{finding.rule}] {finding.message}", f"    fix: {finding.suggestion}", f"    nodes: {', '.join(finding.nodes)}"]
        _emit("\n".join(lines) + "\n", output)
    if fail_on_findings and findings:
        raise typer.Exit(1)


@app.command(
    help=(
        "Run two models of one network (e.g. FP32 and INT8) with every intermediate tensor exposed and list the "
        "nodes where the error grows most: which Q/DQ or FP16 conversion costs accuracy. Inputs: --inputs FILE.npz "
        "(one array per input, samples on axis 0) or synthetic samples from --profile.\n\n"
        "Examples:\n\n"
        "  python -m pipeline compare model.opt.onnx model.int8.onnx --profile bert-tiny\n\n"
        "  python -m pipeline compare a.onnx b.onnx --inputs feeds.npz --format json -o divergence.json"
    )
)
def compare(
    reference: Annotated[Path, typer.Argument(help="Reference model (usually FP32).")],
    candidate: Annotated[Path, typer.Argument(help="Model to check (FP16, INT8, ...).")],
    inputs: Annotated[Optional[Path], typer.Option(help="Inputs .npz: one array per model input, samples on axis 0.")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", "-p", help="Profile to draw synthetic inputs from.")] = None,
    samples: Annotated[int, typer.Option(min=1, max=256, help="Synthetic samples (with --profile).")] = 4,
    top: Annotated[int, typer.Option(min=1, help="Nodes to list.")] = 15,
    fmt: Annotated[str, typer.Option("--format", "-f", help="text or json.")] = "text",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
) -> None:
    import json
    import tempfile

    from quant.calibration import load_npz, model_inputs, split, synthetic
    from quant.compare import compare_models

    if fmt not in ("text", "json"):
        raise PipelineError(f"--format {fmt!r}: use text or json")
    if (inputs is None) == (profile is None):
        raise PipelineError("compare: give exactly one of --inputs FILE.npz or --profile NAME")
    from pipeline.core.fileio import check_outputs

    check_outputs([output], [reference, candidate, inputs])
    if inputs is not None:
        feeds = split(load_npz(inputs, model_inputs(reference)), 1)
    else:
        from pipeline.core.profiles import load_profile

        loaded = load_profile(profile)
        feeds = split(synthetic(loaded, samples, seed=30_000), loaded.shape(loaded.inputs[0])[0])
    with tempfile.TemporaryDirectory() as workdir, console.status("running both models with every tensor exposed"):
        result = compare_models(reference, candidate, feeds, Path(workdir))
    if fmt == "json":
        _emit(json.dumps(result, indent=2) + "\n", output, is_json=True)
        return
    lines = [f"{candidate} vs {reference}: {result['compared_tensors']} tensors compared on {result['feeds']} inputs",
             "output error (max |b-a| / max |a|): " + ", ".join(f"{k} {v:.3g}" if v is not None else f"{k} -" for k, v in result["outputs"].items()),
             f"{'node (-> the Q/DQ on its output)':<48} {'op':<20} {'input err':>10} {'output err':>10} {'growth':>10}"]
    for row in result["nodes"][:top]:
        where = f"{row['node']} -> {row['qdq']}" if row["qdq"] else row["node"]
        lines.append(f"{where[:48]:<48} {row['op_type']:<20} {row['input_error']:>10.3g} {row['error']:>10.3g} {row['growth']:>10.3g}")
    _emit("\n".join(lines) + "\n", output)


class Backend(str, Enum):
    trt = "trt"
    ort_cuda = "ort-cuda"
    ort_cpu = "ort-cpu"


@app.command(
    help=(
        "Latency (p50/p90/p99, mean) and throughput of a model, or of a build's FP32/FP16/INT8 models side by side "
        "when ARTIFACT is an artifacts folder. trt: engines, CUDA events; ort-cuda / ort-cpu: ONNX files on "
        "onnxruntime, wall time. Writes JSON and a PNG plot beside it.\n\n"
        "Examples:\n\n"
        "  python -m pipeline bench artifacts/bert-tiny --backend ort-cpu\n\n"
        "  python -m pipeline bench artifacts/bert-tiny/model.int8.onnx --backend ort-cpu -o int8.json\n\n"
        "  python -m pipeline bench artifacts/bert-tiny --backend trt --iterations 1000"
    )
)
def bench(
    artifact: Annotated[Path, typer.Argument(help="A model (.onnx / .engine) or an artifacts folder.")],
    backend: Annotated[Backend, typer.Option(help="What runs the models.")] = Backend.ort_cpu,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed runs first.")] = 10,
    iterations: Annotated[int, typer.Option(min=1, help="Timed runs per model.")] = 100,
    batch: Annotated[Optional[int], typer.Option(min=1, help="Batch size, for profiles with a dynamic 'batch' dim.")] = None,
    profile: ProfileOption = DEFAULT_PROFILE,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Results JSON [default: <folder>/bench.<backend>.json]; the PNG goes beside it.")] = None,
) -> None:
    from rich.progress import Progress

    from pipeline.core.fileio import check_outputs, write_json
    from pipeline.core.profiles import load_profile
    from pipeline.core.samples import make_inputs
    from trt.bench import bench as run_bench
    from trt.bench import plot

    loaded = load_profile(profile)
    models = _bench_models(artifact, backend.value)
    target = output or (artifact if artifact.is_dir() else artifact.parent) / f"bench.{backend.value}.json"
    check_outputs([target, target.with_suffix(".png")], list(models.values()))
    dims = {}
    if batch is not None:
        if "batch" not in loaded.dims or not loaded.dims["batch"].min <= batch <= loaded.dims["batch"].max:
            raise PipelineError(f"--batch {batch}: profile {loaded.name} has no dynamic 'batch' dim allowing it; its inputs are {[list(loaded.shape(i)) for i in loaded.inputs]}")
        dims["batch"] = batch
    if backend is Backend.trt:
        from pipeline.core.errors import CapabilityMissing
        from trt.capability import docker_command, profile_argument, tensorrt_missing

        missing = tensorrt_missing()
        if missing:
            arguments = ["bench", artifact, "--backend", "trt", "--warmup", str(warmup), "--iterations", str(iterations), "--profile", profile_argument(loaded)]
            arguments += (["--batch", str(batch)] if batch else []) + (["-o", output] if output else [])
            raise CapabilityMissing(f"bench --backend trt needs TensorRT and a GPU: {missing}; run it in our image on a machine with an NVIDIA GPU, "
                                    f"from this folder: {docker_command(arguments)}")
    feeds = make_inputs(loaded, seed=4, dims=dims)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmark", total=iterations * len(models))
        result = run_bench(models, backend.value, feeds, warmup, iterations,
                           on_step=lambda label, done, total: progress.update(task, description=f"{label} {done}/{total}", advance=1))
    write_json(target, result)
    plot(result, target.with_suffix(".png"))
    out = stdout_console()
    for label, row in result["models"].items():
        out.print(f"{label:>6}: p50 {row['p50_ms']:.3f} ms, p90 {row['p90_ms']:.3f}, p99 {row['p99_ms']:.3f}, mean {row['mean_ms']:.3f}, "
                  f"{row['throughput_per_s']:.1f}/s", highlight=False)
    out.print(f"wrote {target} and {target.with_suffix('.png')}", highlight=False)


def _runs(model: Path, feeds: dict) -> bool:
    from pipeline.core.verify import run_onnx

    try:
        run_onnx(model, feeds)
    except PipelineError:
        return False
    return True


def _bench_models(artifact: Path, backend: str) -> dict[str, Path]:
    """One model, or a build folder's FP32 / FP16 / INT8 models for this backend."""
    if artifact.is_file():
        return {artifact.stem: artifact}
    if not artifact.is_dir():
        raise PipelineError(f"{artifact}: no such model file or artifacts folder; pass a .onnx/.engine file or a build's output folder")
    names = {"fp32": "fp32.engine", "fp16": "fp16.engine", "int8": "int8.engine"} if backend == "trt" else {
        "fp32": "model.opt.onnx", "fp16": "model.fp16.onnx", "int8": "model.int8.onnx"}
    models = {label: artifact / name for label, name in names.items() if (artifact / name).is_file()}
    if not models:
        raise PipelineError(f"{artifact}: none of {', '.join(names.values())} here; run `python -m pipeline build` first")
    return models


class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    md = "md"
    html = "html"


class LayerInfoFormat(str, Enum):
    auto = "auto"
    json = "json"
    log = "log"
    polygraphy = "polygraphy"
    layer_json = "layer-json"


FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")]
OutputOption = Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here instead of stdout.")]
DepthOption = Annotated[int, typer.Option(min=1, max=12, help="Module scope depth of the rollup (2: encoder/layers.N).")]


def _emit(text: str, output: Optional[Path], is_json: bool = False) -> None:
    """Write a command's result to stdout or `output`; control characters from model or engine
    names are escaped (in JSON as \\u escapes, so it stays valid)."""
    text = printable_json(text) if is_json else printable(text)
    if output is None:
        sys.stdout.write(text)
        return
    from pipeline.core.fileio import write_text

    write_text(output, text)
    console.print(f"wrote {output}", highlight=False, markup=False)


AllOption = Annotated[bool, typer.Option("--all", help="Text output: list every row of the long tables (default: the first 200, then a count).")]
PrettyOption = Annotated[bool, typer.Option("--pretty", help="JSON output: indented (default: compact).")]


@app.command(
    help=(
        "Which ONNX nodes fused into which engine layers and regions (Myelin graphs in particular), rolled up to "
        "torch modules, with a one-sentence verdict. Reads any TensorRT layer information: inspector / trtexec "
        "--exportLayerInfo JSON (8.x, 10.x, 11.x; detailed or layer names only), one-line text (IEngineInspector "
        "ONELINE, trtexec --dumpLayerInfo), verbose builder logs (several builds: --build N), polygraphy inspect "
        "output, per-layer JSON objects. Needs no TensorRT.\n\n"
        "Examples:\n\n"
        "  python -m pipeline report fp16.layers.json --onnx model.onnx\n\n"
        "  python -m pipeline report build.log --build 1 --timing fp16.profile.json --format html -o report.html"
    )
)
def report(
    layer_info: Annotated[Path, typer.Argument(help="Layer information file (JSON, log, polygraphy output).")],
    onnx: Annotated[Optional[Path], typer.Option(help="The ONNX file the engine was built from: resolves names, module rollup, graph order in the map.")] = None,
    timing: Annotated[Optional[Path], typer.Option(help="Per-layer times: trtexec --exportProfile JSON.")] = None,
    fmt: FormatOption = OutputFormat.text,
    output: OutputOption = None,
    input_format: Annotated[LayerInfoFormat, typer.Option(help="Force the input format instead of detecting it.")] = LayerInfoFormat.auto,
    build: Annotated[Optional[int], typer.Option(min=1, help="A log holding several layer listings: read listing N [default: the last].")] = None,
    depth: DepthOption = 2,
    all_rows: AllOption = False,
    pretty: PrettyOption = False,
) -> None:
    from trt.render import render
    from trt.report import report_from_files

    data = report_from_files(layer_info, onnx, timing, input_format.value, depth, build)
    _emit(render(data, fmt.value, "report", all_rows=all_rows, pretty=pretty), output, is_json=fmt.value == "json")


@app.command(
    help=(
        "Compare two engines of one model (typically FP16 vs INT8) region by region (a region is a Myelin graph or a "
        "standalone layer): regions of A that B cuts into several, with the Q/DQ pairs at each cut, and the reverse; "
        "precision changes per region; per-module layer and time deltas.\n\n"
        "Examples:\n\n"
        "  python -m pipeline diff fp16.layers.json int8.layers.json --onnx-a model.fp16.onnx --onnx-b model.int8.onnx\n\n"
        "  python -m pipeline diff a.json b.json --timing-a a.profile.json --timing-b b.profile.json -f md -o diff.md"
    )
)
def diff(
    a: Annotated[Path, typer.Argument(help="Layer information of engine A (the reference, e.g. FP16).")],
    b: Annotated[Path, typer.Argument(help="Layer information of engine B (e.g. INT8).")],
    onnx_a: Annotated[Optional[Path], typer.Option(help="ONNX file engine A was built from.")] = None,
    onnx_b: Annotated[Optional[Path], typer.Option(help="ONNX file engine B was built from (finds the Q/DQ pair at each cut).")] = None,
    timing_a: Annotated[Optional[Path], typer.Option(help="trtexec --exportProfile JSON of A.")] = None,
    timing_b: Annotated[Optional[Path], typer.Option(help="trtexec --exportProfile JSON of B.")] = None,
    build_a: Annotated[Optional[int], typer.Option(min=1, help="A is a log with several layer listings: read listing N [default: the last].")] = None,
    build_b: Annotated[Optional[int], typer.Option(min=1, help="The same for B.")] = None,
    fmt: FormatOption = OutputFormat.text,
    output: OutputOption = None,
    depth: DepthOption = 2,
    all_rows: AllOption = False,
    pretty: PrettyOption = False,
) -> None:
    from trt.diff import diff_from_files
    from trt.render import render

    data = diff_from_files(a, b, onnx_a, onnx_b, timing_a, timing_b, depth, build_a, build_b)
    _emit(render(data, fmt.value, "diff", all_rows=all_rows, pretty=pretty), output, is_json=fmt.value == "json")


def main() -> None:
    """Entry point: every failure is one line on stderr and an exit code, unless --debug.

    0 ok; 1 a check failed or a bug (the line says which); 2 bad input or usage; 3 a capability
    is missing under --strict; 130 interrupted (Ctrl-C).
    """
    interrupts.install()
    try:
        code = app(standalone_mode=False)
        if interrupts.interrupted():  # typer turns a KeyboardInterrupt into a silent exit 130
            _error_line("interrupted")
            code = interrupts.EXIT_CODE
    except BaseException as err:  # noqa: BLE001 - each kind is described below, none escapes as a traceback
        if _debug and not isinstance(err, SystemExit):
            raise
        code = _report_failure(err)
    sys.exit(code or 0)


def _report_failure(err: BaseException) -> int:
    """Print one line for `err`; return the exit code."""
    if isinstance(err, SystemExit):
        return err.code if isinstance(err.code, int) else 1
    if interrupts.interrupted() or isinstance(err, (KeyboardInterrupt, typer.Abort)):
        _error_line("interrupted")
        return interrupts.EXIT_CODE
    if isinstance(err, PipelineError):
        _error_line(str(err))
        return err.exit_code
    if isinstance(err, typer.TyperException):  # usage: unknown option, missing argument, bad value
        context = getattr(err, "ctx", None)
        if type(err).__name__ == "NoArgsIsHelpError":
            sys.stdout.write(err.format_message() + "\n")
            return 0
        command = context.command_path if context is not None else "python -m pipeline"
        message = err.format_message().replace("Value error, ", "").rstrip(".")
        _error_line(f"{message} (see `{command} --help`)")
        return err.exit_code
    if isinstance(err, OSError):
        from pipeline.core.fileio import describe_os_error

        _error_line(describe_os_error(err))
        return 2
    if isinstance(err, MemoryError):
        _error_line("out of memory; use a smaller model, batch or sample count, or a machine with more memory")
        return 1
    _error_line(f"internal error (a bug in trt-pipeline): {type(err).__name__}: {_first_line(err)}; rerun with --debug and report the traceback")
    return 1


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "no message"


def _error_line(message: str) -> None:
    console.print(f"error: {printable(message)}", markup=False, highlight=False, soft_wrap=True)
