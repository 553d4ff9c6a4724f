"""Commands that check models: lint-qdq (Q/DQ placement), compare (where two models diverge), bench (latency)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.cli.app import ProfileOption, app, console, emit, stdout_console
from pipeline.core import DEFAULT_PROFILE
from pipeline.core.errors import PipelineError


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
        emit(json.dumps(findings_json(findings), indent=2) + "\n", output, is_json=True)
    else:
        lines = [f"{model}: {len(findings)} finding{'s' if len(findings) != 1 else ''}"]
        for finding in findings:
            lines += [f"[{finding.rule}] {finding.message}", f"    fix: {finding.suggestion}", f"    nodes: {', '.join(finding.nodes)}"]
        emit("\n".join(lines) + "\n", output)
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
        emit(json.dumps(result, indent=2) + "\n", output, is_json=True)
        return
    lines = [f"{candidate} vs {reference}: {result['compared_tensors']} tensors compared on {result['feeds']} inputs",
             "output error (max |b-a| / max |a|): " + ", ".join(f"{k} {v:.3g}" if v is not None else f"{k} -" for k, v in result["outputs"].items()),
             f"{'node (-> the Q/DQ on its output)':<48} {'op':<20} {'input err':>10} {'output err':>10} {'growth':>10}"]
    for row in result["nodes"][:top]:
        where = f"{row['node']} -> {row['qdq']}" if row["qdq"] else row["node"]
        lines.append(f"{where[:48]:<48} {row['op_type']:<20} {row['input_error']:>10.3g} {row['error']:>10.3g} {row['growth']:>10.3g}")
    emit("\n".join(lines) + "\n", output)


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
