"""The fp8, int4 and bf16 stages (issue 25) through `build --until <stage>` on small real models, the
FP8 engine's compute-capability requirement, and the cnn preset removing what the lint rejects."""

import json

import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper


def _records(out):
    return {s["name"]: s for s in json.loads((out / "manifest.json").read_text())["stages"]}


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    """hf-vit-tiny built stage by stage: --until fp8, then int4, then bf16 and the build stage."""
    out = tmp_path_factory.mktemp("vit") / "o"
    runs = {}
    for until in ("fp8", "int4", "build"):
        runs[until] = run_cli("build", "--profile", "hf-vit-tiny", "--fp8", "--int4", "--bf16", "--until", until, "--out", str(out))
        assert runs[until].returncode == 0, runs[until].stderr
    return out, runs


def test_a_stage_keeps_its_log_only_when_the_libraries_said_something(vit):
    """Issue 36: an empty int8.log / fp8.log per stage was noise; a log that is kept is recorded as the stage's output."""
    out, _ = vit
    logs = {path.name: path.stat().st_size for path in out.glob("*.log")}
    assert all(size > 0 for size in logs.values()), logs
    for name, record in _records(out).items():
        assert ("log" in record["outputs"]) == (f"{name}.log" in logs), name


def test_fp8_stage_writes_fp8_qdq_at_opset_21_gated(vit):
    out, runs = vit
    fp8 = _records(out)["fp8"]
    assert fp8["status"] in ("done", "cached") and fp8["metrics"]["opset"] >= 21
    model = onnx.load(str(out / "model.fp8.onnx"))
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 21
    assert "FLOAT8E4M3FN" in fp8["metrics"]["qdq"]["dequantize_types"] and fp8["metrics"]["qdq"]["quantize"] > 0
    assert fp8["metrics"]["accuracy"]["cosine_centered"] >= fp8["metrics"]["min_cosine"] == 0.99
    assert fp8["metrics"]["method"] == "max" and fp8["metrics"]["calibration"].startswith("synthetic, 16 feeds at profile ")
    assert "int4 " not in runs["fp8"].stdout  # --until fp8 stops there


def test_int4_stage_quantizes_matmul_weights_only(vit):
    out, _ = vit
    int4 = _records(out)["int4"]["metrics"]
    assert int4["qdq"]["quantize"] == 0 and int4["qdq"]["dequantize"] > 0  # weight-only: DQ of INT4 weights
    assert set(int4["qdq"]["dequantize_types"]) == {"INT4"}
    assert int4["method"] == "awq_clip" and int4["accuracy"]["cosine_centered"] >= int4["min_cosine"] == 0.98


def test_bf16_stage_is_written_unchecked_on_a_cpu_and_says_why(vit):
    out, _ = vit
    bf16 = _records(out)["bf16"]["metrics"]
    model = onnx.load(str(out / "model.bf16.onnx"))
    assert any(i.data_type == TensorProto.BFLOAT16 for i in model.graph.initializer)
    assert "no BF16 kernels" in bf16["accuracy"]["not_compared"]
    predicted = json.loads((out / "model.bf16.predicted.json").read_text())  # the engine predicted from the ONNX, as FP16's is
    assert predicted["predicted"] is True and bf16["predicted"]["layers"] == len(predicted["layers"]) > 0


def test_bf16_on_a_gpu_whose_onnxruntime_cannot_run_it_is_written_unchecked_not_failed(vit, tmp_path, monkeypatch):
    """With a GPU, BF16 is checked on onnxruntime's CUDA provider. Where that provider cannot run it (here
    onnxruntime-gpu lists CUDA but, with no CUDA libraries, falls back to the CPU), the file is written unchecked
    and says why. Before, the check ran on the CPU provider on every GPU machine, and the stage failed there."""
    from pipeline.core import devices
    from quant.fp16 import convert_bf16

    monkeypatch.setattr(devices, "cuda_device_present", lambda: True)
    result = convert_bf16(vit[0] / "model.opt.onnx", tmp_path / "model.bf16.onnx", [], [], [])
    assert result.session is None and "onnxruntime's CUDAExecutionProvider cannot run it here" in result.unchecked
    assert any(i.data_type == TensorProto.BFLOAT16 for i in onnx.load(str(tmp_path / "model.bf16.onnx")).graph.initializer)


