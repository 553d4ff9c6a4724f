"""`polygraphy inspect model X.trt --show layers attrs weights` output (real, Polygraphy 0.49 / TensorRT 10.16)."""

import re

from trt_facts import kernel_graph

from trt.parsers import parse_layer_info

POLYGRAPHY = "trt10.16_polygraphy_inspect_layers.log"
HEAD = re.compile(r"^\s+Layer (\d+)\s+\| (.*) \[Op: (.*)\]$")


def test_every_layer_block_is_read(trt_fixtures):
    path = trt_fixtures / POLYGRAPHY
    heads = [m.groups() for line in path.read_text().split("\n") if (m := HEAD.match(line))]
    plan = parse_layer_info(path)
    assert plan.format.startswith("polygraphy inspect")
    assert [(layer.name, layer.type) for layer in plan.layers] == [(name, op) for _, name, op in heads]
    kernels = [name for _, name, _ in heads if kernel_graph(name) is not None]
    assert sum(layer.myelin for layer in plan.layers) == len(kernels)
    assert [r.kind for r in plan.regions].count("myelin") == len({kernel_graph(n) for n in kernels})


def test_types_tactics_and_nodes(trt_fixtures):
    path = trt_fixtures / POLYGRAPHY
    text = path.read_text()
    plan = parse_layer_info(path)
    dtypes = set(re.findall(r"dtype=(\w+)", text))
    assert dtypes == {"float32", "int32", "int64"}
    assert {layer.precision for layer in plan.layers if layer.name.startswith("node_")} == {"FP32"}
    tactics = re.findall(r"^\s+Tactic = (\S+)$", text, flags=re.MULTILINE)
    assert [layer.tactic for layer in plan.layers if layer.tactic] == tactics
    conv = plan.layers[0]
    assert conv.onnx_nodes == ["node_conv2d", "node_relu"] and conv.mapping == "name"
    # Polygraphy prints no Metadata: a Myelin kernel's name is never taken for an ONNX node
    assert all(layer.onnx_nodes == [] for layer in plan.layers if layer.myelin)
