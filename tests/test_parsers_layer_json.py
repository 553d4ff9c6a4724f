"""Per-layer JSON objects joined by separator lines (a script printing `get_layer_information(i, JSON)`
for each layer, seen in the wild with `--- Layer N ---` lines).

No such file is among the real fixtures: the input here is built from the real 10.16 inspector JSON's
layer objects (each exactly what TensorRT wrote for that layer), joined the way such scripts print
them, and must read the same as the engine JSON itself.
"""

import json

import pytest

from trt.parsers import LayerInfoParseError, parse_layer_info

MNIST = "trt10.16_detailed_mnist_myelin.layers.json"


def joined(trt_fixtures, separator: str) -> str:
    layers = json.loads((trt_fixtures / MNIST).read_text())["Layers"]
    return "".join(separator.format(i) + json.dumps(layer, indent=2) + "\n" for i, layer in enumerate(layers))


@pytest.mark.parametrize("separator", ["--- Layer {} ---\n", "Layer {}:\n", ""])
def test_reads_the_same_layers_as_the_engine_json(tmp_path, trt_fixtures, separator):
    path = tmp_path / "layers.txt"
    path.write_text(joined(trt_fixtures, separator))
    plan, engine = parse_layer_info(path), parse_layer_info(trt_fixtures / MNIST)
    assert plan.format.startswith("per-layer JSON objects")
    facts = [(layer.name, layer.type, layer.onnx_nodes, layer.precision, layer.myelin_graph) for layer in plan.layers]
    assert facts == [(layer.name, layer.type, layer.onnx_nodes, layer.precision, layer.myelin_graph) for layer in engine.layers]


def test_a_broken_object_is_one_error_with_its_line(tmp_path, trt_fixtures):
    text = joined(trt_fixtures, "--- Layer {} ---\n")
    cut = text.index("--- Layer 3 ---")
    path = tmp_path / "layers.txt"
    path.write_text(text[: cut - 10] + text[cut:])
    with pytest.raises(LayerInfoParseError, match=r"per-layer JSON objects .*: line \d+ column \d+: .*; expected one JSON object per layer"):
        parse_layer_info(path)
