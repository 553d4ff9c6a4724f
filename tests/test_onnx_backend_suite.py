"""`optimize` on ONNX's own backend node tests (docs/optimize-suite.md): every model onnxruntime runs
gives the same outputs after optimize, and the optimized model keeps its inputs' and outputs' names
and types; the package's three smaller sets in the same layout (simple, pytorch-converted,
pytorch-operator) too. The whole set runs here (about 1,800 small models, about a minute on 2 cores); a model
onnxruntime cannot run as given is skipped with onnxruntime's reason. bench/onnx_backend_suite.py
runs the same check and records the counts."""

import importlib.util

import pytest
from conftest import REPO


def _suite():
    spec = importlib.util.spec_from_file_location("bench_onnx_backend_suite", REPO / "bench" / "onnx_backend_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SUITE = _suite()
NODE_TESTS = SUITE.node_tests()
ALL_TESTS = NODE_TESTS + [folder for kind in SUITE.OTHER_SETS for folder in SUITE.node_tests(kind)]


def test_the_suite_ships_with_onnx():
    assert len(NODE_TESTS) > 1000, f"{SUITE.NODE_TESTS}: expected the onnx package's node tests"


@pytest.mark.parametrize("folder", ALL_TESTS, ids=[f"{f.parent.name}/{f.name}" for f in ALL_TESTS])
def test_optimize_keeps_the_outputs(folder, tmp_path):
    record = SUITE.check(folder, tmp_path)
    if record["outcome"] == "ort-cannot-run":
        pytest.skip(f"onnxruntime cannot run the original: {record['reason']}")
    assert record["outcome"] == "same", record["reason"]
    assert not list(tmp_path.iterdir()), "the optimized file is removed after the check"


def test_the_comparison_sees_a_changed_output():
    """The check this suite rests on: differences beyond the stage's tolerance, a wrong sequence
    element, an emptied optional and a wrong integer are all reported."""
    import numpy as np

    a = np.array([1.0, 2.0], np.float32)
    assert SUITE.compare([a], [a + 5e-6], [a]) is None
    assert "differs from the original's" in SUITE.compare([a], [a + 2e-5], [a])
    assert "element 1" in SUITE.compare([[a, a]], [[a, a * 2]], [[a, a]])
    assert "optional" in SUITE.compare([a], [None], [a])
    assert SUITE.compare([np.array([3])], [np.array([4])], [np.array([3])]) is not None
    assert SUITE.compare([np.array([np.nan, 1.0])], [np.array([np.nan, 1.0])], []) is None


def test_the_docs_table_is_the_recorded_run():
    import json

    result = json.loads(SUITE.RESULTS.read_text())
    text = SUITE.DOCS.read_text()
    block = text[text.index(SUITE.TABLE_START) + len(SUITE.TABLE_START) : text.index(SUITE.TABLE_END)]
    assert block == "\n" + SUITE.docs_table(result)
    counts = result["counts"]
    assert sum(counts.values()) == result["models"] and len(result["ort_cannot_run"]) == counts.get("ort-cannot-run", 0)
    assert result["not_same"] == [] and set(counts) <= {"same", "ort-cannot-run"}
