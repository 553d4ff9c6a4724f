"""What optimize writes: graph outputs keep name and type, subgraphs keep their types and are left to
themselves, and a model that fails onnx.checker or onnxruntime loading is never written (the safety
net in pipeline/optimize/safety.py, tested with a rule made to break the graph)."""

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper

from pipeline.core.errors import StageFailed
from pipeline.core.verify import run_onnx
from pipeline.optimize import optimize_file
from pipeline.optimize.rules.noop import RemoveIdentity

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _save(tmp_path, graph, name="model.onnx"):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / name
    onnx.save(model, path)
    return path


def _identity_then_sqrt(tmp_path):
    """x -> Identity -> Sqrt (node "sqrt") -> y; n (int64) -> Neg -> m."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["a"], name="identity"), helper.make_node("Sqrt", ["a"], ["y"], name="sqrt"),
         helper.make_node("Neg", ["n"], ["m"], name="neg")], "g",
        [helper.make_tensor_value_info("x", F, [2, 3]), helper.make_tensor_value_info("n", I64, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3]), helper.make_tensor_value_info("m", I64, [2, 3])])
    return _save(tmp_path, graph)


@pytest.fixture
def broken_remove_identity(monkeypatch):
    """remove-identity, made to rewire the Sqrt after it to the int64 input: a graph no checker accepts."""
    rewrite = RemoveIdentity.rewrite

    def broken(self, node, bound, ctx):
        sqrt = node.outputs[0].uses()[0].node
        rewrite(self, node, bound, ctx)
        sqrt.replace_input_with(0, ctx.graph.inputs[1])

    monkeypatch.setattr(RemoveIdentity, "rewrite", broken)


def test_a_broken_rewrite_is_never_written_and_the_rule_is_named(tmp_path, broken_remove_identity):
    source = _identity_then_sqrt(tmp_path)
    target = tmp_path / "out.onnx"
    target.write_bytes(b"an earlier result")
    with pytest.raises(StageFailed) as caught:
        optimize_file(source, target)
    message = str(caught.value)
    assert "fails onnx.checker" in message and "node sqrt was last touched by rule remove-identity" in message
    assert "\n" not in message and "--skip-rules remove-identity" in message
    assert target.read_bytes() == b"an earlier result", "the target is untouched"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "out.onnx"], "no temporary file left"
    result = optimize_file(source, target, skip=["remove-identity"])  # the way out the message names
    assert result.checks == ["onnx.checker (full)", "onnxruntime loading"]


def test_the_command_says_it_in_one_line(tmp_path, broken_remove_identity, monkeypatch, capsys):
    from pipeline.cli import main

    source = _identity_then_sqrt(tmp_path)
    monkeypatch.setattr(sys, "argv", ["pipeline", "optimize", str(source), "-o", str(tmp_path / "out.onnx")])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    assert exited.value.code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: optimize: the optimized model fails onnx.checker") and "remove-identity" in err
    assert not (tmp_path / "out.onnx").exists()


def test_onnxruntime_loading_is_checked_too(tmp_path, monkeypatch):
    """A graph onnx.checker accepts but onnxruntime refuses (an op it has no kernel for) fails the second check."""
    from pipeline.optimize import safety

    source = _identity_then_sqrt(tmp_path)
    real = safety._run
    monkeypatch.setattr(safety, "_run", lambda check, proto, full: "refused" if check == safety.ONNXRUNTIME and "identity" not in
                        [n.name for n in proto.graph.node] else real(check, proto, full))
    with pytest.raises(StageFailed, match="fails onnxruntime loading, so nothing was written: refused; last rules applied: remove-identity"):
        optimize_file(source, tmp_path / "out.onnx")


def test_a_check_the_input_fails_too_is_not_asked_of_the_output(tmp_path):
    """An input declared without a shape fails onnx.checker in the input model already: optimize still writes."""
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", F, None)], [helper.make_tensor_value_info("y", F, None)])
    source = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10), source)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(onnx.load(source))
    result = optimize_file(source, tmp_path / "out.onnx")
    assert result.nodes_after == 1 and result.checks == ["onnxruntime loading"]


def test_the_checks_after_one_the_input_fails_too_still_run(tmp_path, monkeypatch):
    """onnx.checker rejecting input and output alike must not excuse the output from onnxruntime's check: it was
    listed as passed without running."""
    from pipeline.optimize import safety

    source = _identity_then_sqrt(tmp_path)
    monkeypatch.setattr(safety, "_run", lambda check, proto, full: "rejected" if check == safety.CHECKER else (
        "refused" if "identity" not in [n.name for n in proto.graph.node] else None))
    with pytest.raises(StageFailed, match="fails onnxruntime loading, so nothing was written: refused"):
        optimize_file(source, tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()


def test_a_shape_that_is_a_graph_output_is_kept_and_the_fold_says_why(tmp_path):
    graph = helper.make_graph([helper.make_node("Shape", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info("y", I64, [2])])
    source = _save(tmp_path, graph)
    result = optimize_file(source, tmp_path / "out.onnx")
    why = {r["rule"]: r["why_not"] for r in result.rules}
    assert why["fold-static-shape"] == {"its output is a graph output": 1}
    out = onnx.load(tmp_path / "out.onnx").graph
    assert [o.name for o in out.output] == ["y"] and out.output[0].type == onnx.load(source).graph.output[0].type
    assert run_onnx(tmp_path / "out.onnx", {"x": np.zeros((2, 3), np.float32)})[0].tolist() == [2, 3]


def _if_with_identity_in_a_branch(tmp_path):
    """cond, x -> If(cond){ Identity(x) } else { SequenceConstruct(x, x) -> SequenceAt 1 }, and Identity(x) -> Relu at the top."""
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"], name="branch_identity")], "then", [],
                             [helper.make_tensor_value_info("t", F, [2])])
    one = helper.make_tensor("one", I64, [], [1])
    otherwise = helper.make_graph(
        [helper.make_node("SequenceConstruct", ["x", "x"], ["s"]), helper.make_node("Constant", [], ["i"], value=one),
         helper.make_node("SequenceAt", ["s", "i"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, [2])])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=otherwise),
         helper.make_node("Identity", ["x"], ["a"], name="top_identity"), helper.make_node("Relu", ["a"], ["r"])], "g",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []), helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("y", F, [2]), helper.make_tensor_value_info("r", F, [2])])
    return _save(tmp_path, graph)


def test_subgraphs_keep_their_types_and_the_rules_leave_them_alone(tmp_path):
    source = _if_with_identity_in_a_branch(tmp_path)
    target = tmp_path / "out.onnx"
    result = run_cli("optimize", str(source), "-o", str(target), "--stats")
    assert result.returncode == 0, result.stderr
    assert "checked before writing: onnx.checker (full), onnxruntime loading" in result.stdout
    model = onnx.load(target)
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["If", "Relu"], "the top-level Identity is removed"
    branches = {a.name: a.g for a in model.graph.node[0].attribute}
    assert [n.name for n in branches["then_branch"].node] == ["branch_identity"], "the one in the branch is not"
    sequence = next(v for v in branches["else_branch"].value_info if v.name == "s")
    assert sequence.type.HasField("sequence_type"), "the sequence inside the branch is still a sequence"
    x = np.array([-1.0, 2.0], np.float32)
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "x": x}
        assert [o.tolist() for o in run_onnx(target, feeds)] == [o.tolist() for o in run_onnx(source, feeds)]


LIGHT_MODELS = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.mark.parametrize("name", ["light_bvlc_alexnet", "light_squeezenet"])
def test_onnx_light_models_ir3_weights_as_constant_of_shape(name, tmp_path):
    """onnx's "light" models (IR version 3: every initializer is also a graph input; weights are
    ConstantOfShape nodes): folded initializers are listed among the inputs as IR 3 requires, no
    fold writes a constant above FOLD_LIMIT elements from small inputs, and the outputs are the same."""
    from pipeline.optimize.rules.constant_folding import FOLD_LIMIT, GROWS

    source, target = LIGHT_MODELS / f"{name}.onnx", tmp_path / "out.onnx"
    result = optimize_file(source, target)
    model = onnx.load(target)
    assert model.ir_version == 3 and result.checks == ["onnx.checker (full)", "onnxruntime loading"]
    onnx.checker.check_model(model, full_check=True)
    assert {i.name for i in model.graph.initializer} <= {i.name for i in model.graph.input}
    added = {i.name for i in model.graph.input} - {i.name for i in onnx.load(source).graph.input}
    read = {name for node in model.graph.node for name in node.input}
    assert added and added <= read, "every input the folds added is read"
    assert max(int(np.prod(i.dims)) for i in model.graph.initializer) <= FOLD_LIMIT
    why_not = {r["rule"]: r["why_not"] for r in result.rules}["fold-constants"]
    assert GROWS in why_not and "ConstantOfShape" in result.ops_after
    data = next(i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer})
    feeds = {data.name: np.random.default_rng(0).standard_normal([d.dim_value for d in data.type.tensor_type.shape.dim]).astype(np.float32)}
    assert [o.tolist() for o in run_onnx(target, feeds)] == [o.tolist() for o in run_onnx(source, feeds)]
