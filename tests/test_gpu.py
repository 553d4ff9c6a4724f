"""On a GPU machine with TensorRT (our Docker image): `pytest -m gpu`. Real engines, real properties."""

import json

import pytest
from conftest import run_cli

from trt.parsers import parse_layer_info, parse_timing

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    result = run_cli("build", "--fp16", "--int8", "--strict", "--out", str(out), timeout=3600)
    assert result.returncode == 0, result.stderr
    return out


def test_engines_deserialize(built):
    import tensorrt as trt

    runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
    for prec in ("fp32", "fp16", "int8"):
        assert runtime.deserialize_cuda_engine((built / f"{prec}.engine").read_bytes()) is not None


def test_layer_json_parses_and_has_metadata(built):
    for prec in ("fp32", "fp16", "int8"):
        plan = parse_layer_info(built / f"{prec}.layers.json")
        assert plan.verbosity == "detailed" and any(layer.mapping == "metadata" and layer.onnx_nodes for layer in plan.layers)


def test_profile_names_match_layers(built):
    for prec in ("fp16", "int8"):
        names = {layer.name for layer in parse_layer_info(built / f"{prec}.layers.json").layers}
        timed = {record.name for record in parse_timing(built / f"{prec}.profile.json")}
        assert timed and timed <= names


def test_int8_engine_has_int8_layers(built):
    report = json.loads((built / "int8.report.json").read_text())
    assert report["breakdown"]["precisions"].get("INT8", 0) > 0


def test_diff_and_bench_ran(built):
    stages = {s["name"]: s for s in json.loads((built / "manifest.json").read_text())["stages"]}
    assert stages["diff"]["status"] == "done" and stages["bench"]["status"] == "done"
    bench = json.loads((built / "bench.trt.json").read_text())
    assert set(bench["models"]) == {"fp32", "fp16", "int8"} and all(m["p50_ms"] > 0 for m in bench["models"].values())


def test_bench_ort_cuda(built):
    result = run_cli("bench", str(built), "--backend", "ort-cuda", "--iterations", "50")
    assert result.returncode == 0, result.stderr
    assert json.loads((built / "bench.ort-cuda.json").read_text())["models"]["fp32"]["p50_ms"] > 0
