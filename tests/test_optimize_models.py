"""The optimize stage on real exports: hand-written LayerNorm/GELU, bert-tiny and bert-base, both exporters."""

import numpy as np
import onnx
import pytest
from conftest import run_cli, write_profile

from pipeline.core.profiles import load_profile
from pipeline.core.samples import make_inputs
from pipeline.core.verify import differences
from pipeline.export import export_model
from pipeline.optimize import optimize_file

HAND_WRITTEN = """
name = "hand-written"
[model]
factory = "factories:hand_written_block"
[dims.batch]
min = 1
opt = 4
max = 8
[[inputs]]
name = "x"
dtype = "float32"
shape = ["batch", 32]
[export]
opset = 20
"""


def ops(path):
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def attention_scales_come_first(path) -> bool:
    """Every Softmax's scores come from a MatMul whose first or second input is a Div/Mul by a constant."""
    model = onnx.load(str(path), load_external_data=False)
    producer = {o: n for n in model.graph.node for o in n.output}
    constants = {i.name for i in model.graph.initializer} | {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    softmaxes = [n for n in model.graph.node if n.op_type == "Softmax"]
    for softmax in softmaxes:
        node = producer[softmax.input[0]]
        while node.op_type in ("Add", "Where"):
            node = producer[node.input[0]]
        if node.op_type != "MatMul":
            return False
        scaled = [producer.get(i) for i in node.input]
        if not any(p is not None and p.op_type in ("Div", "Mul") and p.input[1] in constants for p in scaled):
            return False
    return bool(softmaxes)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_hand_written_layernorm_and_gelu_become_single_ops(tmp_path, exporter):
    profile = load_profile(str(write_profile(tmp_path, HAND_WRITTEN)))
    export_model(profile, tmp_path / "m.onnx", exporter=exporter)
    before = ops(tmp_path / "m.onnx")
    assert "LayerNormalization" not in before and "Gelu" not in before and "Erf" in before and "Tanh" in before
    optimize_file(tmp_path / "m.onnx", tmp_path / "o.onnx")
    onnx.checker.check_model(str(tmp_path / "o.onnx"), full_check=True)
    model = onnx.load(str(tmp_path / "o.onnx"))
    after = [n.op_type for n in model.graph.node]
    assert after.count("LayerNormalization") == 1 and after.count("Gelu") == 2 and "Erf" not in after and "Tanh" not in after
    (ln,) = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    assert onnx.helper.get_attribute_value(next(a for a in ln.attribute if a.name == "epsilon")) == np.float32(1e-12)
    approximations = sorted(onnx.helper.get_attribute_value(a) for n in model.graph.node if n.op_type == "Gelu" for a in n.attribute)
    assert approximations == [b"tanh"]  # one erf form (default), one tanh form
    feeds = [make_inputs(profile, seed=s, dims={"batch": b}) for s, b in ((1, 4), (2, 7))]
    assert differences(tmp_path / "m.onnx", tmp_path / "o.onnx", feeds)[0] <= 1e-5


def test_bert_tiny_torchscript(tmp_path, bert_tiny_torchscript):
    result = optimize_file(bert_tiny_torchscript, tmp_path / "o.onnx")
    onnx.checker.check_model(str(tmp_path / "o.onnx"), full_check=True)
    after = ops(tmp_path / "o.onnx")
    assert after.count("LayerNormalization") == 25 and after.count("Gelu") == 13 and "Identity" not in after and "Shape" not in after
    assert attention_scales_come_first(tmp_path / "o.onnx")
    assert result.nodes_after < result.nodes_before
    names = {n.name for n in onnx.load(str(tmp_path / "o.onnx"), load_external_data=False).graph.node}
    assert "/encoder/layers.3/mha/attn/mha_prob/Div" in names and "/encoder/layers.3/mha/attn/mha_prob/query/MatMul" in names
    profile = load_profile("bert-tiny")
    assert differences(bert_tiny_torchscript, tmp_path / "o.onnx", [make_inputs(profile, seed=s) for s in (1, 2)])[0] <= 1e-5


@pytest.fixture(scope="session")
def bert_base_exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert_base")
    profile = load_profile("bert-base")
    for exporter in ("dynamo", "torchscript"):
        export_model(profile, folder / f"{exporter}.onnx", exporter=exporter)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_bert_base(tmp_path, bert_base_exports, exporter):
    source = bert_base_exports / f"{exporter}.onnx"
    optimize_file(source, tmp_path / "o.onnx")
    onnx.checker.check_model(str(tmp_path / "o.onnx"), full_check=True)
    model = onnx.load(str(tmp_path / "o.onnx"), load_external_data=False)
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node), "standard ONNX ops only"
    after = [n.op_type for n in model.graph.node]
    assert after.count("LayerNormalization") == 25 and after.count("Gelu") == 13 and "Shape" not in after
    assert attention_scales_come_first(tmp_path / "o.onnx")
    profile = load_profile("bert-base")
    feeds = [make_inputs(profile, seed=11, dims={"batch": 1, "seq": 128}), make_inputs(profile, seed=12, dims={"batch": 2, "seq": 64})]
    assert differences(source, tmp_path / "o.onnx", feeds)[0] <= 1e-5


