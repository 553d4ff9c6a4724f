"""Property: optimize(g) computes what g computes, on generated small graphs that mix the
patterns the rules look for (written-out LayerNorm and GELU, constant chains, no-ops,
transpose pairs, expand, attention scores) with ordinary ops.

One class of generated case is checked with fuse-layernorm skipped (the other rules still run),
for the reason its own test shows: a LayerNorm whose input rows have a standard deviation tiny
against their mean (e.g. sigmoid(relu(x)) with x < 0: rows of 0.5 and one 0.50036). The fused
`LayerNormalization` is the same function, but onnxruntime's CPU kernel computes the variance
in one pass, E[x^2] - E[x]^2, which cancels catastrophically there (error ~ float32 eps *
(mean / std)^2): it returns -90.8 where float64 and the written-out graph give -0.577. The
written-out graph is the accurate one; the rewrite is exact; the kernel is not. Real LayerNorm
inputs (residual streams) have std ~ |mean|.
"""

import math

import numpy as np
import onnx
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from pipeline.core.verify import run_onnx
from pipeline.optimize import optimize_file

SHAPE = [2, 3, 4]
STEPS = ["relu", "identity", "cast", "add_const", "mul_const_chain", "transpose_pair", "transpose_merge", "reshape_same",
         "gelu_erf", "gelu_tanh", "layernorm", "expand_add", "attention", "sigmoid", "dropout"]


FP32_EPS = float(np.finfo(np.float32).eps)
TOLERANCE = 1e-5


class GraphBuilder:
    def __init__(self, seed: int):
        self.nodes, self.inits, self.count, self.rng = [], [], 0, np.random.default_rng(seed)
        self.layernorm_inputs: list[str] = []

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}{self.count}"

    def const(self, value) -> str:
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def step(self, kind: str, x: str) -> str:
        f32 = lambda v: np.float32(v)  # noqa: E731
        if kind == "relu":
            return self.op("Relu", [x])
        if kind == "sigmoid":
            return self.op("Sigmoid", [x])
        if kind == "identity":
            return self.op("Identity", [x])
        if kind == "dropout":
            return self.op("Dropout", [x])
        if kind == "cast":
            return self.op("Cast", [x], to=TensorProto.FLOAT)
        if kind == "add_const":
            return self.op("Add", [x, self.const(self.rng.standard_normal(SHAPE[-1]).astype(np.float32))])
        if kind == "mul_const_chain":
            folded = self.op("Mul", [self.const(f32(self.rng.uniform(0.5, 2))), self.const(self.rng.uniform(0.5, 2, SHAPE[-1]).astype(np.float32))])
            return self.op("Mul", [x, folded])
        if kind == "transpose_pair":
            return self.op("Transpose", [self.op("Transpose", [x], perm=[0, 2, 1])], perm=[0, 2, 1])
        if kind == "transpose_merge":
            t = self.op("Transpose", [self.op("Transpose", [x], perm=[1, 0, 2])], perm=[0, 2, 1])
            return self.op("Reshape", [t, self.const(np.array(SHAPE, np.int64))])
        if kind == "reshape_same":
            return self.op("Reshape", [x, self.const(np.array([SHAPE[0], -1, SHAPE[2]], np.int64))])
        if kind == "gelu_erf":
            erf = self.op("Erf", [self.op("Div", [x, self.const(f32(math.sqrt(2)))])])
            return self.op("Mul", [self.op("Mul", [x, self.const(f32(0.5))]), self.op("Add", [erf, self.const(f32(1))])])
        if kind == "gelu_tanh":
            cube = self.op("Mul", [self.const(f32(0.044715)), self.op("Pow", [x, self.const(f32(3))])])
            tanh = self.op("Tanh", [self.op("Mul", [self.const(f32(math.sqrt(2 / math.pi))), self.op("Add", [x, cube])])])
            return self.op("Mul", [self.op("Mul", [self.const(f32(0.5)), x]), self.op("Add", [self.const(f32(1)), tanh])])
        if kind == "layernorm":
            self.layernorm_inputs.append(x)
            axes = self.const(np.array([-1], np.int64))
            mean = self.op("ReduceMean", [x, axes], keepdims=1)
            d = self.op("Sub", [x, mean])
            var = self.op("ReduceMean", [self.op("Pow", [d, self.const(f32(2))]), axes], keepdims=1)
            n = self.op("Div", [d, self.op("Sqrt", [self.op("Add", [var, self.const(f32(1e-12))])])])
            return self.op("Add", [self.op("Mul", [n, self.const(self.rng.uniform(0.5, 1.5, SHAPE[-1]).astype(np.float32))]),
                                   self.const(self.rng.standard_normal(SHAPE[-1]).astype(np.float32))])
        if kind == "expand_add":
            expanded = self.op("Expand", [self.const(self.rng.standard_normal(SHAPE[-1]).astype(np.float32)), self.const(np.array(SHAPE, np.int64))])
            return self.op("Add", [x, expanded])
        if kind == "attention":
            scores = self.op("MatMul", [x, self.op("Transpose", [x], perm=[0, 2, 1])])
            probs = self.op("Softmax", [self.op("Div", [scores, self.const(f32(2.0))])], axis=-1)
            return self.op("MatMul", [probs, x])
        raise AssertionError(kind)