def test_a_gpu_without_onnxruntimes_cuda_provider_is_named(monkeypatch):
    import onnxruntime

    from pipeline.core import devices

    monkeypatch.setattr(devices, "cuda_device_present", lambda: False)
    assert devices.onnxruntime_cuda_missing() == "no CUDA GPU here"
    monkeypatch.setattr(devices, "cuda_device_present", lambda: True)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert "has no CUDA provider (install onnxruntime-gpu)" in devices.onnxruntime_cuda_missing()
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert devices.onnxruntime_cuda_missing() is None


def test_the_build_stage_records_the_fp8_requirement_and_never_fails(vit):
    out, runs = vit
    build = _records(out)["build"]
    assert build["status"] == "skipped" and runs["build"].returncode == 0
    assert build["metrics"]["fp8"]["requires_compute_capability"] == "8.9" and "compute capability 8.9+" in build["reason"]
    assert "--fp8 --int4 --bf16" in build["reason"]  # the command that reruns it where TensorRT is
    assert runs["build"].stdout.count("docker run") == 1  # the requirement sits before the command, which is printed once


def test_fp8_engines_are_skipped_below_compute_capability_8_9():
    from pipeline.precisions import by_name
    from trt.capability import below_compute_capability

    needs = by_name("fp8").min_compute_capability
    assert needs == (8, 9)
    assert "this GPU is 8.6" in below_compute_capability("FP8", needs, (8, 6))
    assert "no GPU's capability" in below_compute_capability("FP8", needs, None)
    assert below_compute_capability("FP8", needs, (8, 9)) is None
    assert below_compute_capability("FP8", needs, (9, 0)) is None


def test_fp8_with_the_cnn_preset_leaves_no_lint_finding_on_a_resnet(tmp_path):
    """Regression: the preset's residual edit left a Q/DQ nobody read, which made the lint (reading the
    edited graph) see the Add's other input as shared and flag the kept Q/DQ as qdq-after-gemm."""
    out = tmp_path / "o"
    result = run_cli("build", "--profile", "hf-resnet-tiny", "--fp8", "--preset", "cnn", "--until", "fp8", "--out", str(out))
    assert result.returncode == 0, result.stderr
    fp8 = _records(out)["fp8"]["metrics"]
    assert fp8["lint"]["count"] == 0, json.loads((out / "fp8.lint.json").read_text())
    assert fp8["qdq"]["quantize"] > 0


