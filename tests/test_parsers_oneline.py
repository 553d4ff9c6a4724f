"""One-line layer information (`Name: ..., LayerType: ..., Metadata: ...` per layer) on real files:
IEngineInspector ONELINE output with two optimization profiles (raw \\x1e/\\x1f separators), and the
detailed verbose builder log of the BERT engine."""

from collections import Counter

import pytest
from trt_facts import ONNX_ENTRY, PROFILE_MARK, kernel_graph, oneline_records

from trt.parsers import parse_layer_info

ONELINE = "trt10.16_engineinspector_oneline_fp16_2profiles.log"
BERT_DETAILED = "bert-fp16-trt10.10.detailed.log"


@pytest.fixture
def oneline(trt_fixtures):
    return trt_fixtures / ONELINE


def test_counts_match_the_file(oneline):
    records = oneline_records(oneline)
    plan = parse_layer_info(oneline)
    assert [layer.name for layer in plan.layers] == [r["name"] for r in records]
    assert [layer.type for layer in plan.layers] == [r["type"] for r in records]
    assert sum(layer.myelin for layer in plan.layers) == sum(kernel_graph(r["name"]) is not None for r in records)
    distinct = {n for r in records for n in ONNX_ENTRY.findall(r["metadata"] or "")}
    assert {n for layer in plan.layers for n in layer.onnx_nodes} == distinct


def test_fused_layers_keep_every_onnx_node_although_the_separators_are_raw_control_characters(oneline):
    """Item 1: `node_conv2d + node_relu` has two `[ONNX Layer]` entries joined by a raw \\x1e; splitlines()
    would cut the line there and keep only the first."""
    text = oneline.read_text()
    assert "\x1e" in text and "\x1f" in text, "the fixture carries the raw separators"
    plan = parse_layer_info(oneline)
    by_name = {layer.name: layer for layer in plan.layers}
    fused = [r for r in oneline_records(oneline) if len(ONNX_ENTRY.findall(r["metadata"] or "")) > 1]
    assert fused, "the file has layers with several ONNX nodes"
    for record in fused:
        assert by_name[record["name"]].onnx_nodes == list(dict.fromkeys(ONNX_ENTRY.findall(record["metadata"])))


def test_empty_metadata_means_no_onnx_node_not_the_kernel_name(oneline):
    """Item 2: a trailing empty `Metadata:` (e.g. `__myl_CastReshCast_myl5_6`) is "no ONNX node"."""
    empty = [r["name"] for r in oneline_records(oneline) if r["metadata"] is not None and not r["metadata"].strip()]
    assert len(empty) >= 2
    plan = parse_layer_info(oneline)
    by_name = {layer.name: layer for layer in plan.layers}
    assert all(by_name[name].onnx_nodes == [] and by_name[name].mapping == "metadata" for name in empty)
    assert not {n for layer in plan.layers for n in layer.onnx_nodes} & {layer.name for layer in plan.layers if layer.myelin}


def test_second_profile_kernels_belong_to_profile_1_and_each_profile_runs_one_graph(oneline):
    """Item 5: `node_linear [profile 1]_myl11_2` is a kernel of graph 11 in profile 1, and so is every
    kernel of graph 11, named with the suffix or not."""
    records = oneline_records(oneline)
    marked_graphs = {kernel_graph(r["name"]) for r in records if PROFILE_MARK in r["name"] and kernel_graph(r["name"]) is not None}
    plan = parse_layer_info(oneline)
    assert marked_graphs and all(layer.profile == 1 for layer in plan.layers if layer.myelin_graph in marked_graphs)
    assert all(layer.profile == 1 for layer in plan.layers if PROFILE_MARK in layer.name)
    graphs = Counter(r.profile for r in plan.regions if r.kind == "myelin")
    assert plan.profiles == 2 and graphs == {0: 1, 1: 1}


def test_format_is_named_for_what_printed_it(oneline, trt_fixtures):
    """Item 7: ONELINE output is not labelled 'builder log'; the verbose log is."""
    assert parse_layer_info(oneline).format == "one-line layer information (IEngineInspector ONELINE), detailed"
    assert parse_layer_info(trt_fixtures / BERT_DETAILED).format == "verbose builder log, detailed"


def test_bert_detailed_log(trt_fixtures):
    """The log was copied through a web page that dropped the separators: entries are simply concatenated."""
    path = trt_fixtures / BERT_DETAILED
    records = oneline_records(path)
    plan = parse_layer_info(path)
    assert len(plan.layers) == len(records)
    kernels = [r for r in records if kernel_graph(r["name"]) is not None]
    assert sum(layer.myelin for layer in plan.layers) == len(kernels)
    assert len(plan.regions) == len(records) - len(kernels) + len({kernel_graph(r["name"]) for r in kernels})
    for layer, record in zip(plan.layers, records):
        assert layer.onnx_nodes == list(dict.fromkeys(ONNX_ENTRY.findall(record["metadata"] or "")))
