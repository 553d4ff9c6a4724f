"""Fusion report on real TensorRT outputs (../shared/fixtures/trt) and the bert-tiny export."""

import json
from collections import Counter

import pytest
from conftest import REPO, run_cli

from trt.parsers import parse_timing
from trt.report import report_from_files

DESIGN_LAYER_KEYS = {"name", "type", "myelin", "myelin_graph", "onnx_nodes", "precision", "time_ms"}
DESIGN_SUMMARY_KEYS = {"layers", "myelin_layers", "myelin_graphs", "metadata_onnx_nodes", "resolved_onnx_nodes", "unresolved_onnx_nodes", "timed_layers", "total_time_ms"}


def test_bert_detailed_log_counts(trt_fixtures):
    report = report_from_files(trt_fixtures / "bert-fp16-trt10.10.detailed.log")
    s = report["summary"]
    assert (s["layers"], s["myelin_layers"], s["myelin_graphs"], s["metadata_onnx_nodes"]) == (89, 88, 1, 334)
    assert s["resolved_onnx_nodes"] is None
    assert report["breakdown"]["myelin_kernels_per_graph"] == {"0": 88}
    assert {"source", "layers", "summary"} <= report.keys()
    assert DESIGN_SUMMARY_KEYS <= s.keys() and all(DESIGN_LAYER_KEYS <= layer.keys() for layer in report["layers"])
    attention = next(layer for layer in report["layers"] if layer["name"] == "_gemm_mha_v2_myl0_3")
    assert set(attention["onnx_nodes"]) == {
        "/encoder/layers.0/mha/attn/MatMul", "/encoder/layers.0/mha/attn/mha_prob/Softmax", "/encoder/layers.0/mha/attn/mha_prob/Add",
        "/encoder/layers.0/mha/attn/mha_prob/Div", "/encoder/layers.0/mha/attn/mha_prob/MatMul",
    }


def test_bert_detailed_log_resolves_in_torchscript_export_and_rolls_up_modules(trt_fixtures, bert_tiny_torchscript):
    report = report_from_files(trt_fixtures / "bert-fp16-trt10.10.detailed.log", onnx=bert_tiny_torchscript)
    s = report["summary"]
    assert s["resolved_onnx_nodes"] / s["metadata_onnx_nodes"] >= 0.95
    modules = {m["module"]: m for m in report["modules"]}
    encoder_layers = [f"encoder/layers.{i}" for i in range(12)]
    assert all(name in modules for name in encoder_layers)
    # every encoder layer runs as Myelin kernels of graph 0: QKV gemm, attention, out-proj, LN, FFN fusion, FFN out, LN
    assert [modules[name]["myelin_kernels"] for name in encoder_layers] == [7] * 12
    assert report["coverage"]["not_in_layers"]["compute"]["count"] == 0


def test_bert_names_only_log_says_how_to_get_the_mapping(trt_fixtures):
    report = report_from_files(trt_fixtures / "bert-fp16-trt10.10.layer_names_only.log")
    s = report["summary"]
    assert (s["layers"], s["myelin_layers"], s["myelin_graphs"]) == (2, 1, 1)
    foreign = report["layers"][0]
    assert foreign["name"].startswith("{ForeignNode[") and foreign["type"] == "Myelin"
    finding = report["findings"][0]
    assert "LAYER_NAMES_ONLY" in finding and "--verbosity detailed" in finding and "--profilingVerbosity=detailed" in finding


def test_names_only_range_resolves_over_the_onnx_order(trt_fixtures, bert_tiny_torchscript):
    report = report_from_files(trt_fixtures / "bert-fp16-trt10.10.layer_names_only.log", onnx=bert_tiny_torchscript)
    foreign = report["layers"][0]
    assert foreign["mapping"] == "range"
    assert "/match_model/Squeeze" in foreign["onnx_nodes"] and "/encoder/layers.5/mha/attn/MatMul" in foreign["onnx_nodes"]
    assert any("/encoder/Unsqueeze_3" in f and "boundary" in f for f in report["findings"])


def test_trt10_json_with_myelin_kernels(trt_fixtures):
    path = trt_fixtures / "trt10.16_detailed_mnist_myelin.layers.json"
    raw = json.loads(path.read_text())["Layers"]
    report = report_from_files(path)
    s = report["summary"]
    assert "TensorRT 10.x" in report["source"]["format"]
    assert s["layers"] == len(raw) == 9
    assert s["myelin_layers"] == sum("_myl" in layer["Name"] for layer in raw) == 5
    assert s["myelin_graphs"] == 1 and report["breakdown"]["myelin_kernels_per_graph"] == {"4": 5}
    assert report["breakdown"]["layer_types"] == dict(Counter(layer["LayerType"] for layer in raw).most_common())
    softmax = [layer for layer in report["layers"] if "node_softmax" in layer["onnx_nodes"]]
    assert [layer["name"] for layer in softmax] == ["__myl_AddMaxrSubExpSum_myl4_2", "__myl_DivMulMaxr_myl4_3"]


