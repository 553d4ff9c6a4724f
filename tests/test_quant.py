"""Precision stages on the real bert-tiny: presets place Q/DQ as they claim, the accuracy gate
fails when it should, and `build --fp16 --int8` records what the issue asks for."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_cli

from pipeline.core.errors import InputError
from pipeline.core.profiles import load_profile
from pipeline.core.quiet import captured
from pipeline.core.samples import make_inputs, stack_batches, synthetic
from pipeline.core.seeds import CALIBRATION_SEED
from pipeline.optimize import optimize_file
from quant.accuracy import BackgroundOutputs, accuracy, model_outputs
from quant.int8 import quantize_int8
from quant.lint import lint_model
from quant.patterns import attention_state
from quant.presets import PRESETS, plan_preset


@pytest.fixture(scope="module")
def bert_tiny_opt(bert_tiny_torchscript, tmp_path_factory):
    path = tmp_path_factory.mktemp("opt") / "model.opt.onnx"
    optimize_file(bert_tiny_torchscript, path)
    return path


@pytest.fixture(scope="module")
def quantized(bert_tiny_opt, tmp_path_factory):
    folder, calibration = tmp_path_factory.mktemp("int8"), synthetic(load_profile("bert-tiny"), 8, CALIBRATION_SEED)
    models = {}
    for preset in [name for name, p in PRESETS.items() if p.family is None]:  # the family presets refuse bert-tiny (an encoder)
        with captured():
            quantize_int8(bert_tiny_opt, folder / f"{preset}.onnx", calibration, 1, preset, "fp32")
        models[preset] = onnx.load(str(folder / f"{preset}.onnx"))
    return models


class Graph:
    def __init__(self, model):
        self.nodes = list(model.graph.node)
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.consumers = {}
        for node in self.nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)

    def dequantized(self, tensor):
        node = self.producer.get(tensor)
        return node is not None and node.op_type == "DequantizeLinear"

    def residual_adds(self):
        """Adds whose inputs are a GEMM's bias Add (output projection / FFN output) and a skip tensor."""
        for node in self.nodes:
            if node.op_type != "Add" or not node.name.endswith(("mha/output/Add", "pos_ff/Add_1")):
                continue
            yield node


def test_modelopt_default_quantizes_the_gemm_side_of_residual_adds(quantized):
    graph = Graph(quantized["modelopt"])
    residuals = list(graph.residual_adds())
    assert len(residuals) == 24
    assert all(all(graph.dequantized(i) for i in add.input) for add in residuals)
    findings = lint_model(quantized["modelopt"])
    assert {f.rule for f in findings} == {"qdq-after-gemm"} and len(findings) == 24


def test_trt_fusion_quantizes_only_the_skip_side(quantized):
    graph = Graph(quantized["trt-fusion"])
    for add in graph.residual_adds():
        gemm_side = [i for i in add.input if "dense/Add" in i or "output/Add" in i]
        skip_side = [i for i in add.input if i not in gemm_side]
        assert gemm_side and not any(graph.dequantized(i) for i in gemm_side), add.name
        assert all(graph.dequantized(i) for i in skip_side), add.name
    # attention is never half quantized (that would break both TensorRT's INT8 and its float fused attention)
    assert attention_state(quantized["trt-fusion"]) in ("int8", "float")
    assert lint_model(quantized["trt-fusion"]) == []


def test_gemm_only_quantizes_only_matmul_and_gemm_inputs(quantized):
    graph = Graph(quantized["gemm-only"])
    activation_dqs = [n for n in graph.nodes if n.op_type == "DequantizeLinear" and graph.producer.get(n.input[0]) is not None]
    assert activation_dqs
    assert {c.op_type for n in activation_dqs for c in graph.consumers.get(n.output[0], [])} <= {"MatMul", "Gemm"}


def test_attention_is_left_in_float_when_fused_int8_attention_is_impossible(bert_tiny_opt):
    model = onnx.load(str(bert_tiny_opt), load_external_data=False)
    assert plan_preset(PRESETS["trt-fusion"], model, 40).disable_mha_qdq is False
    plan = plan_preset(PRESETS["trt-fusion"], model, 1024)
    assert plan.disable_mha_qdq is True and "sequence <= 512" in plan.notes[0]
    assert plan_preset(PRESETS["modelopt"], model, 1024).disable_mha_qdq is False


