"""`python -m pipeline predict`: the engine TensorRT will build from an ONNX model, before any build."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.cli.app import app, choices, emit
from pipeline.cli.engines import AllOption, FormatOption, OutputFormat, OutputOption, PrettyOption

PredictPrecision = choices("PredictPrecision", ("auto", "fp32", "fp16", "int8", "fp8", "best"))
TrtVersion = choices("TrtVersion", ("8", "10", "11"))


@app.command(
    help=(
        "Predict the engine TensorRT will build from an ONNX model, without TensorRT or a GPU: its layers with the ONNX "
        "nodes each holds (a convolution or GEMM with what fuses into it, a Myelin region and its kernels, a standalone "
        "Q/DQ layer), and for every standalone Q/DQ and Myelin region boundary the rule and the node behind it and what "
        "to change. Every output format is the report's (`report` reads the JSON back, `diff` compares it with a real "
        "engine); the first line is the verdict. The rules are TensorRT's documented ones, shared with lint-qdq "
        "(docs/predict.md).\n\n"
        "Examples:\n\n"
        "  python -m pipeline predict artifacts/bert-tiny/model.int8.onnx\n\n"
        "  python -m pipeline predict model.onnx --precision fp16 --trt 8 --format html -o predicted.html\n\n"
        "  python -m pipeline predict model.int8.onnx -f json -o predicted.json && python -m pipeline diff predicted.json int8.layers.json"
    )
)
def predict(
    model: Annotated[Path, typer.Argument(help="The ONNX model TensorRT would build.")],
    precision: Annotated[PredictPrecision, typer.Option(help="auto: the ONNX's own types (a strongly typed build, as the pipeline "
                                                             "builds); else the builder flag (fp16, best: FP16 where it is faster).")] = PredictPrecision.auto,
    trt: Annotated[TrtVersion, typer.Option("--trt", help="TensorRT major version: 8 lists a Myelin region as one layer, 10 and 11 as its kernels.")] = TrtVersion("10"),
    max_sequence: Annotated[Optional[int], typer.Option(min=1, help="Longest sequence the engine will see (fused INT8 attention needs <= 512).")] = None,
    fmt: FormatOption = OutputFormat.text,
    output: OutputOption = None,
    all_rows: AllOption = False,
    pretty: PrettyOption = False,
) -> None:
    from pipeline.core.fileio import check_outputs
    from pipeline.core.onnxfile import load_onnx
    from quant.lint import family_rules
    from trt.predict import predict as predicted_engine
    from trt.render import render

    check_outputs([output], [model])
    loaded = load_onnx(model, weights=True)
    prediction = predicted_engine(loaded, family_rules(loaded), precision.value, int(trt.value), max_sequence, str(model))
    emit(render(prediction, fmt.value, all_rows=all_rows, pretty=pretty), output, is_json=fmt.value == "json")
