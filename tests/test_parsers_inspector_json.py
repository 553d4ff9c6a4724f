"""Inspector JSON (`trtexec --exportLayerInfo`, `get_engine_information(JSON)`) on real files: TensorRT
10.16 detailed with Myelin kernels, 8.x detailed without Metadata (TREx), 8.5.2 layer names only."""

import json
from collections import Counter

import pytest
from conftest import REPO, TRT_DATA
from trt_facts import ONNX_ENTRY, kernel_graph

from trt.parsers import parse_layer_info

MNIST = "trt10.16_detailed_mnist_myelin.layers.json"


def test_trt10_detailed_with_myelin_kernels(trt_fixtures):
    path = trt_fixtures / MNIST
    raw = json.loads(path.read_text())["Layers"]
    plan = parse_layer_info(path)
    assert plan.format == "inspector JSON, detailed (TensorRT 10.x)"
    assert [layer.name for layer in plan.layers] == [r["Name"] for r in raw]
    assert Counter(layer.type for layer in plan.layers) == Counter(r["LayerType"] for r in raw)
    kernels = [r["Name"] for r in raw if kernel_graph(r["Name"]) is not None]
    assert [layer.name for layer in plan.layers if layer.myelin] == kernels
    assert [r.kind for r in plan.regions].count("myelin") == len({kernel_graph(n) for n in kernels})
    for layer, record in zip(plan.layers, raw):
        assert layer.onnx_nodes == list(dict.fromkeys(ONNX_ENTRY.findall(record["Metadata"])))


def test_one_node_in_several_kernels_stays_in_each(trt_fixtures):
    plan = parse_layer_info(trt_fixtures / MNIST)
    holding = Counter(n for layer in plan.layers for n in layer.onnx_nodes)
    shared = [n for n, count in holding.items() if count > 1]
    assert shared, "node_softmax sits in two Myelin kernels of the real file"
    for name in shared:
        regions = {layer.region for layer in plan.layers if name in layer.onnx_nodes}
        assert len(regions) == 1, "kernels of one Myelin graph are one region"


def test_trt8_detailed_without_metadata_takes_nodes_from_names(trt_fixtures):
    path = trt_fixtures / "trex_resnet18_A100_qat_int8.graph.json"
    raw = json.loads(path.read_text())["Layers"]
    plan = parse_layer_info(path)
    assert plan.format == "inspector JSON, detailed (TensorRT 8.x)"
    assert [layer.name for layer in plan.layers if layer.qdq] == [r["Name"] for r in raw if r.get("Origin") == "QDQ"]
    conv = next(layer for layer in plan.layers if layer.name.startswith("layer1.0.conv2.weight + "))
    assert conv.onnx_nodes == ["QuantizeLinear_32", "Conv_34", "Add_36", "Relu_37"] and conv.mapping == "name"


def test_names_tensorrt_makes_up_are_not_onnx_nodes(trt_fixtures):
    """Item 7: `copied_squeeze_after_...`, `unsqueeze_node_after_...`, TensorFlow `...:0` weight tensors,
    `(Unnamed Layer* N)` appear in layer names; none of them is an ONNX node."""
    path = trt_fixtures / "trex_tf_resnet50_RTX3090_qat_int8.graph.json"
    raw_names = [r["Name"] for r in json.loads(path.read_text())["Layers"]]
    made_up = ("copied_squeeze_after_", "unsqueeze_node_after_", "transpose_before_", ":0", "(Unnamed Layer*")
    assert all(any(mark in name for name in raw_names) for mark in made_up[:4])
    nodes = {n for layer in parse_layer_info(path).layers for n in layer.onnx_nodes}
    assert nodes and not [n for n in nodes if any(mark in n for mark in made_up)]


def test_trt8_names_only(trt_fixtures):
    path = trt_fixtures / "trt852_namesonly_yolo_qdq_int8.layers.json"
    raw = json.loads(path.read_text())["Layers"]
    plan = parse_layer_info(path)
    assert plan.verbosity == "layer_names_only" and [layer.name for layer in plan.layers] == raw
    foreign = [name for name in raw if name.startswith("{ForeignNode[")]
    assert [layer.name for layer in plan.layers if layer.myelin] == foreign
    assert len({layer.myelin_graph for layer in plan.layers if layer.myelin}) == len(foreign)
    conv = next(layer for layer in plan.layers if layer.name.startswith("backbone.conv1.weight + "))
    assert conv.onnx_nodes == ["/backbone/conv1/_weight_quantizer/QuantizeLinear", "/backbone/conv1/Conv"]


def test_trt11_schema_from_the_migration_page_example():
    """Not TensorRT output (tests/data/README.md): the 11.x schema as NVIDIA's migration page describes it."""
    plan = parse_layer_info(REPO / "tests" / "data" / "trt11_from_migration_doc_example.layers.json")
    assert "TensorRT 11.x" in plan.format and plan.io_tensors == ["input_0", "output_0"]
    assert [layer.precision for layer in plan.layers] == ["FP32", "FP32"]
    assert plan.layers[1].onnx_nodes == ["/pool/GlobalAveragePool", "/flatten/Flatten", "/fc/Gemm"]


INSPECTOR_JSON = sorted(p.name for p in TRT_DATA.iterdir() if p.suffix == ".json" and not p.name.endswith(".profile.json"))


@pytest.mark.parametrize("name", INSPECTOR_JSON)
def test_every_inspector_json_fixture_counts(trt_fixtures, name):
    """Layers, Myelin layers and graphs, Q/DQ reformats and ONNX nodes, against the file read with json alone."""
    raw = json.loads((trt_fixtures / name).read_text())["Layers"]
    plan = parse_layer_info(trt_fixtures / name)
    names = [r if isinstance(r, str) else r["Name"] for r in raw]
    assert [layer.name for layer in plan.layers] == names
    foreign = [n for n in names if n.startswith("{ForeignNode[")]
    kernels = [n for n in names if kernel_graph(n) is not None]
    assert sum(layer.myelin for layer in plan.layers) == len(foreign) + len(kernels)
    assert len({layer.myelin_graph for layer in plan.layers if layer.myelin}) == len(foreign) + len({kernel_graph(n) for n in kernels})
    objects = [r for r in raw if isinstance(r, dict)]
    assert sum(layer.origin == "QDQ" for layer in plan.layers) == sum(r.get("Origin") == "QDQ" for r in objects)
    if objects and all("Metadata" in r for r in objects):
        assert {n for layer in plan.layers for n in layer.onnx_nodes} == {n for r in objects for n in ONNX_ENTRY.findall(r["Metadata"])}
    else:  # from names: never a fused name, a kernel name, or a name TensorRT made up
        nodes = {n for layer in plan.layers for n in layer.onnx_nodes}
        assert nodes and not [n for n in nodes if " + " in n or kernel_graph(n) is not None or "(Unnamed Layer*" in n or n.startswith("Reformatting CopyNode")]