def build(kinds: list[str], seed: int, expose_layernorm_inputs: bool = False):
    """The generated model; optionally with each written-out LayerNorm's input as an extra output."""
    builder = GraphBuilder(seed)
    x = "x"
    for kind in kinds:
        x = builder.step(kind, x)
    builder.nodes.append(helper.make_node("Identity", [x], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)]
    if expose_layernorm_inputs:
        outputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, SHAPE) for name in dict.fromkeys(builder.layernorm_inputs) if name != "x"]
    graph = helper.make_graph(builder.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)], outputs, builder.inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10))


def feeds_for(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)}


def one_pass_variance_error(rows: np.ndarray) -> float:
    """Expected error of a float32 one-pass variance, relative to the variance: eps * (mean / std)^2, worst row."""
    rows = rows.astype(np.float64)
    mean, var = rows.mean(-1), rows.var(-1)
    return float(np.max(np.where(var > 0, FP32_EPS * mean**2 / np.maximum(var, 1e-300), np.inf)))


def layernorm_conditioning(kinds: list[str], seed: int, tmp_path) -> float:
    """The worst one_pass_variance_error over the inputs of the model's written-out LayerNorms (0 without any)."""
    builder_inputs = GraphBuilder(seed)
    x = "x"
    for kind in kinds:
        x = builder_inputs.step(kind, x)
    if not builder_inputs.layernorm_inputs:
        return 0.0
    onnx.save(build(kinds, seed, expose_layernorm_inputs=True), tmp_path / "exposed.onnx")
    values = dict(zip(["y", *[n for n in dict.fromkeys(builder_inputs.layernorm_inputs) if n != "x"]], run_onnx(tmp_path / "exposed.onnx", feeds_for(seed))))
    values["x"] = feeds_for(seed)["x"]
    return max(one_pass_variance_error(values[name]) for name in builder_inputs.layernorm_inputs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(STEPS), min_size=1, max_size=7), seed=st.integers(0, 2**16))
def test_optimize_preserves_outputs(tmp_path, kinds, seed):
    source, target = tmp_path / "g.onnx", tmp_path / "g.opt.onnx"
    onnx.save(build(kinds, seed), source)
    result = optimize_file(source, target)
    onnx.checker.check_model(onnx.load(target))
    assert result.nodes_after <= result.nodes_before
    if "fuse-layernorm" in result.history and layernorm_conditioning(kinds, seed, tmp_path) > TOLERANCE:
        # onnxruntime's LayerNormalization cannot be compared here (module docstring): check every other rule on this graph
        event("fuse-layernorm skipped: LayerNorm input ill-conditioned for onnxruntime's one-pass variance")
        optimize_file(source, target, skip=["fuse-layernorm"])
    feeds = feeds_for(seed)
    (expected,), (actual,) = run_onnx(source, feeds), run_onnx(target, feeds)
    assert np.allclose(actual, expected, rtol=TOLERANCE, atol=TOLERANCE), (kinds, seed, float(np.max(np.abs(actual - expected))))


def test_the_excluded_case_is_onnxruntimes_one_pass_variance_not_the_rewrite(tmp_path):
    """The failing example the property test once found, (['relu', 'sigmoid', 'layernorm'], seed 1182): the
    written-out graph agrees with float64; onnxruntime's LayerNormalization on the same rows does not."""
    kinds, seed = ["relu", "sigmoid", "layernorm"], 1182
    source, target = tmp_path / "g.onnx", tmp_path / "g.opt.onnx"
    onnx.save(build(kinds, seed), source)
    assert "fuse-layernorm" in optimize_file(source, target).history
    x = feeds_for(seed)["x"].astype(np.float64)
    rows = 1 / (1 + np.exp(-np.maximum(x, 0)))  # the LayerNorm's input, in float64
    gamma_beta = [numpy_helper.to_array(i) for i in onnx.load(source).graph.initializer if i.dims == [SHAPE[-1]]]
    normalized = (rows - rows.mean(-1, keepdims=True)) / np.sqrt(rows.var(-1, keepdims=True) + 1e-12)
    reference = normalized * gamma_beta[0] + gamma_beta[1]
    (written_out,), (fused,) = run_onnx(source, feeds_for(seed)), run_onnx(target, feeds_for(seed))
    assert one_pass_variance_error(rows) > 100 * TOLERANCE and layernorm_conditioning(kinds, seed, tmp_path) > TOLERANCE
    assert np.max(np.abs(written_out - reference)) < 1e-2, "the written-out (two-pass) graph is accurate"
    assert np.max(np.abs(fused - reference)) > 1.0, "onnxruntime's one-pass LayerNormalization is not"


def test_hypothesis_keeps_no_database_and_prints_reproducers():
    """tests/conftest.py's profile: no .hypothesis database replaying old failures, a @reproduce_failure blob on failure."""
    assert settings.default.database is None and settings.default.print_blob is True