def _conv_q_transpose_dq_relu() -> onnx.ModelProto:
    """Conv -> Q -> Transpose -> DQ -> Relu: an FP8 Q/DQ split by data movement on a Conv's output."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    scale = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    zero = helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "s", "z"], ["q"], name="c_q"),
             helper.make_node("Transpose", ["q"], ["t"], name="move", perm=[0, 1, 3, 2]),
             helper.make_node("DequantizeLinear", ["t", "s", "z"], ["d"], name="c_dq"),
             helper.make_node("Relu", ["d"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w, scale, zero])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_the_cnn_preset_removes_a_qdq_the_lint_sees_through_a_transpose():
    import onnxruntime as ort

    from quant.lint import lint_model
    from quant.presets import PRESETS, apply_preset

    model = _conv_q_transpose_dq_relu()
    assert [f.rule for f in lint_model(model, rules=PRESETS["cnn"].rules)] == ["qdq-after-gemm"]
    assert apply_preset(PRESETS["cnn"], model) == ["c_q", "c_dq"]
    assert lint_model(model, rules=PRESETS["cnn"].rules) == []
    assert [n.op_type for n in model.graph.node] == ["Conv", "Transpose", "Relu"]  # the data movement stays, in float
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    conv = onnx.helper.make_model(onnx.helper.make_graph(model.graph.node[:1], "c", list(model.graph.input),
                                                         [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 4, 8, 8])],
                                                         list(model.graph.initializer)), opset_imports=list(model.opset_import), ir_version=10)
    expected = np.maximum(ort.InferenceSession(conv.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0], 0)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected.transpose(0, 1, 3, 2), rtol=1e-6)


@pytest.mark.parametrize("written, name", [("FP8", "FP8"), ("kFP8", "FP8"), ("Int4", "INT4"), ("kINT4", "INT4"), ("BFloat16", "BF16"),
                                           ("kBF16", "BF16"), ("Half", "FP16"), ("Int8", "INT8")])
def test_trt_precision_names_of_the_new_precisions(written, name):
    """TensorRT's spellings in layer information and profiles map to the names the reports use."""
    from trt.plan import normalize_dtype

    assert normalize_dtype(written) == name


@pytest.mark.parametrize("capability, fp8_built", [((8, 6), False), ((9, 0), True)])
def test_the_build_stage_builds_fp8_only_from_compute_capability_8_9(vit, tmp_path, monkeypatch, capability, fp8_built):
    """With TensorRT present (the builder stubbed: no TensorRT here), an 8.6 GPU builds every engine but FP8's
    and records why; a 9.0 GPU builds FP8's too, from model.fp8.onnx. The run never fails."""
    import shutil

    from rich.console import Console

    import pipeline.stages.build as build
    import trt.builders
    import trt.capability
    from pipeline.core.manifest import Manifest
    from pipeline.core.profiles import load_profile
    from pipeline.runner import Runner
    from pipeline.settings import Options
    from pipeline.stage import Context

    built = {}

    def fake_build(builder, onnx_path, paths, *args):
        built[paths.engine.stem] = onnx_path.name
        return {"layers": 1}

    monkeypatch.setattr(trt.capability, "tensorrt_missing", lambda: None)
    monkeypatch.setattr(trt.capability, "compute_capability", lambda: capability)
    monkeypatch.setattr(trt.builders, "build_and_profile", fake_build)
    monkeypatch.setattr(build, "_engine_accuracy", lambda *args: {"not_compared": "stubbed"})
    out = tmp_path / "o"
    shutil.copytree(vit[0], out)
    profile = load_profile("hf-vit-tiny")
    ctx = Context(profile, out, Manifest.load_or_new(out / "manifest.json", profile.name), Options(frozenset({"fp8", "int4", "bf16"})))
    (record,) = Runner(ctx, Console(file=open(tmp_path / "c.txt", "w"))).run([build.STAGE])
    assert record.status == "done"
    assert built == {"fp32": "model.opt.onnx", "int4": "model.int4.onnx", "bf16": "model.bf16.onnx",
                     **({"fp8": "model.fp8.onnx"} if fp8_built else {})}
    if not fp8_built:
        assert record.metrics["fp8"] == {"skipped": "FP8 engines need a GPU of compute capability 8.9+ (Ada, Hopper, Blackwell); this GPU is 8.6",
                                         "requires_compute_capability": "8.9"}


