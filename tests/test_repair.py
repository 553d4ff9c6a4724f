"""Gates that repair themselves (issue 38): a failed FP16 gate finds the nodes to keep in FP32, reruns, and says
which and why; --no-repair fails as before; the search keeps the fewest ranked nodes within its cap."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_cli, write_profile
from onnx import TensorProto, helper, numpy_helper

from pipeline.stages import repair
from pipeline.stages.repair import BUDGET, MAX_SHARE, Trial, op_type_groups, search

PROFILE = """
name = "overflow"
[model]
onnx = "model.onnx"
[dims.batch]
min = 1
opt = 2
max = 4
[[inputs]]
name = "x"
dtype = "float32"
shape = ["batch", 8]
[quant]
accuracy_samples = 4
"""


def overflowing_model(path: Path) -> None:
    """tanh(x @ w + big * (h - h)): in FP32 big * 0 is 0; in FP16 the Constant -1e38 is -Inf, and -Inf * 0 is NaN
    (deberta-v2's masked_fill constant, in four nodes). AutoCast's own range check runs on the nodes' outputs, so it
    converts the Constant: the gate fails."""
    weights = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
        helper.make_node("Constant", [], ["big"], name="big_constant", value=numpy_helper.from_array(np.array(-1e38, np.float32))),
        helper.make_node("Sub", ["h", "h"], ["zero"], name="zero"),
        helper.make_node("Mul", ["big", "zero"], ["masked"], name="masked"),
        helper.make_node("Add", ["h", "masked"], ["y"], name="add"),
        helper.make_node("Tanh", ["y"], ["out"], name="tanh"),
    ]
    graph = helper.make_graph(nodes, "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 8])], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def overflow(tmp_path_factory):
    folder = tmp_path_factory.mktemp("overflow")
    overflowing_model(folder / "model.onnx")
    write_profile(folder, PROFILE)
    return folder


def _fp16_record(out: Path) -> dict:
    return next(s for s in json.loads((out / "manifest.json").read_text())["stages"] if s["name"] == "fp16")


def test_a_failed_fp16_gate_keeps_the_overflowing_node_in_fp32_and_passes(overflow):
    result = run_cli("build", "--profile", "p.toml", "--fp16", "--until", "fp16", "--out", "out", cwd=overflow)
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("fp16"))
    assert "done" in line and "2 nodes kept in FP32: masked, big_constant (NaN/Inf first at big_constant (Constant)" in line
    assert '[quant] fp16_exclude_nodes = ["masked$", "big_constant$"]' in line
    record = _fp16_record(overflow / "out")
    fix = record["metrics"]["repair"]
    assert fix["kept"] == ["masked", "big_constant"] and fix["kept_compute_nodes"] == 1 and fix["compute_nodes"] == 5
    assert record["metrics"]["accuracy"]["cosine_centered"] >= 0.999 and record["metrics"]["runs_at_shapes"]
    assert record["key"]["settings"]["repair"] is True
    assert not list((overflow / "out").glob(".repair-*"))  # the trials' folder is gone


def test_the_pinned_profile_needs_no_search(overflow):
    pinned = write_profile(overflow, PROFILE + 'fp16_exclude_nodes = ["masked$", "big_constant$"]\n', "pinned.toml")
    result = run_cli("build", "--profile", str(pinned), "--fp16", "--until", "fp16", "--out", "pinned", cwd=overflow)
    assert result.returncode == 0, result.stderr
    assert "repair" not in _fp16_record(overflow / "pinned")["metrics"]


def test_no_repair_fails_the_gate_with_its_hint(overflow):
    result = run_cli("build", "--profile", "p.toml", "--fp16", "--until", "fp16", "--out", "plain", "--no-repair", cwd=overflow)
    assert result.returncode == 1
    error = result.stderr.strip().splitlines()[-1]
    assert "outputs hold NaN or Inf" in error and "fp16_exclude_nodes" in error and "repair" not in error


def test_no_repair_without_a_repairable_precision_is_bad_input(overflow):
    result = run_cli("build", "--profile", "p.toml", "--no-repair", "--out", "none", cwd=overflow)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == ("error: --no-repair turns off the repair of the FP16/INT8/FP8/BF16 accuracy gates, which this build "
                                     "does not run; add --fp16, --int8, --fp8 or --bf16, or drop --no-repair")


def outlier_model(path: Path) -> None:
    """x @ w1 @ w2 @ w3 (a ReLU before the last): w1 makes one channel 10^4 times the others, so the per-tensor INT8 scale of
    the second MatMul's input leaves the other channels at zero; that channel does not reach the output (w2's row is 0)."""
    rng = np.random.default_rng(0)
    w1, w2, w3 = (rng.normal(size=(32, 32)).astype(np.float32) for _ in range(3))
    w1[:, 0] *= 1e4
    w2[0, :] = 0
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="first"), helper.make_node("MatMul", ["a", "w2"], ["b"], name="second"),
             helper.make_node("Relu", ["b"], ["c"], name="relu"), helper.make_node("MatMul", ["c", "w3"], ["out"], name="third")]
    graph = helper.make_graph(nodes, "outlier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 32])],
                              [numpy_helper.from_array(w, name) for w, name in ((w1, "w1"), (w2, "w2"), (w3, "w3"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def offset_model(path: Path) -> None:
    """(x @ w1 + 100) @ w2 @ w3 (a ReLU before the last), each column of w2 summing to zero: the second MatMul reads values
    of 100 +- a few, whose variation is all it passes on. FP8 E4M3 keeps 3 mantissa bits, steps of 8 at 100: the variation is
    lost when that input is quantized; in FP16 (the FP8 model's float parts, steps of 1/16 there) it is kept."""
    rng = np.random.default_rng(0)
    w1, w2, w3 = (rng.normal(size=(32, 32)).astype(np.float32) for _ in range(3))
    w2 -= w2.mean(axis=0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="first"), helper.make_node("Add", ["a", "offset"], ["shifted"], name="offset"),
             helper.make_node("MatMul", ["shifted", "w2"], ["b"], name="second"), helper.make_node("Relu", ["b"], ["c"], name="relu"),
             helper.make_node("MatMul", ["c", "w3"], ["out"], name="third")]
    initializers = [numpy_helper.from_array(w, name) for w, name in ((w1, "w1"), (w2, "w2"), (w3, "w3"))]
    graph = helper.make_graph(nodes, "offset", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 32])],
                              [*initializers, numpy_helper.from_array(np.full(32, 100.0, np.float32), "offset")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.mark.parametrize("precision, model", [("int8", outlier_model), ("fp8", offset_model)])
def test_a_failed_gate_leaves_the_node_whose_input_quantizes_badly_unquantized(tmp_path, precision, model):
    model(tmp_path / "model.onnx")
    write_profile(tmp_path, PROFILE.replace("8]", "32]") + "samples = 8\n")
    result = run_cli("build", "--profile", "p.toml", f"--{precision}", "--until", precision, "--out", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith(precision))
    assert "1 node kept unquantized: second (largest error growth at second (MatMul)" in line
    assert f'[quant] {precision}_exclude_nodes = ["second$"]' in line
    plain = run_cli("build", "--profile", "p.toml", f"--{precision}", "--until", precision, "--out", "plain", "--no-repair", cwd=tmp_path)
    assert plain.returncode == 1 and f"{precision}: accuracy below the gate" in plain.stderr and f"{precision}_exclude_nodes" in plain.stderr


def _typed_model(nodes, initializers, value_info=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "typed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 4])], initializers, value_info=value_info)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_only_nodes_a_trial_can_change_are_ranked(tmp_path):
    """In a Q/DQ model a trial can leave unquantized only the nodes that read a DequantizeLinear; in an AutoCast model
    it can keep in FP32 only the nodes that read or write FP16. Keeping any other node changes nothing (the default
    model's FP8 repair first kept an attention MatMul left in float), and two such trials end the search."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "scale")
    qdq = [helper.make_node("QuantizeLinear", ["x", "scale"], ["xq"], name="q"), helper.make_node("DequantizeLinear", ["xq", "scale"], ["xd"], name="dq"),
           helper.make_node("MatMul", ["xd", "w"], ["h"], name="quantized"), helper.make_node("MatMul", ["h", "w"], ["out"], name="float")]
    onnx.save(_typed_model(qdq, [w, scale]), str(tmp_path / "qdq.onnx"))
    assert repair.lowered_nodes(tmp_path / "qdq.onnx") == {"quantized"}
    w16 = numpy_helper.from_array(np.eye(4, dtype=np.float16), "w16")
    autocast = [helper.make_node("Cast", ["x"], ["x16"], name="to_fp16", to=TensorProto.FLOAT16),
                helper.make_node("MatMul", ["x16", "w16"], ["h16"], name="in_fp16"),
                helper.make_node("Cast", ["h16"], ["h"], name="to_fp32", to=TensorProto.FLOAT),
                helper.make_node("MatMul", ["h", "w"], ["out"], name="kept_fp32")]
    onnx.save(_typed_model(autocast, [w, w16]), str(tmp_path / "autocast.onnx"))
    assert repair.lowered_nodes(tmp_path / "autocast.onnx") == {"to_fp16", "in_fp16", "to_fp32"}


def _fake_search(ranked: list[tuple[str, ...]], needed: set[str], closes: float = 0.2, compute: int = 200, op_types=None, clock=None):
    """search() with trials that pass once every node of `needed` is kept, each node kept till then closing the share
    `closes` of the gap to the gate; the trials tried, in order. `clock`: a list whose last value is the time, each
    trial taking as long as the attempt (1 s)."""
    tried = []

    def trial(kept):
        tried.append(kept)
        if clock is not None:
            clock.append(clock[-1] + 1.0)
        passed = needed <= set(kept)
        return Trial(kept, Path(f"t{len(kept)}"), {"cosine_centered": 1.0 if passed else 0.999 - 0.499 * (1 - closes) ** len(kept)}, passed)

    names = frozenset(f"n{i}" for i in range(compute))
    found = search(Trial((), Path("first"), {"cosine_centered": 0.5}, False), 1.0, lambda model: (ranked, "why"), trial, names, 0.999, op_types)
    return found, tried


def test_the_search_doubles_then_bisects_to_the_fewest_ranked_nodes():
    ranked = [(f"n{i}",) for i in range(10)]
    found, tried = _fake_search(ranked, {"n0", "n4"})
    assert found.kept == ("n0", "n1", "n2", "n3", "n4")  # the shortest prefix holding both
    assert [len(t) for t in tried] == [1, 2, 4, 8, 6, 5]
    assert found.trials == 6 and found.kept_compute == 5 and found.passed.kept == found.kept


def test_the_search_gives_up_past_its_share_of_the_compute_nodes():
    ranked = [(f"n{i}",) for i in range(40)]
    found, tried = _fake_search(ranked, {"n30"})
    limit = int(MAX_SHARE * 200)
    assert found.passed is None and max(len(t) for t in tried) == limit and found.kept_compute == limit


def test_the_search_stops_when_more_nodes_do_not_move_the_accuracy():
    """mobilevit's FP16: 0.79305 with 1 node kept, 0.79305 with 2, 0.79301 with 4, ...: two trials that close nothing end it."""
    found, tried = _fake_search([(f"n{i}",) for i in range(40)], {"n30"}, closes=0.0)
    assert found.passed is None and [len(t) for t in tried] == [1, 2]


def _spread_over_softmax(compute: int = 200) -> tuple[list[tuple[str, ...]], dict[str, str]]:
    """200 compute nodes, every 25th a Softmax (8 of them); the ranking puts MatMuls and Softmaxes in turn."""
    op_types = {f"n{i}": "Softmax" if i % 25 == 0 else "MatMul" for i in range(compute)}
    ranked = [(f"n{i}",) for pair in zip(range(1, 200, 25), range(0, 200, 25)) for i in pair]
    return ranked, op_types


def test_an_error_spread_over_one_op_type_is_repaired_by_keeping_that_op_type():
    """levit/mobilevit-like: every Softmax loses a little and no prefix of the ranking holds them all within the stall
    rule; keeping every Softmax (8 of 200, within 5%) passes, and a half of them does not."""
    ranked, op_types = _spread_over_softmax()
    softmax = {name for name, op in op_types.items() if op == "Softmax"}
    found, tried = _fake_search(ranked, softmax, closes=0.0, op_types=op_types)
    assert found.passed is not None and set(found.kept) == softmax and found.kept_compute == 8
    assert [len(t) for t in tried] == [1, 2, 8, 4]  # two prefixes that stall, every Softmax, its first half
    assert "the error is spread over the Softmax nodes: 8 of them kept" in found.why
    without, _ = _fake_search(ranked, softmax, closes=0.0)
    assert without.passed is None


def test_keeping_an_op_type_narrows_to_the_half_that_holds_the_error():
    ranked, op_types = _spread_over_softmax()
    found, tried = _fake_search(ranked, {"n0", "n25"}, closes=0.0, op_types=op_types)
    assert found.kept == ("n0", "n25") and [len(t) for t in tried] == [1, 2, 8, 4, 2, 1]


def test_op_type_groups_follow_the_ranking_and_fit_the_share():
    ops = {"a": "Softmax", "b": "MatMul", "c": "Softmax", "d": "MatMul", "e": "Conv", "f": "Pow"}
    assert op_type_groups([("b",), ("constant", "a"), ("f",)], ops, limit=2) == [("MatMul", ("b", "d")), ("Softmax", ("a", "c"))]
    assert op_type_groups([("b",)], ops, limit=1) == []


def test_the_search_stops_before_a_trial_would_pass_its_budget(monkeypatch):
    """Each trial takes as long as the failed attempt: the search (ranking and trials) stays within BUDGET times it."""
    clock = [0.0]
    monkeypatch.setattr(repair.time, "perf_counter", lambda: clock[-1])
    ranked, op_types = _spread_over_softmax()
    found, tried = _fake_search(ranked, {"n199"}, op_types=op_types, clock=clock)
    assert found.passed is None and len(tried) == int(BUDGET) and found.search_seconds <= BUDGET * found.attempt_seconds


def _sine_model(path: Path, frequency: float) -> None:
    """sin(frequency * x): at 1000, rounding x to FP16 (a relative 2^-11 at most) moves the phase by up to 1 rad."""
    nodes = [helper.make_node("Constant", [], ["k"], name="k", value=numpy_helper.from_array(np.array(frequency, np.float32))),
             helper.make_node("Mul", ["x", "k"], ["phase"], name="phase"), helper.make_node("Sin", ["phase"], ["out"], name="sin")]
    graph = helper.make_graph(nodes, "sine", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.mark.parametrize("precision, gate, frequency, limited", [("FP16", 0.999, 1000.0, True), ("FP16", 0.999, 1.0, False),
                                                                ("INT8", 0.99, 100.0, True), ("INT8", 0.99, 1.0, False)])
def test_a_model_too_sensitive_for_its_precision_is_said_so_instead_of_nodes_to_exclude(tmp_path, precision, gate, frequency, limited):
    """levit's random weights: the FP32 model itself reads cosine_centered 0.93 with only its inputs rounded to FP16, so no
    set of nodes kept in FP32 passes the 0.999 gate; MobileNetV1's reads 0.69 with them rounded to INT8 (one scale per
    input, as its Q/DQ rounds them). The gate's message says so. A model that is not: nothing said."""
    from pipeline.core.profiles import load_profile
    from pipeline.stages.shared import held_out, rounding_limit
    from quant.accuracy import BackgroundOutputs

    _sine_model(tmp_path / "model.onnx", frequency)
    batches = held_out(load_profile(str(write_profile(tmp_path, PROFILE))))
    reference = BackgroundOutputs(tmp_path / "model.onnx", batches)
    line = rounding_limit(precision, tmp_path / "model.onnx", reference, batches, 4, gate, lambda message: None)
    if limited:
        assert line.startswith("the FP32 model itself reads cosine_centered=") and f"with only its inputs rounded to {precision}" in line
        assert line.endswith(f"so no {precision} model of it passes (random weights can make a model this sensitive, a trained one rarely "
                             f"is); build it without --{precision.lower()}")
    else:
        assert line == ""