def test_accuracy_figures_separate_a_broken_model(bert_tiny_opt, quantized, tmp_path):
    profile = load_profile("bert-tiny")
    batches = stack_batches(profile, [make_inputs(profile, seed=s) for s in range(8)])
    good = tmp_path / "good.onnx"
    onnx.save(quantized["trt-fusion"], good)
    reference = model_outputs(bert_tiny_opt, batches)
    assert accuracy(reference, model_outputs(good, batches), 8)["cosine_centered"] >= 0.99
    broken = onnx.load(str(bert_tiny_opt))  # the score layer's weights zeroed: a constant score
    for init in broken.graph.initializer:
        if init.name == "match_model.score_layer.weight":
            init.raw_data = bytes(len(init.raw_data))
    onnx.save(broken, tmp_path / "broken.onnx")
    figures = accuracy(reference, model_outputs(tmp_path / "broken.onnx", batches), 8)
    assert figures["cosine"] > 0.99, "the plain cosine cannot see it"
    assert figures["cosine_centered"] < 0.5, "the gate's metric does"


def test_background_outputs_are_the_models_outputs(bert_tiny_opt):
    profile = load_profile("bert-tiny")
    batches = stack_batches(profile, [make_inputs(profile, seed=s) for s in range(8)])
    background = BackgroundOutputs(bert_tiny_opt, batches)
    np.testing.assert_allclose(np.concatenate(background.result()), np.concatenate(model_outputs(bert_tiny_opt, batches)), rtol=1e-6, atol=1e-7)
    assert background.served == 1 and background.seconds > 0


def test_background_outputs_raise_what_the_run_raised(bert_tiny_opt):
    from pipeline.core.errors import InputError

    background = BackgroundOutputs(bert_tiny_opt, [{"concat_ids": np.zeros((1, 8), np.int32)}])
    with pytest.raises(InputError, match="not in the profile's"):
        background.result()


