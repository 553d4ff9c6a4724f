"""The accuracy figures every precision gate reads (quant/accuracy.py), computed a chunk at a time."""

import numpy as np
import pytest

from quant import accuracy as figures


def whole(reference: np.ndarray, candidate: np.ndarray) -> dict:
    """The figures as one float64 vector gives them (the definition)."""
    a, b = reference.astype(np.float64), candidate.astype(np.float64)
    centre = a.mean()
    cosine = lambda x, y: float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))  # noqa: E731
    return {"max_abs_diff": float(np.max(np.abs(a - b))), "cosine": cosine(a, b), "cosine_centered": cosine(a - centre, b - centre)}


def test_chunked_figures_are_the_whole_vectors(monkeypatch):
    """Outputs near a constant (sigmoid scores, 0.57 +- 0.03) keep their centred cosine: the centre is taken first,
    then every chunk is centred in float64 before its products."""
    monkeypatch.setattr(figures, "CHUNK", 1000)
    rng = np.random.default_rng(0)
    reference = [(0.57 + 0.03 * rng.standard_normal(n)).astype(np.float32) for n in (4321, 17, 2500)]
    candidate = [(r + 0.002 * rng.standard_normal(r.size)).astype(np.float32) for r in reference]
    got = figures.accuracy(reference, candidate, 3)
    want = whole(np.concatenate(reference), np.concatenate(candidate))
    assert got["samples"] == 3 and got["cosine"] > 0.999 and 0.9 < got["cosine_centered"] < 0.999
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key


def test_a_nan_anywhere_is_nan_in_every_figure_and_equal_outputs_are_one():
    reference = [np.ones(10, np.float32), np.zeros(5, np.float32)]
    broken = [np.ones(10, np.float32), np.array([0, 0, np.nan, 0, 0], np.float32)]
    result = figures.accuracy(reference, broken, 1)
    assert all(np.isnan(result[key]) for key in ("max_abs_diff", "cosine", "cosine_centered"))
    assert figures.accuracy(reference, reference, 1) | {"samples": 0} == {"samples": 0, "max_abs_diff": 0.0, "cosine": 1.0, "cosine_centered": 1.0}
    with pytest.raises(ValueError, match="15 output values vs 16"):
        figures.accuracy(reference + [np.zeros(1, np.float32)], broken, 1)


def test_the_figures_cost_a_chunk_of_memory_not_a_copy_of_the_outputs():
    """Issue 38: EfficientNet's FP16 check at batch 16 (1 GB of outputs a copy in float64) ran the machine out of memory
    (a 20.7 GB peak): the figures of 2 x 256 MB of float32 outputs now take tens of MB beside them."""
    from pipeline.core import rss

    values = 64_000_000
    reference, candidate = [np.ones(values, np.float32)], [np.full(values, 1.001, np.float32)]
    before = rss.peak_rss_mb()
    if not rss.reset_peak():
        pytest.skip("the process's peak memory cannot be reset here (Linux /proc/self/clear_refs)")
    held = rss.peak_rss_mb()
    result = figures.accuracy(reference, candidate, 1)
    assert result["max_abs_diff"] == pytest.approx(0.001, rel=1e-3) and result["cosine"] == pytest.approx(1.0)
    assert rss.peak_rss_mb() - held < 100, (before, held, rss.peak_rss_mb())


def scale_model(path, factor: float) -> None:
    import onnx
    from onnx import TensorProto, helper

    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"], name="scale")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor("k", TensorProto.FLOAT, [], [factor])]), opset_imports=[helper.make_opsetid("", 20)]), str(path))


def scaled_pair(tmp_path, seed: int, runs: int) -> list[dict]:
    """fp32.onnx (x * 2) and fp16.onnx (x * 2.001) in `tmp_path`, and `runs` random batches of 4 x 64 to feed them."""
    scale_model(tmp_path / "fp32.onnx", 2.0)
    scale_model(tmp_path / "fp16.onnx", 2.001)
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((4, 64)).astype(np.float32)} for _ in range(runs)]


def test_outputs_past_the_budget_are_checked_batch_by_batch_with_the_same_figures(tmp_path, monkeypatch):
    """The FP32 reference keeps at most OUTPUT_BUDGET output values; past it, neither model's outputs are kept: both run
    batch by batch and the figures are those of the whole outputs."""
    batches = scaled_pair(tmp_path, seed=3, runs=5)
    kept = figures.BackgroundOutputs(tmp_path / "fp32.onnx", batches)
    whole_figures = figures.checked(tmp_path / "fp16.onnx", batches, kept, tmp_path / "fp32.onnx", 20)
    assert kept.result() is not None
    monkeypatch.setattr(figures, "OUTPUT_BUDGET", 300)
    over = figures.BackgroundOutputs(tmp_path / "fp32.onnx", batches)
    stepped = figures.checked(tmp_path / "fp16.onnx", batches, over, tmp_path / "fp32.onnx", 20)
    assert over.result() is None and over.served == 2
    assert stepped == pytest.approx(whole_figures, rel=1e-9) and 0 < stepped["max_abs_diff"] < 0.02
    assert figures.checked(tmp_path / "fp16.onnx", batches, None, tmp_path / "fp32.onnx", 20) == pytest.approx(whole_figures, rel=1e-9)


def test_known_outputs_are_the_reference_with_nothing_run_and_past_the_budget_are_checked_batch_by_batch(tmp_path, monkeypatch):
    """A decoder's held-out steps hand their FP32 outputs over: the check reads them as it reads a run's, cancelling
    starts nothing, and outputs past the budget make the check run both models batch by batch, as a run's would."""
    batches = scaled_pair(tmp_path, seed=4, runs=3)
    ran = figures.BackgroundOutputs(tmp_path / "fp32.onnx", batches)
    expected = figures.checked(tmp_path / "fp16.onnx", batches, ran, tmp_path / "fp32.onnx", 12)
    outputs = figures.flatten([[2.0 * b["x"]] for b in batches])
    known = figures.BackgroundOutputs(tmp_path / "missing.onnx", batches, (outputs, 1.5))  # nothing may read the model
    assert figures.checked(tmp_path / "fp16.onnx", batches, known, tmp_path / "fp32.onnx", 12) == pytest.approx(expected, rel=1e-9)
    assert known.seconds == 1.5 and known.served == 1 and not known._thread.is_alive()
    known.cancel()
    monkeypatch.setattr(figures, "OUTPUT_BUDGET", 300)
    over = figures.BackgroundOutputs(tmp_path / "missing.onnx", batches, (outputs, 1.5))
    assert over.result() is None and figures.BackgroundOutputs(tmp_path / "missing.onnx", batches, (None, 1.5)).result() is None
    assert figures.checked(tmp_path / "fp16.onnx", batches, over, tmp_path / "fp32.onnx", 12) == pytest.approx(expected, rel=1e-9)
