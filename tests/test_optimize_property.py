"""Property: optimize(g) computes what g computes, on generated small graphs that mix the
patterns the rules look for (written-out LayerNorm and GELU, constant chains, no-ops,
transpose pairs, expand, attention scores) with ordinary ops."""

import math

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from pipeline.optimize import optimize_file
from pipeline.verify import run_onnx

SHAPE = [2, 3, 4]
STEPS = ["relu", "identity", "cast", "add_const", "mul_const_chain", "transpose_pair", "transpose_merge", "reshape_same",
         "gelu_erf", "gelu_tanh", "layernorm", "expand_add", "attention", "sigmoid", "dropout"]


class GraphBuilder:
    def __init__(self, seed: int):
        self.nodes, self.inits, self.count, self.rng = [], [], 0, np.random.default_rng(seed)

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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(STEPS), min_size=1, max_size=7), seed=st.integers(0, 2**16))
def test_optimize_preserves_outputs(tmp_path, kinds, seed):
    builder = GraphBuilder(seed)
    x = "x"
    for kind in kinds:
        x = builder.step(kind, x)
    builder.nodes.append(helper.make_node("Identity", [x], ["y"]))
    graph = helper.make_graph(builder.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], builder.inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10))
    source, target = tmp_path / "g.onnx", tmp_path / "g.opt.onnx"
    onnx.save(model, source)
    result = optimize_file(source, target)
    onnx.checker.check_model(onnx.load(target))
    assert result.nodes_after <= result.nodes_before
    feeds = {"x": np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)}
    (expected,), (actual,) = run_onnx(source, feeds), run_onnx(target, feeds)
    assert np.allclose(actual, expected, rtol=1e-5, atol=1e-5), (kinds, float(np.max(np.abs(actual - expected))))