def _matmul_chain(path: Path, depth: int = 24, width: int = 256) -> Path:
    """A model whose run takes long enough to be stopped in the middle: `depth` MatMuls in a row."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((width, width)) / width**0.5).astype(np.float32), f"w{i}") for i in range(depth)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", f"w{i}"], [f"h{i + 1}"]) for i in range(depth)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", width])],
                              [helper.make_tensor_value_info(f"h{depth}", TensorProto.FLOAT, ["n", width])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    return path


def test_cancel_stops_the_run_and_the_thread(tmp_path):
    from pipeline.core.errors import StageFailed

    model = _matmul_chain(tmp_path / "chain.onnx")
    batches = [{"x": np.ones((2048, 256), np.float32)}] * 200  # seconds of work: not done when cancel() comes
    background = BackgroundOutputs(model, batches)
    background.cancel()
    assert not background._thread.is_alive()
    with pytest.raises(StageFailed, match="terminate"):  # stopped by onnxruntime, not run to the end
        background.result()


def test_a_failed_stage_leaves_no_reference_run_behind(tmp_path, monkeypatch):
    """The FP32 reference starts beside the conversion; when the conversion fails, it is stopped and forgotten."""
    import threading

    from rich.console import Console

    import quant.fp16
    from pipeline.core.errors import StageFailed
    from pipeline.core.manifest import Manifest
    from pipeline.runner import Runner
    from pipeline.stage import Context
    from pipeline.stages import named

    def failing(*args, **kwargs):
        raise StageFailed("fp16: AutoCast failed (test)")

    monkeypatch.setattr(quant.fp16, "convert_fp16", failing)
    ctx = Context(load_profile("bert-tiny"), tmp_path, Manifest.load_or_new(tmp_path / "manifest.json", "bert-tiny"))
    with pytest.raises(StageFailed, match="AutoCast failed"):
        Runner(ctx, Console(file=open(tmp_path / "console.txt", "w"), width=200)).run([named("export"), named("optimize"), named("fp16")])
    assert not [t for t in threading.enumerate() if t.name == "fp32-reference"]
    assert ctx.cache == {}
    assert not (tmp_path / "model.fp16.onnx").exists()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("build")
    result = run_cli("build", "--fp16", "--int8", "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out, result


def test_build_fp16_int8_records_the_figures(built):
    out, result = built
    stages = {s["name"]: s for s in json.loads((out / "manifest.json").read_text())["stages"]}
    assert list(stages) == ["export", "optimize", "fp16", "int8", "build", "report", "diff", "bench"]
    assert stages["build"]["status"] == "skipped"  # no TensorRT on this machine (see test_trt_stages)
    fp16, int8 = stages["fp16"]["metrics"], stages["int8"]["metrics"]
    assert fp16["accuracy"]["cosine_centered"] >= 0.999 and fp16["accuracy"]["cosine"] >= 0.999
    assert int8["accuracy"]["cosine_centered"] >= 0.99 and int8["preset"] == "trt-fusion"
    assert int8["lint"] == {"count": 0, "by_rule": {}} and int8["qdq_pairs"] > 0 and int8["calibration_samples"] == 16
    for name in ("fp16", "int8"):  # the check's own time is on record, a part of its stage's
        assert 0 < stages[name]["metrics"]["accuracy"]["check_seconds"] < stages[name]["seconds"]
    # the FP32 reference runs once, beside the first stage's conversion; the int8 stage reuses it
    assert 0 < fp16["accuracy"]["reference_seconds"] < stages["fp16"]["seconds"] and int8["accuracy"]["reference_seconds"] == 0
    for name in ("fp16", "int8"):
        assert 0 <= stages[name]["metrics"]["accuracy"]["reference_wait_seconds"] <= stages[name]["metrics"]["accuracy"]["check_seconds"]
    for name in ("model.fp16.onnx", "model.int8.onnx"):
        onnx.checker.check_model(str(out / name))
    assert "lint findings" in result.stdout and json.loads((out / "int8.lint.json").read_text())["count"] == 0


def test_the_precision_stages_predict_their_engine(built):
    """Each precision stage writes the engine TensorRT will build from its model and says so on its line."""
    out, result = built
    stages = {s["name"]: s for s in json.loads((out / "manifest.json").read_text())["stages"]}
    for name in ("fp16", "int8"):
        assert stages[name]["metrics"]["predicted"] | {"verdict": None, "reasons": None} == {
            "layers": 88, "myelin_regions": 1, "standalone_qdq": 0, "verdict": None, "reasons": None}
        assert json.loads((out / f"model.{name}.predicted.json").read_text())["predicted"] is True
        assert stages[name]["outputs"]["predicted"].endswith(f"model.{name}.predicted.json")
    assert result.stdout.count("predicted engine: 88 layers, 1 Myelin region, 0 standalone Q/DQ") == 2


def test_int8_placements_predict_one_region_or_a_split_naming_the_qdq_that_cuts_it(quantized):
    """Our preset keeps bert-tiny one Myelin region; ModelOpt's default placement cuts it at the Q/DQ on each GEMM's
    output before its residual Add (TensorRT issue 4397), each of them a lint finding."""
    from quant.lint import family_rules
    from trt.predict import predict

    ours = predict(quantized["trt-fusion"], family_rules(quantized["trt-fusion"]))
    assert ours.myelin_regions == 1 and ours.breakdown.qdq_layers == []
    theirs = predict(quantized["modelopt"], family_rules(quantized["modelopt"]))
    cuts = {(r.layer, r.node) for r in theirs.reasons if r.kind == "cut" and r.rule == "qdq-after-gemm"}
    assert theirs.myelin_regions == len(cuts) + 1 and len(cuts) == len(theirs.breakdown.qdq_layers) == 24
    assert theirs.verdict.startswith("predicted INT8 engine: the network runs as 25 Myelin regions")
    reasons = {(r.rule, r.node) for r in theirs.reasons}
    findings = lint_model(quantized["modelopt"])
    assert findings and all(any((f.rule, node) in reasons for node in f.nodes) for f in findings)


def test_accuracy_gate_fails_the_stage_with_the_figures(built, tmp_path):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(built[0], out)  # the failure takes away model.int8.onnx: the other tests read the built folder
    result = run_cli("build", "--int8", "--min-cosine", "0.9999999", "--out", str(out))
    assert result.returncode == 1
    assert "int8: accuracy below the gate: cosine_centered=" in result.stderr and "< 0.9999999" in result.stderr
    stages = {s["name"]: s for s in json.loads((out / "manifest.json").read_text())["stages"]}
    assert stages["int8"]["status"] == "failed" and not (out / "model.int8.onnx").exists()


def test_compare_names_the_qdq_that_costs_accuracy(built):
    out, _ = built
    result = run_cli("compare", str(out / "model.opt.onnx"), str(out / "model.int8.onnx"), "--profile", "bert-tiny", "-f", "json")
    data = json.loads(result.stdout)
    growth = [n["growth"] for n in data["nodes"]]
    assert growth == sorted(growth, reverse=True) and data["compared_tensors"] > 300
    assert any(n["qdq"] and n["qdq"].endswith("QuantizeLinear") for n in data["nodes"][:10])
    text = run_cli("compare", str(out / "model.opt.onnx"), str(out / "model.fp16.onnx"), "--profile", "bert-tiny")
    assert text.returncode == 0 and "error at the outputs: " in text.stdout.splitlines()[0]


def test_quantize_and_lint_commands(built, tmp_path):
    out, _ = built
    assert run_cli("quantize", str(out / "model.opt.onnx"), "-o", str(tmp_path / "x.onnx")).returncode == 2  # no --fp16/--int8
    missing = run_cli("quantize", str(out / "model.opt.onnx"), "-o", str(tmp_path / "x.onnx"), "--int8")
    assert missing.returncode == 2 and "needs calibration data" in missing.stderr
    fp16 = run_cli("quantize", str(out / "model.opt.onnx"), "-o", str(tmp_path / "f.onnx"), "--fp16")
    assert fp16.returncode == 0 and (tmp_path / "f.onnx").exists()
    lint = run_cli("lint-qdq", str(out / "model.int8.onnx"), "-f", "json")
    assert lint.returncode == 0 and json.loads(lint.stdout)["count"] == 0


def test_each_model_is_loaded_into_onnxruntime_once_per_build(tmp_path, monkeypatch):
    """fp16 + int8 on bert-tiny through the real stages: the FP16 model's shape checks and accuracy
    runs share one session, the FP32 reference is computed once for both stages (issue 15)."""
    from rich.console import Console

    from pipeline.core import verify
    from pipeline.core.manifest import Manifest
    from pipeline.runner import Runner
    from pipeline.stage import Context
    from pipeline.stages import named

    opened: list[tuple[str, bool]] = []
    original = verify.OnnxSession.__init__

    def counting(self, path, as_written=False, threads=0, **options):
        opened.append((Path(path).name, as_written))
        original(self, path, as_written, threads, **options)

    monkeypatch.setattr(verify.OnnxSession, "__init__", counting)
    ctx = Context(load_profile("bert-tiny"), tmp_path, Manifest.load_or_new(tmp_path / "manifest.json", "bert-tiny"))
    records = Runner(ctx, Console(file=open(tmp_path / "console.txt", "w"), width=200)).run([named(n) for n in ("export", "optimize", "fp16", "int8")])
    assert [r.status for r in records] == ["done"] * 4
    checked = [name for name, as_written in opened if not as_written]  # the stages' own checks run the graph as written
    fp16 = [name for name in checked if "fp16" in name]
    assert len(fp16) == 1, f"the FP16 model was loaded {len(fp16)} times: {opened}"
    assert sum("int8" in name for name in checked) == 1
    assert checked.count("model.opt.onnx") == 1, f"the FP32 reference is computed once per build: {opened}"


def _mlp(path: Path, input_shape: list) -> None:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), f"w{i}") for i in range(2)]
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "w0"], ["h"], name="mm0"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
                               helper.make_node("MatMul", ["r", "w1"], ["Y"], name="mm1")], "mlp",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, input_shape)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [*input_shape[:-1], 32])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))  # IR 13: onnx 1.21's own


def test_quantize_int8_takes_a_model_whose_batch_dimension_has_no_name(tmp_path):
    """skl2onnx and other converters write a dynamic dimension with neither a size nor a name; ModelOpt 0.47
    fails on one (TypeError comparing None with 0). The copy ModelOpt gets has it named; the input is untouched.
    The model is IR 13, as onnx 1.21 writes: ModelOpt's IR 10 copy is written inside our work folder."""
    import hashlib

    from quant.ptq import name_anonymous_input_dims

    source = tmp_path / "anonymous.onnx"
    _mlp(source, [None, 8, 32])
    assert onnx.load(str(source)).ir_version > 10
    before = hashlib.sha256(source.read_bytes()).hexdigest()
    np.savez(tmp_path / "calib.npz", X=np.random.default_rng(1).standard_normal((16, 8, 32)).astype(np.float32))

    result = run_cli("quantize", str(source), "-o", str(tmp_path / "q.onnx"), "--int8", "--calib", str(tmp_path / "calib.npz"))
    assert result.returncode == 0, result.stderr
    quantized = onnx.load(str(tmp_path / "q.onnx"))
    assert sum(n.op_type == "QuantizeLinear" for n in quantized.graph.node) > 0 and "nothing was quantized" not in result.stdout
    assert quantized.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "X_dim0"
    assert hashlib.sha256(source.read_bytes()).hexdigest() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no work folder left"
    # the helper names exactly the anonymous dimensions
    model = onnx.load(str(source))
    assert name_anonymous_input_dims(model) == ["X_dim0"] and name_anonymous_input_dims(model) == []


