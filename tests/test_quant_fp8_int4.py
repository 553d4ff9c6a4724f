"""FP8 and INT4 weight-only on a real ViT (profiles/hf-vit-tiny.toml): ModelOpt's result runs on
onnxruntime's CPU provider, is as quantized as the entry says, and is measured against FP32."""


import onnx
import pytest

from pipeline.core.errors import InputError
from pipeline.core.profiles import load_profile
from pipeline.core.quiet import captured
from pipeline.core.samples import make_inputs, stack_batches, synthetic
from pipeline.core.seeds import CALIBRATION_SEED, HELD_OUT_SEED
from pipeline.export import export_model
from pipeline.optimize import optimize_file
from quant.accuracy import accuracy, model_outputs
from quant.fp8 import FP8_MIN_OPSET, quantize_fp8
from quant.int4 import eligible_gemms, quantize_int4
from quant.int8 import quantize_int8
from quant.presets import PRESETS, model_family


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    folder, profile = tmp_path_factory.mktemp("vit"), load_profile("hf-vit-tiny")
    export_model(profile, folder / "model.onnx")
    optimize_file(folder / "model.onnx", folder / "model.opt.onnx")
    held_out = stack_batches(profile, [make_inputs(profile, seed=HELD_OUT_SEED + i) for i in range(4)])
    return folder / "model.opt.onnx", synthetic(profile, 4, CALIBRATION_SEED), held_out


def test_vit_is_an_encoder(vit):
    assert model_family(onnx.load(str(vit[0]), load_external_data=False)) == "encoder"


def test_fp8_quantizes_gemm_inputs_to_e4m3_at_opset_21(vit, tmp_path):
    source, calibration, held_out = vit
    reference = model_outputs(source, held_out)
    with captured():
        result = quantize_fp8(source, tmp_path / "fp8.onnx", calibration, 1, held_out, reference=reference, min_cosine=0.99)
    model = onnx.load(str(tmp_path / "fp8.onnx"))
    assert result.opset == FP8_MIN_OPSET and result.method == "max" and result.calibration_samples == 8
    assert result.qdq["dequantize_types"] == {"FLOAT8E4M3FN": result.qdq["dequantize"]} and result.qdq["quantize"] > 0
    assert result.qdq["quantize"] == sum(n.op_type == "QuantizeLinear" for n in model.graph.node)
    # weights stored in FP8 behind a DequantizeLinear (pre-quantized, as TensorRT takes them): no Q reads a weight
    weights = {t.name: t.data_type for t in model.graph.initializer}
    assert not [n.name for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in weights]
    stored = [weights[n.input[0]] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in weights]
    assert stored and set(stored) == {onnx.TensorProto.FLOAT8E4M3FN} and len(stored) + result.qdq["quantize"] == result.qdq["dequantize"]
    # the figures are the written file's: recomputing them from it gives the same numbers
    assert result.accuracy == accuracy(reference, model_outputs(tmp_path / "fp8.onnx", held_out), 8)
    assert 0.99 < result.accuracy["cosine_centered"] < 1.0
    assert result.passed == (result.accuracy["cosine_centered"] >= result.min_cosine)
    # trt-fusion, in FP8 Q/DQ on the weighted layers' inputs alone: none of TensorRT's rules broken
    assert result.preset == "trt-fusion" and result.findings == []
    assert result.metrics()["lint"]["count"] == len(result.findings)


@pytest.mark.parametrize("method", ["awq_clip", "rtn_dq"])
def test_int4_is_weight_only_on_matmul_and_gemm(vit, tmp_path, method):
    source, calibration, held_out = vit
    with captured():
        result = quantize_int4(source, tmp_path / "int4.onnx", calibration, 1, held_out, method=method, min_cosine=0.98)
    model = onnx.load(str(tmp_path / "int4.onnx"))
    weights = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT4}
    dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    consumers = {c.op_type for n in dqs for c in model.graph.node if n.output[0] in c.input}
    assert result.method == method and result.opset >= 21 and result.qdq["quantize"] == 0
    assert {n.input[0] for n in dqs} == weights and consumers <= {"MatMul", "Gemm"}
    eligible = len(eligible_gemms(onnx.load(str(source))))
    # AWQ leaves the classifier Gemm (transB=1) in float and says so; RTN quantizes every eligible weight
    assert len(dqs) == (eligible - 1 if method == "awq_clip" else eligible)
    assert any("node_linear" in note for note in result.notes) == (method == "awq_clip")
    assert result.calibration_samples == (8 if method == "awq_clip" else 0)
    assert result.findings == [] and result.accuracy["cosine_centered"] > result.min_cosine


def test_fp8_leaves_an_encoders_residual_skips_in_float(tmp_path):
    """Under the transformer rules an FP8 Q/DQ is read by the weighted layers alone: trt-fusion's residual skips, which
    INT8 quantizes so the Add fuses into the GEMM, rounded to E4M3 at every layer, were most of FP8's error
    (quant/presets.py). ModelOpt's own placement quantizes the Adds' inputs."""
    profile = load_profile("hf-bert-tiny")
    export_model(profile, tmp_path / "model.onnx")
    optimize_file(tmp_path / "model.onnx", tmp_path / "model.opt.onnx")
    source, calibration = tmp_path / "model.opt.onnx", synthetic(profile, 4, CALIBRATION_SEED)
    held_out = stack_batches(profile, [make_inputs(profile, seed=HELD_OUT_SEED + i) for i in range(4)])
    reference = model_outputs(source, held_out)
    results = {}
    with captured():
        for preset in ("auto", "modelopt"):
            results[preset] = quantize_fp8(source, tmp_path / f"fp8-{preset}.onnx", calibration, 1, held_out, reference, preset, min_cosine=0.99)
        quantize_int8(source, tmp_path / "int8.onnx", calibration, 1, "auto", "fp32")

    def adds_reading_a_dq(path):
        graph = onnx.load(str(path)).graph
        dq = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
        return sum(n.op_type == "Add" and bool(dq & set(n.input)) for n in graph.node)

    fp8, adds = results["auto"], results["modelopt"]
    assert fp8.preset == "trt-fusion" and fp8.findings == []
    assert adds_reading_a_dq(tmp_path / "fp8-auto.onnx") == 0 < adds_reading_a_dq(tmp_path / "int8.onnx")
    assert adds_reading_a_dq(tmp_path / "fp8-modelopt.onnx") > 0
    assert 1 - fp8.accuracy["cosine_centered"] < (1 - adds.accuracy["cosine_centered"]) / 10


def test_a_preset_for_another_family_names_the_one_that_fits(vit, tmp_path):
    source, calibration, held_out = vit
    with pytest.raises(InputError, match="--preset cnn is written for cnn models, but this model is an encoder .*use --preset trt-fusion"):
        quantize_fp8(source, tmp_path / "fp8.onnx", calibration, 1, held_out, preset_name="cnn", min_cosine=0.99)
    assert not (tmp_path / "fp8.onnx").exists() and {p.family for p in PRESETS.values()} == {None, "cnn", "decoder"}
