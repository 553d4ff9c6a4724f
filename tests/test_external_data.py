"""Models with external data (weights in `<name>.data` beside the model), forced on a small model with
$PIPELINE_EXTERNAL_DATA_BYTES=0 instead of a 2 GB one: every stage reads and writes them, each data file
is named after its model, the folder copied elsewhere still loads, and the manifest's sha256 covers the data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import SMALL_MLP_PROFILE, run_cli

from pipeline.core.errors import InputError
from pipeline.core.fileio import sha256_file
from pipeline.core.onnxfile import EXTERNAL_DATA_ENV, atomic_onnx, external_tensors, save_onnx
from pipeline.core.verify import OnnxSession

MODELS = ("model.onnx", "model.opt.onnx", "model.fp16.onnx", "model.int8.onnx", "model.fp8.onnx", "model.int4.onnx", "model.bf16.onnx")
RUN_ON_CPU = MODELS[:-1]  # onnxruntime's CPU provider has no BF16 MatMul
PROFILE = SMALL_MLP_PROFILE.replace("[quant]", '[quant]\nint4_method = "rtn_dq"  # AWQ cannot quantize a Gemm with transB=1')


def _locations(path: Path) -> set[str]:
    return {location for _, location, _, _ in external_tensors(onnx.load(str(path), load_external_data=False))}


def _outputs(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return OnnxSession(path).run(feeds)


def _build(*args: str, cwd: Path):
    """`python -m pipeline build ARGS` with every model written with external data."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(EXTERNAL_DATA_ENV, "0")
        return run_cli("build", "--profile", "small.toml", *args, "--out", "out", cwd=cwd)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """`build` of the small MLP at every precision with every model written with external data."""
    root = tmp_path_factory.mktemp("external")
    (root / "small.toml").write_text(PROFILE)
    result = _build("--fp16", "--int8", "--fp8", "--int4", "--bf16", cwd=root)
    assert result.returncode == 0, result.stderr
    return root / "out"


def test_every_model_of_a_build_keeps_its_weights_in_a_data_file_named_after_it(built):
    for name in MODELS:
        assert _locations(built / name) == {f"{name}.data"}, name
        assert (built / f"{name}.data").stat().st_size > 0
    assert [p.name for p in built.iterdir() if p.name.endswith(".tmp")] == []


def test_the_models_copied_elsewhere_load_and_give_the_same_outputs(built, tmp_path):
    copy = shutil.copytree(built, tmp_path / "moved")
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 32), dtype=np.float32)}
    shutil.rmtree(built.parent / "elsewhere", ignore_errors=True)
    built.rename(built.parent / "elsewhere")  # the original folder is gone: the copy must not read from it
    try:
        for name in MODELS:
            assert onnx.load(str(copy / name)) == onnx.load(str(built.parent / "elsewhere" / name)), name
        for name in RUN_ON_CPU:
            np.testing.assert_array_equal(_outputs(copy / name, feeds)[0], _outputs(built.parent / "elsewhere" / name, feeds)[0])
        fp32 = _outputs(copy / "model.onnx", feeds)[0]
        np.testing.assert_allclose(_outputs(copy / "model.opt.onnx", feeds)[0], fp32, atol=1e-6)
        np.testing.assert_allclose(_outputs(copy / "model.fp16.onnx", feeds)[0], fp32, atol=2e-2)
    finally:
        (built.parent / "elsewhere").rename(built)


def test_the_manifest_hash_covers_the_data_file(built):
    stages = {s["name"]: s for s in json.loads((built / "manifest.json").read_text())["stages"]}
    recorded = stages["optimize"]["output_sha256"]["onnx"]
    assert sha256_file(built / "model.opt.onnx") == recorded
    data = built / "model.opt.onnx.data"
    original = data.read_bytes()
    data.write_bytes(bytes([original[0] ^ 1]) + original[1:])  # the model file itself is untouched
    try:
        assert sha256_file(built / "model.opt.onnx") != recorded
        rerun = _build("--until", "optimize", cwd=built.parent)
        assert rerun.returncode == 0, rerun.stderr
        assert "outputs were changed or removed" in rerun.stdout
        assert data.read_bytes() == original  # optimize wrote it again
    finally:
        data.write_bytes(original)


def _mlp(rng: np.random.Generator) -> onnx.ModelProto:
    weight = onnx.numpy_helper.from_array(rng.standard_normal((64, 64), dtype=np.float32), "w")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 64])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 64])], [weight])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def test_optimize_reads_external_weights_under_the_threshold(tmp_path):
    """A user's model with external data, written inline by optimize (it failed: 'serialized 123 bytes, expected ...')."""
    from pipeline.optimize import optimize_file

    source = tmp_path / "user.onnx"
    onnx.save_model(_mlp(np.random.default_rng(1)), str(source), save_as_external_data=True, location="weights.bin", size_threshold=0)
    optimize_file(source, tmp_path / "opt.onnx")
    assert _locations(tmp_path / "opt.onnx") == set()
    feeds = {"x": np.ones((2, 64), np.float32)}
    np.testing.assert_array_equal(_outputs(tmp_path / "opt.onnx", feeds)[0], _outputs(source, feeds)[0])