def test_quantize_int8_fails_when_modelopt_quantized_nothing(tmp_path):
    """A 2-D MLP calibrated at batch 1 is all GEMV to ModelOpt: a model with no INT8 in it is not an INT8 model
    (issue 36): the command fails (exit 1), says why and what to do, and writes nothing."""
    _mlp(tmp_path / "mlp.onnx", ["batch", 32])
    np.savez(tmp_path / "calib.npz", X=np.random.default_rng(1).standard_normal((16, 32)).astype(np.float32))
    result = run_cli("quantize", str(tmp_path / "mlp.onnx"), "-o", str(tmp_path / "q.onnx"), "--int8", "--calib", str(tmp_path / "calib.npz"))
    assert result.returncode == 1, result.stderr
    assert "int8: no node was quantized" in result.stderr and "calibration batch (here 1" in result.stderr
    assert not (tmp_path / "q.onnx").exists()


def test_a_small_gemm_left_in_float_keeps_only_itself_in_float(tmp_path):
    """ModelOpt reads the GEMV / small-GEMM names it excludes as regular expressions matched at a name's start: JetMoE's
    router `node_linear` (N = 8 experts) took every `node_linear_*`, all its GEMMs, into float ("no node was quantized").
    Here `node_linear` (N = 8) stays in float, `node_linear_1` and `node_linear_10` beside it are quantized."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("router", (32, 8)), ("up", (32, 32)), ("down", (32, 32)))]
    nodes = [helper.make_node("MatMul", ["X", "router"], ["R"], name="node_linear"),
             helper.make_node("MatMul", ["X", "up"], ["h"], name="node_linear_1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "down"], ["Y"], name="node_linear_10")]
    graph = helper.make_graph(nodes, "routed", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 8, 32])],
                              [helper.make_tensor_value_info("R", TensorProto.FLOAT, ["batch", 8, 8]),
                               helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 8, 32])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "routed.onnx"))
    np.savez(tmp_path / "calib.npz", X=rng.standard_normal((16, 8, 32)).astype(np.float32))

    result = run_cli("quantize", str(tmp_path / "routed.onnx"), "-o", str(tmp_path / "q.onnx"), "--int8", "--preset", "gemm-only",
                     "--calib", str(tmp_path / "calib.npz"))
    assert result.returncode == 0, result.stderr
    quantized = onnx.load(str(tmp_path / "q.onnx")).graph
    dequantized = {o for n in quantized.node if n.op_type == "DequantizeLinear" for o in n.output}
    reads_int8 = {n.name: all(i in dequantized for i in n.input) for n in quantized.node if n.op_type == "MatMul"}
    assert reads_int8 == {"node_linear": False, "node_linear_1": True, "node_linear_10": True}


def test_quantize_prints_paths_and_origins_as_written(tmp_path):
    """Square brackets in a path or in the calibration's origin ("[quant] samples") are text, not rich markup."""
    _mlp(tmp_path / "mlp.onnx", ["batch", 32])
    (tmp_path / "mlp.toml").write_text('name = "mlp"\n[model]\nonnx = "mlp.onnx"\n[dims.batch]\nmin = 1\nopt = 4\nmax = 8\n'
                                       '[[inputs]]\nname = "X"\ndtype = "float32"\nshape = ["batch", 32]\n')
    result = run_cli("quantize", "mlp.onnx", "-o", "q[red].onnx", "--int8", "--profile", "mlp.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "wrote q[red].onnx: INT8" in result.stdout and "([quant] samples)" in result.stdout, result.stdout

def _attention_graph(nan_guard: bool):
    """Q x K^T -> Softmax -> [Where(IsNaN(p), 0, p), as torch's SDPA exports it] -> x V."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores_matmul"),
             helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1)]
    probs = "probs"
    if nan_guard:
        nodes += [helper.make_node("IsNaN", ["probs"], ["nan"], name="isnan"),
                  helper.make_node("Where", ["nan", "zero", "probs"], ["guarded"], name="guard")]
        probs = "guarded"
    nodes.append(helper.make_node("MatMul", [probs, "v"], ["context"], name="context_matmul"))
    shape = lambda *dims: [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in dims]
    graph = helper.make_graph(nodes, "attention", shape(("q", [1, 4, 8, 16]), ("kt", [1, 4, 16, 8]), ("v", [1, 4, 8, 16])),
                              shape(("context", [1, 4, 8, 16])), [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("nan_guard", [False, True])
def test_attention_matmuls_are_found_behind_sdpas_nan_guard(nan_guard):
    from quant.patterns import attention_matmuls

    assert attention_matmuls(_attention_graph(nan_guard)) == ["context_matmul", "scores_matmul"]


def test_auto_preset_is_the_preset_of_the_model_family(tmp_path):
    from onnx import TensorProto, helper

    from quant.presets import resolve_preset

    decoder = _attention_graph(False)
    decoder.graph.input.append(helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, [1, 2, "past_seq", 16]))
    conv = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])], "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], [helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], [0.1] * 108)]))
    assert [resolve_preset("auto", m).name for m in (decoder, conv, _attention_graph(False))] == ["decoder", "cnn", "trt-fusion"]
    # token ids looked up in an embedding, then a Conv1d and no attention (Mamba): a language model, not a CNN
    mamba = helper.make_model(helper.make_graph(
        [helper.make_node("Gather", ["embedding", "input_ids"], ["e"]), helper.make_node("Transpose", ["e"], ["t"], perm=[0, 2, 1]),
         helper.make_node("Conv", ["t", "w"], ["y"], group=4)], "mamba",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6])],
        [helper.make_tensor("embedding", TensorProto.FLOAT, [10, 4], [0.1] * 40), helper.make_tensor("w", TensorProto.FLOAT, [4, 1, 3], [0.1] * 12)]))
    assert resolve_preset("auto", mamba).name == "trt-fusion"
    assert resolve_preset("gemm-only", conv).name == "gemm-only"
    with pytest.raises(InputError, match="--preset 'fast': use one of auto, trt-fusion, modelopt, gemm-only, cnn, decoder"):
        resolve_preset("fast", conv)


def test_a_written_out_rms_norm_is_found_whole():
    """x * 1/sqrt(mean(x^2) + eps) * w, as the dynamo exporter writes Llama's RMSNorm: every node of it,
    and nothing of the MatMul that reads it."""
    from onnx import TensorProto, helper

    from quant.patterns import rms_norm_nodes

    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"], name="pow"), helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], name="mean"),
             helper.make_node("Add", ["ms", "eps"], ["ms_eps"], name="add_eps"), helper.make_node("Sqrt", ["ms_eps"], ["rms"], name="sqrt"),
             helper.make_node("Reciprocal", ["rms"], ["inv"], name="reciprocal"), helper.make_node("Mul", ["x", "inv"], ["normed"], name="normalize"),
             helper.make_node("Mul", ["w", "normed"], ["scaled"], name="weight"), helper.make_node("MatMul", ["scaled", "proj"], ["y"], name="proj")]
    constants = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]), helper.make_tensor("axes", TensorProto.INT64, [1], [-1]),
                 helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-6]), helper.make_tensor("w", TensorProto.FLOAT, [8], [1.0] * 8),
                 helper.make_tensor("proj", TensorProto.FLOAT, [8, 8], [0.1] * 64)]
    graph = helper.make_graph(nodes, "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], constants)
    assert rms_norm_nodes(helper.make_model(graph)) == ["add_eps", "mean", "normalize", "pow", "reciprocal", "sqrt"]

    # Gemma 3n, Gemma 4, EmbeddingGemma: x * pow(mean(x^2) + eps, -0.5), missed before (its x^2 and factor quantized)
    inverse = helper.make_node("Pow", ["ms_eps", "minus_half"], ["inv"], name="inverse_sqrt")
    nodes = [*nodes[:3], inverse, *nodes[5:]]
    constants.append(helper.make_tensor("minus_half", TensorProto.FLOAT, [], [-0.5]))
    graph = helper.make_graph(nodes, "rms", graph.input, graph.output, constants)
    assert rms_norm_nodes(helper.make_model(graph)) == ["add_eps", "inverse_sqrt", "mean", "normalize", "pow"]


def test_a_causal_mask_built_from_positions_makes_a_decoder():
    """A decoder exported without its cache has no past_key_values: its causal mask, key position <= query
    position over two Ranges, says what it is; one Range compared with a constant is no causal mask."""
    from onnx import TensorProto, helper

    from quant.patterns import builds_causal_mask
    from quant.presets import model_family

    def graph(second: str):
        nodes = [helper.make_node("Range", ["zero", "n", "one"], ["q"]), helper.make_node("Range", ["zero", "n", "one"], ["k"]),
                 helper.make_node("Unsqueeze", ["q", "axis1"], ["q_col"]), helper.make_node("Unsqueeze", [second, "axis0"], ["k_row"]),
                 helper.make_node("LessOrEqual", ["k_row", "q_col"], ["causal"]), helper.make_node("Cast", ["causal"], ["y"], to=TensorProto.FLOAT)]
        consts = [helper.make_tensor(name, TensorProto.INT64, dims, values) for name, dims, values in
                  (("zero", [], [0]), ("n", [], [4]), ("one", [], [1]), ("axis0", [1], [0]), ("axis1", [1], [1]), ("limit", [4], [2] * 4))]
        return helper.make_model(helper.make_graph(nodes, "mask", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])], consts))

    assert builds_causal_mask(graph("k")) and model_family(graph("k")) == "decoder"
    assert not builds_causal_mask(graph("limit")) and model_family(graph("limit")) == "encoder"


def test_decoder_calibration_applies_only_where_the_profile_gives_the_cache_and_token_ids(tmp_path):
    """A with-past model is calibrated through greedy steps only when the profile has past_seq and input_ids;
    a decoder fed embeddings (no input_ids) gets the profile's samples, not a crash."""
    from onnx import TensorProto, helper

    from quant.calibration import fed_as_decoder

    graph = helper.make_graph([helper.make_node("Identity", ["past_key_values.0.key"], ["present.0.key"])], "g",
                              [helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, ["batch", 2, "past_seq", 16])],
                              [helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, ["batch", 2, "past_seq", 16])])
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    dims = '[dims.batch]\nmin = 1\nopt = 1\nmax = 2\n[dims.past_seq]\nmin = 0\nopt = 4\nmax = 8\n'
    past = '[[inputs]]\nname = "past_key_values.0.key"\ndtype = "float32"\nshape = ["batch", 2, "past_seq", 16]\n'
    ids = '[[inputs]]\nname = "input_ids"\ndtype = "int64"\nshape = ["batch", 1]\nrange = [0, 10]\n'
    for name, text, expected in (("ids", ids + past, True), ("embeds", past, False)):
        (tmp_path / f"{name}.toml").write_text(f'name = "{name}"\n[model]\nonnx = "m.onnx"\n{dims}{text}')
        assert fed_as_decoder(load_profile(str(tmp_path / f"{name}.toml")), tmp_path / "m.onnx") is expected, name