def test_an_fp16_gate_failure_says_how_to_find_the_nodes_that_lose_accuracy(tmp_path):
    """With this build's model and profile in the commands (a new user found `--profile P` placeholders), and an
    overflow called one, not 'cosine_centered=nan'."""
    from pipeline.core.errors import StageFailed
    from pipeline.core.profiles import load_profile
    from pipeline.stages.shared import fp16_gate_hint, gate

    hint = fp16_gate_hint(tmp_path / "model.opt.onnx", load_profile("bert-tiny"))
    figures = {"cosine_centered": 0.998, "cosine": 0.998, "max_abs_diff": 0.3, "samples": 16}
    with pytest.raises(StageFailed, match=r"fp16_exclude_nodes or fp16_exclude_op_types.*quantize \S+model.opt.onnx -o fp16.onnx --fp16 "
                                          r"--profile bert-tiny.*compare"):
        gate("fp16", figures, 0.999, hint)
    from pipeline.stages.int4 import HINTS

    with pytest.raises(StageFailed, match=r'try \[quant\] int4_method = "awq_clip" .*, or --int8/--fp8 for this model, or lower this gate: '
                                          r"\[quant\] min_cosine_int4 in the profile"):
        gate("int4", figures, 0.999, HINTS["rtn_dq"])
    with pytest.raises(StageFailed, match=r"fp16: the FP16 model.s outputs hold NaN or Inf .*\(an overflow"):
        gate("fp16", {**figures, "cosine_centered": float("nan")}, 0.999, hint)


def test_fp16_of_a_torch_transformer_encoder_exported_by_dynamo(tmp_path):
    """Its CastLike (the SDPA scale) made AutoCast write a model onnxruntime refused; optimize turns it into a Cast."""
    from conftest import run_cli

    (tmp_path / "enc.toml").write_text('name = "enc"\n[model]\nfactory = "factories:tiny_transformer_encoder"\n[dims.batch]\nmin = 1\nopt = 2\n'
                                       'max = 4\n[dims.seq]\nmin = 1\nopt = 8\nmax = 16\n[[inputs]]\nname = "src"\ndtype = "float32"\n'
                                       'shape = ["batch", "seq", 32]\n')
    result = run_cli("build", "--profile", "enc.toml", "--fp16", "--until", "fp16", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    stages = {s["name"]: s for s in json.loads((tmp_path / "artifacts" / "enc" / "manifest.json").read_text())["stages"]}
    assert any(r["rule"] == "castlike-to-cast" and r["applied"] for r in stages["optimize"]["metrics"]["rules"])
    assert stages["fp16"]["status"] == "done"


def test_a_converted_model_onnxruntime_cannot_load_is_a_failed_stage_not_bad_input(tmp_path):
    """AutoCast's output is our file: its load failure is exit 1 naming the stage, not the temporary path."""
    import onnx
    from onnx import TensorProto, helper

    from pipeline.core.errors import StageFailed
    from quant.fp16 import check_runs

    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / ".model.fp16.onnx.abc123.tmp"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    with pytest.raises(StageFailed, match=r"^fp16: ModelOpt AutoCast wrote a model onnxruntime cannot load \(.*NoSuchOp.*\); keep the node") as info:
        check_runs(path, [{"x": np.zeros(2, np.float32)}], "fp16")
    assert str(path) not in str(info.value)


def test_a_precision_stage_that_quantizes_nothing_fails(tmp_path):
    """Issue 36: `build --fp8` on a small CNN said done with 0 Q / 0 DQ (the cnn preset removed the one pair ModelOpt
    placed). A stage whose model has no quantized node fails with why (exit 1) and leaves no model.fp8.onnx."""
    from conftest import run_cli, write_profile

    profile = write_profile(tmp_path, 'name = "tiny-cnn"\n[model]\nfactory = "factories:tiny_cnn"\n[dims.batch]\nmin = 1\nopt = 2\nmax = 4\n'
                                      '[[inputs]]\nname = "x"\ndtype = "float32"\nshape = ["batch", 3, 16, 16]\n')
    result = run_cli("build", "--profile", str(profile), "--fp8", "--until", "fp8", "--out", str(tmp_path / "out"))
    assert result.returncode == 1 and "fp8: no node was quantized, so nothing of this model would run in FP8" in result.stderr
    assert "preset cnn removed 2 Q/DQ node(s)" in result.stderr and not (tmp_path / "out" / "model.fp8.onnx").exists()