def test_trt8_names_only_yolo_with_profile(trt_fixtures):
    layers = trt_fixtures / "trt852_namesonly_yolo_qdq_int8.layers.json"
    profile = trt_fixtures / "trt852_namesonly_yolo_qdq_int8.profile.json"
    report = report_from_files(layers, timing=profile)
    s = report["summary"]
    records = [r for r in json.loads(profile.read_text()) if "name" in r]
    assert s["layers"] == len(json.loads(layers.read_text())["Layers"]) == 86
    assert (s["myelin_layers"], s["myelin_graphs"]) == (2, 2)
    assert s["timed_layers"] == 86 and s["total_time_ms"] == pytest.approx(sum(r["averageMs"] for r in records))
    conv = next(layer for layer in report["layers"] if layer["name"].startswith("backbone.conv1.weight + "))
    assert conv["onnx_nodes"] == ["/backbone/conv1/_weight_quantizer/QuantizeLinear", "/backbone/conv1/Conv"]
    assert conv["mapping"] == "name"


def test_trt8_detailed_resnet_qdq_reformats(trt_fixtures):
    path = trt_fixtures / "trex_resnet18_A100_qat_int8.graph.json"
    raw = json.loads(path.read_text())["Layers"]
    report = report_from_files(path)
    assert "TensorRT 8.x" in report["source"]["format"]
    assert report["breakdown"]["qdq_layers"] == [layer["Name"] for layer in raw if layer.get("Origin") == "QDQ"]
    assert report["breakdown"]["precisions"]["INT8"] >= 20
    assert any("approximated from layer names" in f for f in report["findings"])


def test_trt11_schema_from_the_migration_page_example():
    report = report_from_files(REPO / "tests" / "data" / "trt11_from_migration_doc_example.layers.json")
    assert "TensorRT 11.x" in report["source"]["format"]
    assert report["source"]["io_tensors"] == ["input_0", "output_0"]
    assert [layer["precision"] for layer in report["layers"]] == ["FP32", "FP32"]
    assert report["layers"][1]["onnx_nodes"] == ["/pool/GlobalAveragePool", "/flatten/Flatten", "/fc/Gemm"]


def test_profile_names_are_read_verbatim_when_not_valid_json(tmp_path, trt_fixtures):
    """trtexec writes names without escaping: a quote or backslash in a name makes the file invalid JSON."""
    text = (trt_fixtures / "trt852_namesonly_yolo_qdq_int8.profile.json").read_text()
    broken = text.replace('"/neck/Resize"', '"/neck/Resize "quoted" \\ back"', 1)
    assert broken != text
    path = tmp_path / "profile.json"
    path.write_text(broken)
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken)
    names = [r.name for r in parse_timing(path)]
    assert '/neck/Resize "quoted" \\ back' in names and len(names) == 86


def test_profile_suffix_names_are_merged(tmp_path, trt_fixtures):
    """Layers of a second optimization profile carry ` [profile 1]`; their times merge by that name."""
    data = json.loads((trt_fixtures / "trt10.16_detailed_mnist_myelin.layers.json").read_text())
    data["Layers"] += [{**layer, "Name": layer["Name"] + " [profile 1]"} for layer in data["Layers"]]
    layers = tmp_path / "two_profiles.layers.json"
    layers.write_text(json.dumps(data))
    timing = tmp_path / "p.json"
    timing.write_text(json.dumps([{"count": 3}, {"name": "node_max_pool2d [profile 1]", "timeMs": 3.0, "averageMs": 1.0, "medianMs": 1.0, "percentage": 50.0}]))
    report = report_from_files(layers, timing=timing)
    timed = [layer for layer in report["layers"] if layer["time_ms"] is not None]
    assert [(layer["name"], layer["profile"], layer["time_ms"]) for layer in timed] == [("node_max_pool2d [profile 1]", 1, 1.0)]


def test_report_cli_formats(tmp_path, trt_fixtures):
    log = str(trt_fixtures / "bert-fp16-trt10.10.detailed.log")
    text = run_cli("report", log)
    assert text.returncode == 0 and "Engine summary" in text.stdout and "_gemm_mha_v2_myl0_3" in text.stdout
    as_json = json.loads(run_cli("report", log, "--format", "json").stdout)
    assert as_json["summary"]["layers"] == 89
    md = run_cli("report", log, "-f", "md", "-o", str(tmp_path / "r.md"))
    assert md.returncode == 0 and "| encoder |" in (tmp_path / "r.md").read_text().replace("\\", "")
    html = run_cli("report", log, "-f", "html", "-o", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert html.returncode == 0 and page.startswith("<!doctype html>") and "_gemm_mha_v2_myl0_3" in page
    assert "src=" not in page and "href=" not in page, "the HTML must be self-contained"


def test_html_escapes_model_supplied_names(tmp_path):
    """Layer and node names come from untrusted models."""
    evil = '<script>alert("x")</script>'
    data = {"Layers": [{"Name": evil, "LayerType": "kgen", "Inputs": [], "Outputs": [], "Metadata": f"[ONNX Layer: {evil}]"}]}
    path = tmp_path / "evil.layers.json"
    path.write_text(json.dumps(data))
    for fmt, escaped in (("html", "&lt;script&gt;"), ("md", "\\<script\\>")):
        result = run_cli("report", str(path), "-f", fmt)
        assert result.returncode == 0 and escaped in result.stdout and "<script>alert" not in result.stdout


def test_report_imports_neither_torch_nor_onnxruntime_nor_tensorrt(trt_fixtures):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pipeline", "report", str(trt_fixtures / "bert-fp16-trt10.10.detailed.log"), "-f", "json"],
        cwd=REPO, capture_output=True, text=True,
    )
    assert result.returncode == 0
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "trt" in imported and not imported & {"torch", "onnxruntime", "tensorrt", "onnx", "modelopt"}