def test_onnxruntime_failing_inside_modelopts_calibration_is_a_failed_stage_in_one_line(tmp_path):
    """ModelOpt calibrates on onnxruntime, whose errors are its own classes (RuntimeException, Fail, InvalidGraph),
    none a RuntimeError: one escaped as an internal error. A graph that reshapes to a fixed 4 rows, fed 3."""
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.core.errors import StageFailed
    from quant.calibration import calibration_reader
    from quant.ptq import run_modelopt

    weight = numpy_helper.from_array(np.random.default_rng(0).random((64, 64), dtype=np.float32), "w")
    rows = numpy_helper.from_array(np.array([4, 64], dtype=np.int64), "rows")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), helper.make_node("Reshape", ["y", "rows"], ["z"], name="to_four_rows")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 64])], [weight, rows])
    source = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), source)
    feeds = [{"x": np.ones((3, 64), dtype=np.float32)}]
    with pytest.raises(StageFailed, match=r"^int8: ModelOpt cannot quantize .*m\.onnx: RuntimeException: Reshape node 'to_four_rows': .*reshaped"):
        run_modelopt(source, tmp_path / "m.int8.onnx", "int8", quantize_mode="int8", calibration_method="max",
                     calibration_data_reader=calibration_reader(feeds, lambda *_: None))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # nothing half written beside it


