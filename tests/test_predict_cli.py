"""`python -m pipeline predict` as a user runs it: the answer in the first line, the report's formats with
`predicted: true` and the reasons in JSON, a prediction read back by `report` and compared by `diff`
with the real engine; the lint's findings are the prediction's reasons; what the report stage and `jobs
gather` record of a prediction against a built engine (real layer files standing in for a build)."""

import json
import sys

import onnx
from conftest import REPO, TRT_DATA, run_cli
from predict_graphs import Graph, image

from pipeline.core.qdq import CNN_RULES
from quant.lint import lint_model
from trt.predict import predict

BERT_LOG = TRT_DATA / "bert-fp16-trt10.10.detailed.log"


def resnet(variant: str):
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from predict_corpus import resnet18
    finally:
        sys.path.remove(str(REPO / "bench"))
    return resnet18(variant)


def test_predict_answers_in_the_first_line_and_writes_the_reports_formats(tmp_path):
    path = tmp_path / "qat.onnx"
    onnx.save(resnet("qat"), path)
    text = run_cli("predict", str(path), "--trt", "8", "--precision", "best")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0] == ("predicted INT8 engine: the network runs as 33 layers, none of them in Myelin, 10 of them standalone "
                                           "Q/DQ layers (plus 1 reformat/copy layer)")
    assert "residual-skip-not-quantized" in text.stdout and "quantize the residual Add's skip input" in text.stdout
    result = run_cli("predict", str(path), "--trt", "8", "--precision", "best", "-f", "json", "-o", str(tmp_path / "p.json"))
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["predicted"] is True and data["target"]["trt_major"] == 8 and len(data["breakdown"]["qdq_layers"]) == 10
    assert {"summary", "breakdown", "regions", "layers", "verdict"} <= data.keys()
    standalone = [r for r in data["reasons"] if r["kind"] == "standalone"]
    assert len(standalone) == 10 and all(r["rule"] and r["node"] and r["fix"] and r["source"] for r in standalone)
    for fmt in ("md", "html"):
        assert run_cli("predict", str(path), "-f", fmt, "-o", str(tmp_path / f"p.{fmt}")).returncode == 0


def test_a_prediction_reads_back_into_report_and_diffs_against_the_real_engine(tmp_path, bert_tiny_torchscript):
    predicted = tmp_path / "bert.predicted.json"
    assert run_cli("predict", str(bert_tiny_torchscript), "--precision", "fp16", "-f", "json", "-o", str(predicted)).returncode == 0
    report = run_cli("report", str(predicted))
    assert report.returncode == 0 and report.stdout.startswith("FP16 engine: the whole network runs as 1 Myelin region of 88 kernels")
    assert "a prediction from the ONNX alone" in report.stdout
    diff = run_cli("diff", str(predicted), str(BERT_LOG), "-f", "json")
    assert diff.returncode == 0, diff.stderr
    data = json.loads(diff.stdout)
    assert data["join"] == "onnx-names" and not data["splits"] and not data["merges"]
    assert data["verdict"] == "B (FP16) runs A (FP16)'s regions unchanged (layer count 89 -> 89)"


def test_diff_shows_where_a_prediction_was_wrong_region_by_region(tmp_path, bert_tiny_torchscript):
    """Predicted for TensorRT 8.x (one ForeignNode layer), the same network against the real 10.x engine: same region."""
    predicted = tmp_path / "bert8.json"
    assert run_cli("predict", str(bert_tiny_torchscript), "--precision", "fp16", "--trt", "8", "-f", "json", "-o", str(predicted)).returncode == 0
    data = json.loads(run_cli("diff", str(predicted), str(BERT_LOG), "-f", "json").stdout)
    assert data["totals"]["layers"] == {"a": 2, "b": 89, "delta": 87} and data["totals"]["myelin_graphs"]["delta"] == 0
    assert [row["status"] for row in data["regions"]] == ["same"]


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "bad.onnx").write_text("not a model")
    result = run_cli("predict", str(tmp_path / "bad.onnx"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "not an ONNX model" in result.stderr
    usage = run_cli("predict", str(tmp_path / "bad.onnx"), "--trt", "9")
    assert usage.returncode == 2 and "Invalid value for '--trt'" in usage.stderr
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"predicted": True, "layers": "none"}))
    read = run_cli("report", str(broken))
    assert read.returncode == 2 and "no 'layers' list" in read.stderr and "Traceback" not in read.stderr


def test_every_lint_finding_is_a_reason_of_the_prediction():
    """A lint finding is a standalone Q/DQ, a cut region or a layer left in float in the prediction, by the same rule
    on one of the finding's nodes (ResNet-18 QAT placements of the TREx recipe; a Conv with a dequantized weight only)."""
    g = Graph()
    g.model_out = g.conv(image(g), "weight_only", quantized=True)
    for model in (resnet("qat"), resnet("qat-residual"), resnet("qat-residual-qgap"), g.model(g.model_out)):
        findings = lint_model(model, rules=CNN_RULES)
        reasons = {(r.rule, r.node) for r in predict(model, CNN_RULES, "best", 8).reasons}
        assert all(any((f.rule, node) in reasons for node in f.nodes) for f in findings), [f for f in findings]
    assert lint_model(resnet("qat"), rules=CNN_RULES)  # not vacuous: the QAT placement has findings


def test_the_report_stage_and_jobs_gather_score_a_prediction_against_a_built_engine(tmp_path, bert_tiny_torchscript):
    from pipeline import precisions
    from pipeline.artifacts import Built
    from pipeline.jobs.cell import _engine
    from pipeline.jobs.gather import _row, render_md
    from pipeline.stages.report import prediction_score
    from trt.parsers import parse_layer_info

    recorded = prediction_score(bert_tiny_torchscript, parse_layer_info(BERT_LOG))
    assert recorded["meets"] == {"standalone_qdq": True, "myelin_regions": True, "layers": True, "layers_without_copies": True, "grouping": True}
    engine = tmp_path / "fp16.engine"
    engine.write_bytes(b"an engine file the build wrote")
    built = Built(precisions.by_name("fp16"), bert_tiny_torchscript, engine, BERT_LOG, None)
    record = {"id": "c1", "label": "bert-tiny fp16", "status": "done", "index": 0, "engine": _engine(tmp_path, built), "latency": {"p50_ms": 1.0},
              "definition": {"gpu": "A100", "model": "bert-tiny", "precision": "fp16", "backend": "trt", "shape": {}, "builder": {}}}
    row = _row(record)
    # predicted strongly typed, as the pipeline builds: this FP32 file's engine has no output reformat (the log's was built with --fp16)
    assert (row["regions"], row["layers"], row["predicted_regions"], row["predicted_layers"], row["prediction_f1"]) == (1, 89, 1, 88, 1.0)
    table = render_md({"counts": {"done": 1, "failed": 0, "skipped": 0}, "cells": [row], "speedups": [], "not_run": []})
    assert "| 1 | 1 / 88 |" in table