def test_static_dims_remove_every_shape_node(tmp_path, bert_base_exports):
    """Pin the dynamic TorchScript export's inputs to 1 x 16: the shape subgraphs fold to constants."""
    model = onnx.load(str(bert_base_exports / "torchscript.onnx"))
    for graph_input in model.graph.input:
        for dim, size in zip(graph_input.type.tensor_type.shape.dim, (1, 16), strict=True):
            dim.Clear()
            dim.dim_value = size
    onnx.save(model, tmp_path / "static.onnx")
    assert "Shape" in ops(tmp_path / "static.onnx")
    result = optimize_file(tmp_path / "static.onnx", tmp_path / "o.onnx")
    assert "Shape" not in ops(tmp_path / "o.onnx") and result.op_delta["Shape"] < 0


def test_build_runs_optimize_and_records_it(tmp_path):
    profile = write_profile(tmp_path, HAND_WRITTEN)
    result = run_cli("build", "--profile", str(profile), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    import json

    stages = {s["name"]: s for s in json.loads((tmp_path / "out" / "manifest.json").read_text())["stages"]}
    metrics = stages["optimize"]["metrics"]
    assert stages["optimize"]["status"] == "done" and metrics["max_abs_diff"] <= 1e-5
    assert metrics["nodes_after"] < metrics["nodes_before"] and metrics["op_delta"]["Gelu"] == 2
    assert {r["rule"] for r in metrics["rules"] if r["applied"]} >= {"fuse-layernorm", "fuse-gelu"}
    assert [s["x"] for s in metrics["checked_shapes"]] == [[4, 32], [2, 32]]
    again = run_cli("build", "--profile", str(profile), "--out", str(tmp_path / "out"))
    assert "cached" in again.stdout and json.loads((tmp_path / "out" / "manifest.json").read_text())["stages"][1]["status"] == "cached"


def test_build_fails_naming_the_last_rules_when_the_check_fails(tmp_path):
    """A tolerance no float32 rewrite can meet (GELU fusion changes the last bits) must fail the stage."""
    profile = write_profile(tmp_path, HAND_WRITTEN + "[optimize]\ntolerance = 1e-30\n")
    result = run_cli("build", "--profile", str(profile), "--out", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "optimize: the optimized model differs from its input by max_abs_diff=" in result.stderr
    assert "last rules applied: " in result.stderr and "fuse-gelu" in result.stderr
    assert not (tmp_path / "out" / "model.opt.onnx").exists()


def test_optimize_cli_stats_and_bad_input(tmp_path, bert_tiny_torchscript):
    result = run_cli("optimize", str(bert_tiny_torchscript), "-o", str(tmp_path / "o.onnx"), "--stats")
    assert result.returncode == 0 and "fuse-gelu" in result.stdout and "why not" in result.stdout
    bad = run_cli("optimize", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "x.onnx"))
    assert bad.returncode == 2 and "no such ONNX file" in bad.stderr
    unknown = run_cli("optimize", str(bert_tiny_torchscript), "-o", str(tmp_path / "x.onnx"), "--rules", "fuse-everything")
    assert unknown.returncode == 2 and "unknown rule fuse-everything" in unknown.stderr and not (tmp_path / "x.onnx").exists()


def test_the_optimize_check_scales_with_the_outputs_magnitude(tmp_path):
    """float32 rounding grows with the values (levit's logits: a reordered scale moved them by 2e-4): above 1, the
    difference is measured against the output's largest magnitude, as export's tolerance is."""
    from onnx import TensorProto, helper

    from pipeline.core.verify import differences

    def scaled(path, factor):
        onnx.save(helper.make_model(helper.make_graph(
            [helper.make_node("Mul", ["x", "k"], ["y"], name="scale")], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
            [helper.make_tensor("k", TensorProto.FLOAT, [], [factor])]), opset_imports=[helper.make_opsetid("", 20)]), str(path))

    scaled(tmp_path / "a.onnx", 1000.0)
    scaled(tmp_path / "b.onnx", 1000.0 * (1 + 2e-6))
    feeds = [{"x": np.linspace(0.5, 1.0, 32, dtype=np.float32).reshape(4, 8)}]
    absolute, relative, _ = differences(tmp_path / "a.onnx", tmp_path / "b.onnx", feeds)
    assert absolute == pytest.approx(2e-3, rel=0.05) and relative == pytest.approx(2e-6, rel=0.05)
    scaled(tmp_path / "c.onnx", 0.5)
    scaled(tmp_path / "d.onnx", 0.5 + 1e-4)
    assert differences(tmp_path / "c.onnx", tmp_path / "d.onnx", feeds)[0] == differences(tmp_path / "c.onnx", tmp_path / "d.onnx", feeds)[1], \
        "below 1 the difference is absolute"