def test_a_mixture_of_experts_router_stays_in_float_and_its_experts_are_quantized(tmp_path):
    """The GEMM whose scores a TopK picks experts from stays unquantized (trt-fusion, decoder), its input too, as ModelOpt's
    LLM recipes leave routers (default_disabled_quantizers: *mlp.gate.*, *block_sparse_moe.gate*): INT8 scores
    reorder experts whose scores are close. An attention-like MatMul -> Softmax -> MatMul is no router."""
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.core.graph import GraphIndex
    from quant.patterns import router_gemms

    rng = np.random.default_rng(0)
    weights = {"router_w": (32, 16), "up_w": (32, 64), "down_w": (64, 32)}
    nodes = [helper.make_node("MatMul", ["x", "router_w"], ["scores"], name="router"),
             helper.make_node("Softmax", ["scores"], ["probs"], name="probs", axis=-1),
             helper.make_node("TopK", ["probs", "k"], ["top", "chosen"], name="pick", axis=-1),
             helper.make_node("MatMul", ["x", "up_w"], ["h"], name="up"), helper.make_node("Relu", ["h"], ["a"], name="act"),
             helper.make_node("MatMul", ["a", "down_w"], ["y"], name="down")]
    graph = helper.make_graph(nodes, "moe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32]),
                               helper.make_tensor_value_info("top", TensorProto.FLOAT, ["batch", 2])],
                              [*(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name) for name, shape in weights.items()),
                               numpy_helper.from_array(np.array([2], np.int64), "k")])
    source = tmp_path / "moe.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), source)
    assert router_gemms(onnx.load(source)) == ["router"]
    attention = onnx.load(source)
    attention.graph.node[2].CopyFrom(helper.make_node("MatMul", ["probs", "router_w_t"], ["top"], name="context"))
    assert router_gemms(attention) == []

    calibration = {"x": rng.standard_normal((16, 32)).astype(np.float32)}
    result = quantize_int8(source, tmp_path / "int8.onnx", calibration, 4, "trt-fusion", "fp32")
    quantized = GraphIndex.of(onnx.load(tmp_path / "int8.onnx"))
    fed_by_dq = {n.name: any(quantized.producer(i) is not None and quantized.producer(i).op_type == "DequantizeLinear" for i in n.input)
                 for n in quantized.nodes if n.op_type == "MatMul"}
    assert fed_by_dq == {"router": False, "up": True, "down": True}  # the router read the Q/DQ of x its expert shares
    assert "mixture-of-experts routers (a TopK picks from their scores) left in higher precision: 1 node(s)" in result.notes
