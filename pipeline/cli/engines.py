"""Commands that read what TensorRT wrote: report (one engine) and diff (two engines, region by region)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.cli.app import app, emit


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
    emit(render(data, fmt.value, "report", all_rows=all_rows, pretty=pretty), output, is_json=fmt.value == "json")


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
    emit(render(data, fmt.value, "diff", all_rows=all_rows, pretty=pretty), output, is_json=fmt.value == "json")
