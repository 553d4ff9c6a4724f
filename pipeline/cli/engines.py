"""Commands on what a build made: report (one engine), diff (two engines, region by region), bench (latency)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline import precisions
from pipeline.cli.app import app, choices, console, emit, output_format, stdout_console
from pipeline.core import DEFAULT_PROFILE
from pipeline.core.errors import PipelineError
from trt.render import FORMATS

OutputFormat = choices("OutputFormat", FORMATS)
LayerInfoFormat = choices("LayerInfoFormat", ("auto", "json", "log", "polygraphy", "layer-json"))
PrecisionName = choices("PrecisionName", precisions.names())

FormatOption = Annotated[Optional[OutputFormat], typer.Option("--format", "-f", help="Output format [default: from -o's suffix, else text].")]
OutputOption = Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here instead of stdout.")]
DepthOption = Annotated[int, typer.Option(min=1, max=12, help="Module scope depth of the rollup (2: encoder/layers.N).")]

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
    fmt: FormatOption = None,
    output: OutputOption = None,
    input_format: Annotated[LayerInfoFormat, typer.Option(help="Force the input format instead of detecting it.")] = LayerInfoFormat.auto,
    build: Annotated[Optional[int], typer.Option(min=1, help="A log holding several layer listings: read listing N [default: the last].")] = None,
    depth: DepthOption = 2,
    all_rows: AllOption = False,
    pretty: PrettyOption = False,
) -> None:
    from trt.render import render
    from trt.report import report_from_files

    kind = output_format(fmt.value if fmt else None, output, FORMATS, inputs=[layer_info, onnx, timing])
    data = report_from_files(layer_info, onnx, timing, input_format.value, depth, build)
    emit(render(data, kind, all_rows=all_rows, pretty=pretty), output, is_json=kind == "json")


@app.command(
    help=(
        "Compare two engines of one model (typically FP16 vs INT8) region by region (a region is a Myelin graph or a "
        "standalone layer): regions of A that B cuts into several, with the Q/DQ pairs at each cut, and the reverse; "
        "precision changes per region; per-module layer and time deltas. A and B are layer information files, or A is "
        "a build's output folder and --a/--b name two of its engines.\n\n"
        "Examples:\n\n"
        "  python -m pipeline diff fp16.layers.json int8.layers.json --onnx-a model.fp16.onnx --onnx-b model.int8.onnx\n\n"
        "  python -m pipeline diff artifacts/my-model --a fp16 --b fp8 -f html -o diff.html\n\n"
        "  python -m pipeline diff a.json b.json --timing-a a.profile.json --timing-b b.profile.json -f md -o diff.md"
    )
)
def diff(
    a: Annotated[Path, typer.Argument(exists=True, help="Layer information of engine A (the reference, e.g. FP16), or a build's output folder.")],
    b: Annotated[Optional[Path], typer.Argument(exists=True, help="Layer information of engine B (e.g. INT8); none when A is a build folder.")] = None,
    a_precision: Annotated[Optional[PrecisionName], typer.Option("--a", help="A build folder's engine A [default: fp16 if built, else fp32].")] = None,
    b_precision: Annotated[Optional[PrecisionName], typer.Option("--b", help="A build folder's engine B [default: its first quantized engine].")] = None,
    onnx_a: Annotated[Optional[Path], typer.Option(help="ONNX file engine A was built from.")] = None,
    onnx_b: Annotated[Optional[Path], typer.Option(help="ONNX file engine B was built from (finds the Q/DQ pair at each cut).")] = None,
    timing_a: Annotated[Optional[Path], typer.Option(help="trtexec --exportProfile JSON of A.")] = None,
    timing_b: Annotated[Optional[Path], typer.Option(help="trtexec --exportProfile JSON of B.")] = None,
    build_a: Annotated[Optional[int], typer.Option(min=1, help="A is a log with several layer listings: read listing N [default: the last].")] = None,
    build_b: Annotated[Optional[int], typer.Option(min=1, help="The same for B.")] = None,
    fmt: FormatOption = None,
    output: OutputOption = None,
    depth: DepthOption = 2,
    all_rows: AllOption = False,
    pretty: PrettyOption = False,
) -> None:
    from trt.diff import diff_from_files
    from trt.render import render

    if a.is_dir():
        if b is not None or onnx_a or onnx_b or timing_a or timing_b:
            raise PipelineError(f"diff {a}: a build folder gives both engines and their files; choose them with --a and --b, not {b or 'the file options'}")
        engine_a, engine_b = _engines_of_build(a, a_precision and a_precision.value, b_precision and b_precision.value)
        a, onnx_a, timing_a = engine_a.layers, engine_a.onnx, engine_a.profile
        b, onnx_b, timing_b = engine_b.layers, engine_b.onnx, engine_b.profile
    elif b is None or a_precision or b_precision:
        raise PipelineError("diff: give two layer information files (A B), or a build's output folder with --a and --b")
    kind = output_format(fmt.value if fmt else None, output, FORMATS, inputs=[a, b, onnx_a, onnx_b, timing_a, timing_b])
    data = diff_from_files(a, b, onnx_a, onnx_b, timing_a, timing_b, depth, build_a, build_b)
    emit(render(data, kind, all_rows=all_rows, pretty=pretty), output, is_json=kind == "json")


def _engines_of_build(folder: Path, a: Optional[str], b: Optional[str]):
    """The two engines of a build folder `diff` compares: those named, else the float reference and the first quantized one."""
    from pipeline.artifacts import read_build

    engines = {name: built for name, built in read_build(folder)[1].items() if built.layers is not None}
    if len(engines) < 2:
        raise PipelineError(f"{folder}: {len(engines)} engine(s) with layer information ({', '.join(engines) or 'none'}); diff needs two: "
                            "build them on a machine with TensorRT (python -m pipeline build ... --strict)")
    a = a or ("fp16" if "fp16" in engines else next(iter(engines)))
    b = b or next((name for name, built in engines.items() if built.precision.quantized and name != a), None)
    for flag, name in (("--a", a), ("--b", b)):
        if name not in engines:
            raise PipelineError(f"{flag} {name}: {folder} has no such engine; its engines: {', '.join(engines)}")
    return engines[a], engines[b]


Backend = choices("Backend", ("trt", "ort-cuda", "ort-cpu"))


@app.command(
    help=(
        "Latency (p50/p90/p99, mean) and throughput of a model, or of every precision of a build side by side "
        "when ARTIFACT is its output folder. trt: engines, CUDA events; ort-cuda / ort-cpu: ONNX files on "
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
    profile: Annotated[Optional[str], typer.Option("--profile", "-p", help="Profile of the models' inputs [default: the one the build's manifest records (ARTIFACT's folder), else bert-tiny].")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Results JSON [default: <folder>/bench.<backend>.json]; the PNG goes beside it.")] = None,
) -> None:
    from rich.progress import Progress

    from pipeline.artifacts import as_built, recorded_profile
    from pipeline.core import seeds
    from pipeline.core.fileio import check_outputs, write_json
    from pipeline.core.profiles import load_profile
    from pipeline.core.samples import make_inputs
    from trt.bench import bench as run_bench
    from trt.bench import plot

    loaded = as_built(load_profile(profile or recorded_profile(artifact) or DEFAULT_PROFILE), artifact)
    if backend is Backend.trt:  # before looking for engines: a CPU build has none, and the answer is where to run it
        from pipeline.core.errors import CapabilityMissing
        from trt.capability import docker_command, needs_tensorrt, profile_argument, tensorrt_missing

        missing = tensorrt_missing()
        if missing:
            arguments = ["bench", artifact, "--backend", "trt", "--warmup", str(warmup), "--iterations", str(iterations), "--profile", profile_argument(loaded)]
            arguments += (["--batch", str(batch)] if batch else []) + (["-o", output] if output else [])
            raise CapabilityMissing(needs_tensorrt("bench --backend trt", missing, docker_command(arguments)))
    models = _bench_models(artifact, backend.value)
    target = output or (artifact if artifact.is_dir() else artifact.parent) / f"bench.{backend.value}.json"
    check_outputs([target, target.with_suffix(".png")], list(models.values()))
    dims = {}
    if batch is not None:
        if "batch" not in loaded.dims or not loaded.dims["batch"].min <= batch <= loaded.dims["batch"].max:
            raise PipelineError(f"--batch {batch}: profile {loaded.name} has no dynamic 'batch' dim allowing it; its inputs are {[list(loaded.shape(i)) for i in loaded.inputs]}")
        dims["batch"] = batch
    feeds = make_inputs(loaded, seed=seeds.BENCH, dims=dims)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("benchmark", total=iterations * len(models))
        result = run_bench(models, backend.value, feeds, warmup, iterations, skip_unsupported=artifact.is_dir(),
                           on_step=lambda label, done, total: progress.update(task, description=f"{label} {done}/{total}", advance=1))
    write_json(target, result)
    plot(result, target.with_suffix(".png"))
    out = stdout_console()
    out.print(f"{backend.value}, batch {result['batch']} ({', '.join(f'{k} {v}' for k, v in result['input_shapes'].items())}), "
              f"{result['timing']}, {iterations} timed runs after {warmup} untimed", highlight=False, markup=False)
    for label, row in result["models"].items():
        out.print(f"{label:>6}: p50 {row['p50_ms']:.3f} ms, p90 {row['p90_ms']:.3f}, p99 {row['p99_ms']:.3f}, mean {row['mean_ms']:.3f}, "
                  f"{row['throughput_per_s']:.1f}/s", highlight=False, markup=False)
    for label, why in result.get("not_timed", {}).items():
        out.print(f"{label:>6}: not timed: {why}", highlight=False, markup=False)
    out.print(f"wrote {target} and {target.with_suffix('.png')}", highlight=False, markup=False)


def _bench_models(artifact: Path, backend: str) -> dict[str, Path]:
    """One model, or every precision a build folder holds for this backend (its engines, or its ONNX models)."""
    if artifact.is_file():
        return {artifact.stem: artifact}
    if not artifact.is_dir():
        raise PipelineError(f"{artifact}: no such model file or artifacts folder; pass a .onnx/.engine file or a build's output folder")
    from pipeline.artifacts import read_build

    built = read_build(artifact)[1].values()
    models = {b.precision.name: path for b in built if (path := b.engine if backend == "trt" else b.onnx) is not None}
    if not models:
        what = "engines" if backend == "trt" else "models"
        raise PipelineError(f"{artifact}: its build recorded no usable {what}; run `python -m pipeline build` (with --strict where TensorRT is) first")
    return models