def test_save_onnx_leaves_the_model_with_its_weights(tmp_path, monkeypatch):
    monkeypatch.setenv(EXTERNAL_DATA_ENV, "0")
    model = _mlp(np.random.default_rng(2))
    before = model.SerializeToString()
    save_onnx(model, tmp_path / "m.onnx")
    assert model.SerializeToString() == before
    assert _locations(tmp_path / "m.onnx") == {"m.onnx.data"}


def test_a_writer_naming_its_data_otherwise_is_gathered_into_the_model_data_file(tmp_path, monkeypatch):
    monkeypatch.setenv(EXTERNAL_DATA_ENV, "0")
    with atomic_onnx(tmp_path / "m.onnx") as tmp:  # as torch's TorchScript exporter does: a file per weight
        onnx.save_model(_mlp(np.random.default_rng(3)), str(tmp), save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    assert _locations(tmp_path / "m.onnx") == {"m.onnx.data"}


def test_a_failed_write_leaves_the_earlier_model_and_its_data(tmp_path, monkeypatch):
    monkeypatch.setenv(EXTERNAL_DATA_ENV, "0")
    target = tmp_path / "m.onnx"
    with atomic_onnx(target) as tmp:
        save_onnx(_mlp(np.random.default_rng(4)), tmp)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(RuntimeError), atomic_onnx(target) as tmp:
        save_onnx(_mlp(np.random.default_rng(5)), tmp)
        raise RuntimeError("the check after writing failed")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


def test_an_inline_model_replacing_one_with_data_takes_its_data_file_away(tmp_path, monkeypatch):
    target = tmp_path / "m.onnx"
    monkeypatch.setenv(EXTERNAL_DATA_ENV, "0")
    with atomic_onnx(target) as tmp:
        save_onnx(_mlp(np.random.default_rng(6)), tmp)
    monkeypatch.delenv(EXTERNAL_DATA_ENV)
    with atomic_onnx(target) as tmp:
        save_onnx(_mlp(np.random.default_rng(6)), tmp)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_threshold_that_is_not_a_number_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(EXTERNAL_DATA_ENV, "2GB")
    with pytest.raises(InputError, match="PIPELINE_EXTERNAL_DATA_BYTES='2GB': not a number of bytes"):
        save_onnx(_mlp(np.random.default_rng(7)), tmp_path / "m.onnx")


def test_compare_infers_the_types_of_a_model_past_the_limit_without_its_weights(monkeypatch):
    """Shape inference serializes the model, which protobuf refuses past 2 GB: a large model's types come from it without weights."""
    from pipeline.diagnose import exposed

    model = _mlp(np.random.default_rng(8))
    whole = exposed.tensor_types(model, {"x": np.ones((2, 64), np.float32)})
    monkeypatch.setattr(exposed, "SAVE_EXTERNAL_BYTES", 0)
    assert exposed.tensor_types(model, {"x": np.ones((2, 64), np.float32)}) == whole
    assert len(model.graph.initializer[0].raw_data) == 64 * 64 * 4  # the model itself keeps its weights


@pytest.mark.parametrize("external", [True, False])
def test_modelopt_keeps_its_copies_of_a_model_with_external_data_in_data_files_too(tmp_path, monkeypatch, external):
    """ModelOpt decides inline or external from the model's size before it copies each shared weight: Qwen2.5-0.5B's tied
    embedding took its 1.9 GB past protobuf's 2 GB in ModelOpt's GEMV check ("Failed to serialize proto"). A model whose
    weights are in a data file is given to ModelOpt with its intermediates in data files too; an inline one as before."""
    import modelopt.onnx.quantization as modelopt_quantization

    from quant.int8 import quantize_int8

    given, real = [], modelopt_quantization.quantize
    monkeypatch.setattr(modelopt_quantization, "quantize", lambda **kwargs: given.append(kwargs["use_external_data_format"]) or real(**kwargs))
    source = tmp_path / "user.onnx"
    onnx.save_model(_mlp(np.random.default_rng(4)), str(source), save_as_external_data=external, size_threshold=0)
    calibration = {"x": np.random.default_rng(5).standard_normal((16, 64), dtype=np.float32)}
    result = quantize_int8(source, tmp_path / "int8.onnx", calibration, 2, "gemm-only", "fp32")
    assert given == [external] and result.qdq_pairs > 0
    feeds = {"x": calibration["x"][:2]}
    np.testing.assert_allclose(_outputs(tmp_path / "int8.onnx", feeds)[0], _outputs(source, feeds)[0], atol=0.5)


def test_a_model_is_sized_a_part_at_a_time_as_protobuf_cannot_size_one_past_2_gb():
    """save_onnx decides inline or external by the model's bytes: `ByteSize()` of the whole model raised EncodeError on the
    0.5B decoder's INT8 model in memory (past 2 GB), an internal error after ModelOpt's 137 s. Counted by weights and
    nodes (a Constant node's tensor too), the figure is the whole model's but for its few bytes of framing."""
    from pipeline.core.onnxfile import proto_bytes

    model = _mlp(np.random.default_rng(6))
    constant = onnx.numpy_helper.from_array(np.ones(1000, np.float32), "c")
    model.graph.node.append(onnx.helper.make_node("Constant", [], ["c"], value=constant))
    assert proto_bytes(model) > 64 * 64 * 4 + 1000 * 4
    assert 0 <= model.ByteSize() - proto_bytes(model) < 200
