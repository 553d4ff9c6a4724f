"""A run's memory estimated before it runs (issue 38): the FP16 stage's onnxruntime check of a batch that
would not fit (EfficientNet at 600x600, batch 16, ran out of memory) runs in smaller batches instead."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.core import memory


def conv_stack(path, channels: int = 8, size: int = 32):
    """Three Convs, batch dynamic, with a Pad whose pads are computed (as exporters write them)."""
    weight = numpy_helper.from_array(np.full((channels, channels, 3, 3), 0.01, np.float32), "w")
    stem = numpy_helper.from_array(np.full((channels, 3, 3, 3), 0.01, np.float32), "stem")
    pads = numpy_helper.from_array(np.array([0, 0, 1, 1], np.int64), "half")
    nodes = [helper.make_node("Concat", ["half", "half"], ["pads"], axis=0),
             helper.make_node("Pad", ["x", "pads"], ["padded"]),
             helper.make_node("Conv", ["padded", "stem"], ["a"], pads=[0, 0, 0, 0]),
             helper.make_node("Conv", ["a", "w"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["b", "w"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", channels, size, size])], [weight, stem, pads])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10), str(path))
    return path


def test_the_peak_counts_the_tensors_alive_at_once(tmp_path):
    path = conv_stack(tmp_path / "c.onnx")
    one = 8 * 32 * 32 * 4  # one [1, 8, 32, 32] float tensor
    # padded [1, 3, 34, 34] is freed after the first Conv; then a and b are alive together, then b and y
    assert memory.peak_activation_bytes(path, {"x": [1, 3, 32, 32]}) == 2 * one
    assert memory.peak_activation_bytes(path, {"x": [16, 3, 32, 32]}) == 16 * 2 * one


def test_a_batch_that_would_not_fit_runs_in_parts_and_one_that_fits_at_once(tmp_path, monkeypatch):
    path = conv_stack(tmp_path / "c.onnx")
    feeds = {"x": np.ones((16, 3, 32, 32), np.float32)}
    peak = memory.ARENA_FACTOR * memory.peak_activation_bytes(path, {"x": [16, 3, 32, 32]})
    monkeypatch.setattr(memory, "available_bytes", lambda: int(peak / memory.SHARE_OF_AVAILABLE / 4))  # a quarter fits
    runs = memory.runs_that_fit(path, feeds)
    assert [len(run["x"]) for run in runs] == [4, 4, 4, 4]
    assert np.array_equal(np.concatenate([run["x"] for run in runs]), feeds["x"])
    monkeypatch.setattr(memory, "available_bytes", lambda: int(2 * peak / memory.SHARE_OF_AVAILABLE))
    assert [len(run["x"]) for run in memory.runs_that_fit(path, feeds)] == [16]


def test_the_fp16_check_runs_a_batch_too_large_for_memory_in_smaller_batches(tmp_path, monkeypatch):
    from quant.fp16 import check_runs

    path = conv_stack(tmp_path / "c.onnx")
    peak_of_one = memory.ARENA_FACTOR * memory.peak_activation_bytes(path, {"x": [1, 3, 32, 32]})
    monkeypatch.setattr(memory, "available_bytes", lambda: int(8 * peak_of_one / memory.SHARE_OF_AVAILABLE))
    feed_sets = [{"x": np.ones((rows, 3, 32, 32), np.float32)} for rows in (1, 4, 16)]
    _, checked = check_runs(path, feed_sets, "fp16")
    assert [shapes["x"][0] for shapes in checked] == [1, 4, 8, 8], "batch 16 ran as two runs of 8"


def test_the_accuracy_check_and_its_fp32_reference_run_a_batch_too_large_for_memory_in_parts(tmp_path, monkeypatch):
    """The held-out samples stack into one batch of the profile's largest: EfficientNet at 600x600, batch 16, ran the
    candidate and the FP32 reference beside it each at once, and was killed for memory (23.7 GB) once its shape checks
    ran in parts. Both now run in parts too, and the figures are those of the whole batch."""
    from pipeline.core.verify import OnnxSession
    from quant.accuracy import BackgroundOutputs, checked

    path = conv_stack(tmp_path / "c.onnx")
    batches = [{"x": np.random.default_rng(0).normal(size=(16, 3, 32, 32)).astype(np.float32)}]
    whole = checked(path, batches, None, path, 16)
    rows = []
    run = OnnxSession.run
    monkeypatch.setattr(OnnxSession, "run", lambda self, feeds, options=None: rows.append(len(feeds["x"])) or run(self, feeds, options))
    peak_of_one = memory.ARENA_FACTOR * memory.peak_activation_bytes(path, {"x": [1, 3, 32, 32]})
    monkeypatch.setattr(memory, "available_bytes", lambda: int(4 * peak_of_one / memory.SHARE_OF_AVAILABLE))
    parts = checked(path, batches, BackgroundOutputs(path, batches), path, 16)
    assert parts.keys() == whole.keys() and all(parts[k] == pytest.approx(whole[k], rel=1e-6, abs=1e-9) for k in whole)
    assert sorted(rows) == [4] * 8, "the candidate's 16 rows and the reference's, 4 at a time"


def test_the_optimize_check_holds_one_session_at_a_time(tmp_path, monkeypatch):
    """Issue 33: `differences` runs the reference, lets its session go, then makes the candidate's: two sessions at
    once held the weights twice (the optimize stage's peak)."""
    import weakref

    from pipeline.core import verify

    alive, most = set(), [0]

    class Counted(verify.OnnxSession):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            alive.add(id(self))
            weakref.finalize(self, alive.discard, id(self))
            most[0] = max(most[0], len(alive))

    monkeypatch.setattr(verify, "OnnxSession", Counted)
    conv_stack(tmp_path / "a.onnx")
    conv_stack(tmp_path / "b.onnx")
    feeds = [{"x": np.ones((n, 3, 32, 32), np.float32)} for n in (1, 2)]
    assert verify.differences(tmp_path / "a.onnx", tmp_path / "b.onnx", feeds)[:2] == (0.0, 0.0)
    assert most[0] == 1


def test_memory_left_in_reference_cycles_is_given_back_before_a_stage(tmp_path):
    """Issue 33: the export's torch module is a reference cycle, freed only by the cycle collector; the runner collects
    before each stage, so the next one does not start with it held."""
    import weakref

    from pipeline.core.rss import release_freed_memory

    class Holder:
        pass

    holder = Holder()
    holder.itself, holder.weights = holder, np.ones(1 << 20)
    freed = weakref.ref(holder)
    del holder
    assert freed() is not None  # a cycle: reference counting alone keeps it
    release_freed_memory()
    assert freed() is None
