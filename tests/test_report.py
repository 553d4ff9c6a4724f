"""Fusion report on real TensorRT outputs (tests/data/trt) and the bert-tiny export: verdict, regions,
findings, the DESIGN.md keys, the CLI."""

import json
import re

import pytest
from conftest import REPO, TRT_DATA, mnist_with_a_layer_named, run_cli
from trt_facts import ONNX_ENTRY, kernel_graph, oneline_records

from trt.report import report_from_files

DESIGN_LAYER_KEYS = {"name", "type", "myelin", "myelin_graph", "onnx_nodes", "precision", "time_ms"}
DESIGN_SUMMARY_KEYS = {"layers", "myelin_layers", "myelin_graphs", "metadata_onnx_nodes", "resolved_onnx_nodes", "unresolved_onnx_nodes", "timed_layers", "total_time_ms"}
LAYER_FILES = sorted(p.name for p in TRT_DATA.iterdir() if p.suffix in (".json", ".log") and not p.name.endswith(".profile.json"))


@pytest.mark.parametrize("name", LAYER_FILES)
def test_every_real_file_reports_with_the_design_keys(trt_fixtures, name):
    report = report_from_files(trt_fixtures / name).to_json()
    assert {"source", "layers", "summary"} <= report.keys()
    assert DESIGN_SUMMARY_KEYS <= report["summary"].keys() and all(DESIGN_LAYER_KEYS <= layer.keys() for layer in report["layers"])
    assert report["verdict"].split(": ", 1)[0] in ("FP32 engine", "FP16 engine", "INT8 engine")
    layer_regions = sorted(i for region in report["regions"] for i in region["layers"])
    assert layer_regions == list(range(len(report["layers"]))), "every layer is in exactly one region"


def test_bert_fp16_runs_as_one_myelin_region(trt_fixtures):
    path = trt_fixtures / "bert-fp16-trt10.10.detailed.log"
    records = oneline_records(path)
    kernels = sum(kernel_graph(r["name"]) is not None for r in records)
    report = report_from_files(path)
    s = report.summary
    assert (s.layers, s.myelin_layers, s.myelin_graphs) == (len(records), kernels, 1)
    assert s.metadata_onnx_nodes == len({n for r in records for n in ONNX_ENTRY.findall(r["metadata"] or "")})
    copies = len(records) - kernels
    assert report.verdict == f"FP16 engine: the whole network runs as 1 Myelin region of {kernels} kernels (plus {copies} reformat/copy layer)"
    assert not any("Q/DQ" in f for f in report.findings), "an FP16 engine gets no Q/DQ advice"


def test_a_names_only_myelin_region_is_not_called_tensorrt_8(trt_fixtures):
    """TensorRT 10 lists a Myelin region as one ForeignNode layer too when only names were recorded:
    the verdict says what the listing shows, not a version it guessed."""
    verdict = report_from_files(trt_fixtures / "bert-fp16-trt10.10.layer_names_only.log").verdict
    assert verdict.startswith("FP16 engine: the whole network runs as 1 Myelin region (plus 1 reformat/copy layer); its Myelin region is listed as one ForeignNode layer, not its kernels")
    assert "TensorRT 8.x lists" not in verdict


def test_bert_resolves_in_the_torchscript_export_and_rolls_up_modules(trt_fixtures, bert_tiny_torchscript):
    report = report_from_files(trt_fixtures / "bert-fp16-trt10.10.detailed.log", onnx=bert_tiny_torchscript)
    s = report.summary
    assert s.resolved_onnx_nodes / s.metadata_onnx_nodes >= 0.95
    modules = {m.module: m for m in report.modules}
    encoder_layers = [f"encoder/layers.{i}" for i in range(12)]
    # every encoder layer runs as Myelin kernels of graph 0: QKV gemm, attention, out-proj, LN, FFN fusion, FFN out, LN
    assert [modules[name].myelin_kernels for name in encoder_layers] == [7] * 12
    assert report.coverage.not_in_layers["compute"] == []
    assert report.fusion_map["order"] == "onnx"


def test_a_dynamo_export_beside_a_torchscript_built_engine_says_which_exporter(trt_fixtures, bert_tiny_torchscript, tmp_path):
    """Issue 36: the build's (dynamo) export resolves none of the log's names; the finding says to export with TorchScript."""
    from pipeline.core.profiles import load_profile
    from pipeline.export import export_model

    export_model(load_profile("bert-tiny"), tmp_path / "dynamo.onnx", exporter="dynamo")
    log = trt_fixtures / "bert-fp16-trt10.10.detailed.log"
    hint = "export with `--exporter torchscript`"
    dynamo = report_from_files(log, onnx=tmp_path / "dynamo.onnx")
    assert dynamo.summary.resolved_onnx_nodes == 0 and any(hint in finding for finding in dynamo.findings)
    assert not any(hint in finding for finding in report_from_files(log, onnx=bert_tiny_torchscript).findings)


def test_names_only_range_resolves_over_the_onnx_order(trt_fixtures, bert_tiny_torchscript):
    report = report_from_files(trt_fixtures / "bert-fp16-trt10.10.layer_names_only.log", onnx=bert_tiny_torchscript)
    foreign = report.layers[0]
    assert foreign.mapping == "range"
    assert "/match_model/Squeeze" in foreign.onnx_nodes and "/encoder/layers.5/mha/attn/MatMul" in foreign.onnx_nodes
    assert any("/encoder/Unsqueeze_3" in f and "boundary" in f for f in report.findings)
    finding = next(f for f in report.findings if "LAYER_NAMES_ONLY" in f)
    assert "--verbosity detailed" in finding and "--profilingVerbosity=detailed" in finding


