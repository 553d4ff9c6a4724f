"""Calibration data: a user's .npz is checked against the model's inputs, one clear error per problem."""

import numpy as np
import onnx
import pytest
from conftest import run_cli, write_profile
from onnx import TensorProto, helper

from pipeline.core.errors import InputError
from pipeline.core.profiles import load_profile
from pipeline.core.samples import load_npz, model_inputs, split, synthetic


@pytest.fixture
def model(tmp_path):
    nodes = [helper.make_node("Cast", ["ids"], ["idf"], to=TensorProto.FLOAT), helper.make_node("Add", ["idf", "x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT32, ["batch", 4]),
                                           helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    return path


def good(rows=3):
    return {"ids": np.arange(rows * 4, dtype=np.int32).reshape(rows, 4), "x": np.ones((rows, 4), np.float32)}


def test_a_good_file_loads(tmp_path, model):
    np.savez(tmp_path / "c.npz", **good())
    data = load_npz(tmp_path / "c.npz", model_inputs(model))
    assert data["ids"].shape == (3, 4) and len(split(data, 1)) == 3


@pytest.mark.parametrize(
    ("arrays", "expected"),
    [
        ({"ids": good()["ids"]}, "no array for model input 'x'"),
        ({**good(), "ids": good()["ids"].astype(np.int64)}, "input 'ids' has dtype int64, the model expects int32"),
        ({**good(), "x": np.ones((3, 5), np.float32)}, r"input 'x' has shape \[3, 5\], the model expects \[samples, 4\]"),
        ({**good(), "x": np.where(np.eye(3, 4) > 0, np.nan, 1).astype(np.float32)}, "input 'x' contains NaN or Inf at flat index 0"),
        ({**good(), "x": np.ones((2, 4), np.float32)}, "inputs have different sample counts"),
    ],
)
def test_bad_files(tmp_path, model, arrays, expected):
    np.savez(tmp_path / "c.npz", **arrays)
    with pytest.raises(InputError, match=expected):
        load_npz(tmp_path / "c.npz", model_inputs(model))


def test_pickled_objects_are_refused(tmp_path, model):
    np.savez(tmp_path / "c.npz", ids=np.array([{"evil": 1}], dtype=object), x=good()["x"])
    with pytest.raises(InputError, match="holds Python objects \\(pickled\\), which are refused"):
        load_npz(tmp_path / "c.npz", model_inputs(model))


def test_not_an_npz(tmp_path, model):
    (tmp_path / "c.npz").write_text("hello")
    with pytest.raises(InputError, match="not an .npz file \\(not a zip archive\\)"):
        load_npz(tmp_path / "c.npz", model_inputs(model))


def test_synthetic_samples_are_valid_for_the_profile():
    profile = load_profile("bert-tiny")
    data = synthetic(profile, 5, seed=0)
    assert data["concat_ids"].shape == (5, 40) and data["concat_ids"].dtype == np.int32
    assert 0 <= data["concat_ids"].min() and data["concat_ids"].max() < 8192
    assert data["concat_mask"].dtype == np.bool_ and data["concat_mask"][:, 0].all()
    assert (data["pos_ids"] == np.arange(40)).all()
    assert not np.array_equal(synthetic(profile, 1, seed=1)["concat_ids"], synthetic(profile, 1, seed=2)["concat_ids"])


def test_build_with_a_bad_calibration_file_is_one_line_exit_2(tmp_path):
    feeds = synthetic(load_profile("bert-tiny"), 2, seed=0)
    np.savez(tmp_path / "c.npz", **{**feeds, "concat_ids": feeds["concat_ids"].astype(np.int64)})
    result = run_cli("build", "--int8", "--calib", str(tmp_path / "c.npz"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "c.npz: input 'concat_ids' has dtype int64, profile bert-tiny says int32" in lines[0]
    assert not (tmp_path / "out" / "model.int8.onnx").exists()


STACKED_CACHE_PROFILE = """
name = "stacked-cache"
[model]
factory = "factories:stacked_cache_decoder"
[dims.batch]
min = 1
opt = 2
max = 4
[dims.seq]
min = 1
opt = 4
max = 8
[dims.past_seq]
min = 0
opt = 4
max = 8
[[inputs]]
name = "tokens"
dtype = "int64"
shape = ["batch", "seq"]
range = [0, 128]
[[inputs]]
name = "cache_k"
dtype = "float32"
shape = [3, "batch", 2, "past_seq", 16]
[[inputs]]
name = "cache_v"
dtype = "float32"
shape = [3, "batch", 2, "past_seq", 16]
"""


def stacked_cache_model(tmp_path):
    inputs = [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "seq"]),
              *(helper.make_tensor_value_info(name, TensorProto.FLOAT, [3, "batch", 2, "past_seq", 16]) for name in ("cache_k", "cache_v"))]
    nodes = [helper.make_node("Add", ["cache_k", "cache_v"], ["kv"])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("kv", TensorProto.FLOAT, [3, "batch", 2, "past_seq", 16])])
    path = tmp_path / "stacked.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    return path


def test_samples_stack_on_each_inputs_batch_axis(tmp_path):
    """A cache laid out [layers, batch, ...]: samples stack and split on axis 1, and a file stacked on axis 0 is refused."""
    from pipeline.core.samples import batch_axes

    path = stacked_cache_model(tmp_path)
    axes = batch_axes(path)
    assert axes == {"tokens": 0, "cache_k": 1, "cache_v": 1}
    data = synthetic(load_profile(str(write_profile(tmp_path, STACKED_CACHE_PROFILE))), 3, seed=0, axes=axes)
    assert data["tokens"].shape == (6, 4) and data["cache_k"].shape == (3, 6, 2, 4, 16)
    runs = split(data, 2, axes)
    assert [run["cache_k"].shape for run in runs] == [(3, 2, 2, 4, 16)] * 3
    assert np.array_equal(runs[1]["cache_v"], data["cache_v"][:, 2:4])
    np.savez(tmp_path / "c.npz", **data)
    assert load_npz(tmp_path / "c.npz", model_inputs(path), axes)["cache_k"].shape == (3, 6, 2, 4, 16)
    np.savez(tmp_path / "bad.npz", **{**data, "cache_k": np.moveaxis(data["cache_k"], 1, 0)})
    with pytest.raises(InputError, match=r"the model expects \[3, samples, 2, \?, 16\] \(samples concatenated on axis 1\)"):
        load_npz(tmp_path / "bad.npz", model_inputs(path), axes)


def test_a_users_own_cache_with_batch_on_axis_1_quantizes(tmp_path):
    """The INT8 stage calibrated on samples stacked on axis 0 and ModelOpt's run failed as an internal error."""
    profile = write_profile(tmp_path, STACKED_CACHE_PROFILE)
    result = run_cli("build", "--profile", str(profile), "--int8", "--until", "int8", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "int8      done" in result.stdout and (tmp_path / "out" / "model.int8.onnx").is_file()
