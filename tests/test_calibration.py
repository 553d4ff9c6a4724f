"""Calibration data: a user's .npz is checked against the model's inputs, one clear error per problem."""

import numpy as np
import onnx
import pytest
from conftest import run_cli
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