def test_two_profiles_count_one_graph_per_profile(trt_fixtures):
    report = report_from_files(trt_fixtures / "trt10.16_engineinspector_oneline_fp16_2profiles.log")
    s = report.summary
    assert (s.profiles, s.myelin_graphs, s.myelin_graphs_per_profile) == (2, 1, [1, 1])
    assert report.verdict.endswith("in each of its 2 optimization profiles")


def test_int8_engine_gets_q_dq_advice_and_fp16_does_not(trt_fixtures):
    int8 = report_from_files(trt_fixtures / "trt852_namesonly_yolo_qdq_int8.layers.json")
    raw = json.loads((trt_fixtures / "trt852_namesonly_yolo_qdq_int8.layers.json").read_text())["Layers"]
    assert int8.summary.precision == "INT8"
    assert any("lint-qdq" in f for f in int8.findings)
    standalone = [r for r in int8.regions if r.qdq]
    assert standalone and all(raw[r.indices[0]].endswith("QuantizeLinear") or "QuantizeLinear_clone" in raw[r.indices[0]] for r in standalone)
    for name in ("trt10.16_detailed_mnist_myelin.layers.json", "trex_tf_resnet50_RTX3090_fp16.graph.json", "trt82_swin_tiny_fp16_T4_builder_layers.log"):
        report = report_from_files(trt_fixtures / name)
        assert report.summary.precision in ("FP16", "FP32")
        assert not any("Q/DQ" in f or "lint-qdq" in f for f in report.findings + [report.verdict]), name


def test_timing_and_profile_wording(trt_fixtures):
    layers = trt_fixtures / "trt852_namesonly_yolo_qdq_int8.layers.json"
    profile = trt_fixtures / "trt852_namesonly_yolo_qdq_int8.profile.json"
    report = report_from_files(layers, timing=profile)
    records = [r for r in json.loads(profile.read_text()) if "name" in r]
    assert report.summary.timed_layers == len(records)
    assert report.summary.total_time_ms == pytest.approx(sum(r["averageMs"] for r in records))
    wrong_way = run_cli("report", str(profile))
    assert wrong_way.returncode == 2
    assert "pass this file with --timing" in wrong_way.stderr and "expected it passed" not in wrong_way.stderr


def test_report_cli_formats(tmp_path, trt_fixtures):
    log = str(trt_fixtures / "bert-fp16-trt10.10.detailed.log")
    text = run_cli("report", log)
    assert text.returncode == 0 and text.stdout.startswith("FP16 engine: the whole network runs as 1 Myelin region")
    assert "_gemm_mha_v2_myl0_3" in text.stdout
    compact = run_cli("report", log, "--format", "json")
    assert "\n" not in compact.stdout.rstrip("\n") and json.loads(compact.stdout)["summary"]["layers"] == 89
    pretty = run_cli("report", log, "--format", "json", "--pretty")
    assert json.loads(pretty.stdout) == json.loads(compact.stdout) and pretty.stdout.count("\n") > 100
    md = run_cli("report", log, "-f", "md", "-o", str(tmp_path / "r.md"))
    page = (tmp_path / "r.md").read_text()
    assert md.returncode == 0 and "| encoder |" in page.replace("\\", "") and "whole network runs as 1 Myelin region" in page


def test_text_shows_the_first_rows_and_all_with_the_flag(tmp_path, trt_fixtures):
    """Long tables print MAX_ROWS rows and a count; --all prints every one."""
    from trt.render.text import MAX_ROWS

    data = json.loads((trt_fixtures / "trt10.16_detailed_mnist_myelin.layers.json").read_text())
    copies = MAX_ROWS // len(data["Layers"]) + 2
    data["Layers"] = [{**layer, "Name": f"{layer['Name']} (copy {k})" if "_myl" not in layer["Name"] else layer["Name"].replace("_myl4_", f"_myl{4 + k}_")}
                      for k in range(copies) for layer in data["Layers"]]
    path = tmp_path / "many.layers.json"
    path.write_text(json.dumps(data))
    total = len(data["Layers"])
    short = run_cli("report", str(path)).stdout
    assert f"... {total - MAX_ROWS} more layers (the first {MAX_ROWS} of {total} shown; --all lists every one)" in short
    full = run_cli("report", str(path), "--all").stdout
    assert "more layers" not in full and f"(copy {copies - 1})" in full


def test_report_imports_neither_torch_nor_onnx_nor_tensorrt(trt_fixtures):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pipeline", "report", str(trt_fixtures / "bert-fp16-trt10.10.detailed.log"), "-f", "html"],
        cwd=REPO, capture_output=True, text=True,
    )
    assert result.returncode == 0
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "trt" in imported and not imported & {"torch", "onnxruntime", "tensorrt", "onnx", "onnx_ir", "modelopt"}


def test_layer_names_with_terminal_escapes_are_neutralized(tmp_path, trt_fixtures):
    """Names come from untrusted models: ESC/OSC/control characters never reach the terminal raw."""
    evil = "node_\x1b]0;owned\x07\x1b[31mred\x1b[0m\r\u202eevil\x7f\x9b2J"
    path = mnist_with_a_layer_named(tmp_path, evil)
    for fmt in ("text", "md"):
        out = run_cli("report", str(path), "-f", fmt, "--all").stdout
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]", out), fmt
        assert "\\x1b" in out.replace("\\\\", "\\") and "\\u202e" in out.replace("\\\\", "\\"), fmt
    out = run_cli("report", str(path), "-f", "json").stdout  # JSON escapes C0; DEL and C1 as \u00NN
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", out)
    assert evil in {layer["name"] for layer in json.loads(out)["layers"]}
