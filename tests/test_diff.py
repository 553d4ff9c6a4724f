"""Engine diff on real TensorRT outputs."""

import json

from conftest import run_cli

from trt.diff import diff_from_files
from trt.parsers import parse_layer_info


def test_resnet_fp16_vs_qat_int8_falls_back_to_scope_and_alignment(trt_fixtures):
    a, b = trt_fixtures / "trex_resnet18_A100_fp16.graph.json", trt_fixtures / "trex_resnet18_A100_qat_int8.graph.json"
    diff = diff_from_files(a, b)
    assert diff["join"] == "module-scope" and diff["shared_node_names"]["common"] == 0
    assert "name their ONNX nodes differently" in diff["findings"][0]
    raw_b = json.loads(b.read_text())["Layers"]
    assert diff["qdq_layers"]["b"] == [layer["Name"] for layer in raw_b if layer.get("Origin") == "QDQ"]
    assert diff["totals"]["layers"] == {"a": 36, "b": 37, "delta": 1}
    pairs = [(r["a"], r["b"]) for r in diff["aligned_layers"]]
    assert ("Conv_5 + Add_6 + Relu_7", "layer1.0.conv2.weight + QuantizeLinear_32 + Conv_34 + Add_36 + Relu_37") in pairs
    convs = [r for r in diff["aligned_layers"] if r["type_a"] == r["type_b"] == "CaskConvolution"]
    assert len(convs) >= 19 and sum(r["precision_a"] == "FP16" and r["precision_b"] == "INT8" for r in convs) >= 19


def test_region_split_into_kernels_is_found_by_node_names(trt_fixtures, bert_tiny_torchscript):
    """The same BERT engine seen as one ForeignNode (names only) and as 88 Myelin kernels (detailed):
    the diff must find that A's one fused layer is spread over B's kernels."""
    names_only, detailed = trt_fixtures / "bert-fp16-trt10.10.layer_names_only.log", trt_fixtures / "bert-fp16-trt10.10.detailed.log"
    diff = diff_from_files(names_only, detailed, onnx_a=bert_tiny_torchscript, onnx_b=bert_tiny_torchscript)
    assert diff["join"] == "onnx-names"
    (split,) = diff["splits"]
    kernels = [layer.name for layer in parse_layer_info(detailed).layers if layer.myelin]
    assert split["a_layer"].startswith("{ForeignNode[") and [b["name"] for b in split["b_layers"]] == kernels
    assert sum(len(b["nodes"]) for b in split["b_layers"]) == split["nodes"]
    assert split["qdq_at_cut"] == []  # an FP16 graph has no Q/DQ


def test_identical_engines_have_no_splits_and_zero_deltas(trt_fixtures):
    log = trt_fixtures / "bert-fp16-trt10.10.detailed.log"
    diff = diff_from_files(log, log)
    assert diff["join"] == "onnx-names" and diff["splits"] == []
    assert all(v["delta"] in (0, None) for k, v in diff["totals"].items() if k != "precisions")


def test_diff_cli(tmp_path, trt_fixtures):
    a, b = trt_fixtures / "trex_resnet18_A100_fp16.graph.json", trt_fixtures / "trex_resnet18_A100_qat_int8.graph.json"
    text = run_cli("diff", str(a), str(b))
    assert text.returncode == 0 and "scope fallback" in text.stdout and "QuantizeLinear_2" in text.stdout
    html = run_cli("diff", str(a), str(b), "-f", "html", "-o", str(tmp_path / "d.html"))
    assert html.returncode == 0 and "aligned by order and type" in (tmp_path / "d.html").read_text()
