"""Builder logs with names-only layer lines (`Layer(Type): name, Tactic: ..., in -> out`) on real files:
the TensorRT 8.2 tensor syntax of the Swin pair, the BERT names-only log, and a log holding two builds."""

import re

import pytest
from trt_facts import names_only_records

from pipeline.core.errors import InputError
from trt.parsers import LayerInfoParseError, parse_layer_info
from trt.parsers.common import nodes_from_name

SWIN = ("trt82_swin_tiny_fp16_T4_builder_layers.log", "trt82_swin_tiny_int8_T4_builder_layers.log")
TWO_BUILDS = "trt10.16_pluginv3_two_builds_verbose.log"
RANK = ("Int8", "Half", "Float")  # lowest precision first
SHORT = {"Int8": "INT8", "Half": "FP16", "Float": "FP32"}


@pytest.mark.parametrize("name", SWIN)
def test_trt82_tensor_syntax_gives_each_layer_its_precision(trt_fixtures, name):
    """Item 6: `name[Half(128,...)]` / `name[Int8(...)]` tensors, 8.2's syntax, carry the types."""
    path = trt_fixtures / name
    records = names_only_records(path)
    plan = parse_layer_info(path)
    assert "TensorRT 8.x tensor syntax" in plan.format
    assert [layer.name for layer in plan.layers] == [r["name"] for r in records]
    for layer, record in zip(plan.layers, records):
        types = re.findall(r"\[(Int8|Half|Float)\(", record["line"])
        assert types, record["line"]
        assert layer.precision == SHORT[next(t for t in RANK if t in types)]


def test_swin_pair_precisions_differ_where_the_logs_say(trt_fixtures):
    fp16, int8 = (parse_layer_info(trt_fixtures / name) for name in SWIN)
    conv = [next(layer for layer in plan.layers if layer.name == "Conv_0") for plan in (fp16, int8)]
    assert [layer.precision for layer in conv] == ["FP16", "INT8"]
    assert sum(layer.myelin for layer in fp16.layers) == sum(r["type"] == "Myelin" for r in names_only_records(trt_fixtures / SWIN[0]))


def test_foreign_node_ranges_name_their_ends_and_leave_out_tensorrt_names(trt_fixtures):
    int8 = parse_layer_info(trt_fixtures / SWIN[1])
    region = next(layer for layer in int8.layers if layer.type == "Myelin")
    assert region.name == "{ForeignNode[318...Transpose_2125 + Flatten_2127 + (Unnamed Layer* 4178) [Shuffle]]}"
    assert region.foreign_range == ("318", "Flatten_2127") and region.mapping == "range"
    assert region.onnx_nodes == ["318", "Transpose_2125", "Flatten_2127"]


def test_single_node_foreign_region_is_not_an_onnx_node_named_after_itself():
    """Item 4. The name is TensorRT's, from NVIDIA/TensorRT samples/sampleCudla/README.md
    ("[DlaLayer] {ForeignNode[(Unnamed Layer* 0) [ElementWise]]}"): no fixture file has a one-node region."""
    layer = nodes_from_name("{ForeignNode[(Unnamed Layer* 0) [ElementWise]]}")
    assert layer.type == "Myelin" and layer.onnx_nodes == [] and layer.foreign_range is None
    named = nodes_from_name("{ForeignNode[/encoder/Gather + /encoder/Mul]}")
    assert named.onnx_nodes == ["/encoder/Gather", "/encoder/Mul"]


def test_bert_names_only_log(trt_fixtures):
    path = trt_fixtures / "bert-fp16-trt10.10.layer_names_only.log"
    records = names_only_records(path)
    plan = parse_layer_info(path)
    assert [(layer.name, layer.type) for layer in plan.layers] == [(r["name"], r["type"]) for r in records]
    region = plan.layers[0]
    assert region.foreign_range == ("/encoder/Unsqueeze_3", "/match_model/Squeeze") and region.myelin
    assert plan.verbosity == "layer_names_only" and "LAYER_NAMES_ONLY" in plan.notes[0]


def test_a_log_with_two_builds_reads_the_last_and_lists_both(trt_fixtures):
    path = trt_fixtures / TWO_BUILDS
    text_lines = path.read_text().split("\n")
    headers = [i for i, line in enumerate(text_lines) if line.endswith("Engine Layer Information:")]
    assert len(headers) == 2
    per_build = [sum(1 for line in text_lines[h + 1 : h + 50] if line.startswith("Layer(")) for h in headers]
    plan = parse_layer_info(path)
    assert plan.build == 2 and [b.layers for b in plan.builds] == per_build
    assert [b.first_line for b in plan.builds] == [h + 2 for h in headers]  # 1-based, the line after the header
    assert plan.builds[1].same_as == 1
    assert "holds 2 layer listings" in plan.notes[0] and "--build N" in plan.notes[0]
    first = parse_layer_info(path, build=1)
    assert first.build == 1 and [layer.name for layer in first.layers] == [layer.name for layer in plan.layers]


def test_build_out_of_range_and_build_on_a_single_engine_file(trt_fixtures):
    with pytest.raises(LayerInfoParseError, match=r"--build 3: this log holds 2 layer listing\(s\); expected --build 1 to 2"):
        parse_layer_info(trt_fixtures / TWO_BUILDS, build=3)
    with pytest.raises(InputError, match="--build 1 picks one of several layer listings"):
        parse_layer_info(trt_fixtures / "trt10.16_detailed_mnist_myelin.layers.json", build=1)
