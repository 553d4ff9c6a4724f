"""A precision stage whose ModelOpt step cannot fit in the memory available fails before ModelOpt runs (issue 33:
a 0.5B decoder's AutoCast and calibration were killed by the kernel part way through the build), with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from conftest import REPO, SMALL_MLP_PROFILE, TESTS
from onnx import TensorProto, helper, numpy_helper

import quant
from pipeline.core import memory
from pipeline.core.errors import StageFailed
from pipeline.core.onnxfile import EXTERNAL_DATA_ENV, save_onnx, stored_bytes


def _matmul_model(rows: int = 256) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((rows, 64)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


@pytest.mark.parametrize("external", [False, True])
def test_stored_bytes_count_the_weights_wherever_they_are(tmp_path, monkeypatch, external):
    if external:
        monkeypatch.setenv(EXTERNAL_DATA_ENV, "0")
    save_onnx(_matmul_model(), tmp_path / "m.onnx")
    files = [tmp_path / "m.onnx", *([tmp_path / "m.onnx.data"] if external else [])]
    assert all(f.is_file() for f in files)
    assert stored_bytes(tmp_path / "m.onnx") == sum(f.stat().st_size for f in files) >= 256 * 64 * 4


@pytest.mark.parametrize("kind", ["other", "decoder"])
def test_the_check_compares_the_least_measured_peak_of_the_kind_with_the_memory_available(tmp_path, monkeypatch, kind):
    model = _matmul_model()
    if kind == "decoder":  # a model with a KV cache input
        model.graph.input.append(helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, [1, 2, 0, 16]))
    onnx.save(model, str(tmp_path / "m.onnx"))
    needed = quant.MODELOPT_LEAST_PEAK[kind]["int8"] * stored_bytes(tmp_path / "m.onnx")
    monkeypatch.setattr(memory, "available_bytes", lambda: needed)
    quant.check_room_for_modelopt(tmp_path / "m.onnx", "int8", "int8")
    monkeypatch.setattr(memory, "available_bytes", lambda: needed - 1)
    with pytest.raises(StageFailed, match=r"^int8: ModelOpt's INT8 calibration needs at least \d+\.\d GiB of memory for m\.onnx "
                                          rf"\({quant.MODELOPT_LEAST_PEAK[kind]['int8']}x its 0\.0 GiB, the least it took on a model of this "
                                          rf"kind \({kind}\) in bench/results/modelopt_memory\.json\) and this machine has \d+\.\d GiB "
                                          r"available; .*\(our Docker image\), or leave out --int8$"):
        quant.check_room_for_modelopt(tmp_path / "m.onnx", "int8", "int8")


def test_int4_is_checked_with_the_factor_of_its_method():
    """AWQ's search and round to nearest take different memory: each INT4 method has its own measured factor."""
    assert [quant.modelopt_step("int4", method) for method in ("awq_clip", "rtn_dq")] == ["int4", "int4_rtn_dq"]
    assert quant.modelopt_step("int8", "entropy") == "int8" and quant.modelopt_step("fp8", "max") == "fp8"


def test_every_modelopt_step_has_the_factor_measured_for_each_kind():
    """The factors are the benchmark's results (least over each kind's models), rounded down, not set by hand."""
    recorded = json.loads((REPO / "bench" / "results" / "modelopt_memory.json").read_text())["least_factor"]
    steps = {"autocast": "fp16", "int8": "int8", "fp8": "int8", "int4": "int4", "int4_rtn_dq": "int4_rtn_dq"}  # FP8 calibrates as INT8 does
    assert {kind: {step: int(recorded[kind][measured]) for step, measured in steps.items()} for kind in recorded} == quant.MODELOPT_LEAST_PEAK
    assert all(set(factors) == set(quant.MODELOPT_STEPS) for factors in quant.MODELOPT_LEAST_PEAK.values())


NO_ROOM = """
import sys
import quant
for factors in quant.MODELOPT_LEAST_PEAK.values():
    factors.update({step: 10**9 for step in factors})  # no machine has room for it (the model is a few kB)
import quant.accuracy, quant.calibration
def too_early(*args, **kwargs):  # the stage says it cannot fit before it calibrates or starts its FP32 reference run
    raise RuntimeError("ran before the room check")
quant.calibration.calibration_data = quant.calibration.decoder_calibration = quant.accuracy.BackgroundOutputs = too_early
from pipeline.cli import main
sys.argv = ["pipeline", *sys.argv[1:]]
main()
"""


def test_the_precision_stages_fail_before_modelopt_runs_where_it_cannot_fit(tmp_path):
    (tmp_path / "small.toml").write_text(SMALL_MLP_PROFILE.replace("[quant]", '[quant]\nint4_method = "rtn_dq"  # AWQ cannot quantize a Gemm with transB=1'))
    run = subprocess.run([sys.executable, "-c", NO_ROOM, "build", "--profile", "small.toml", "--fp16", "--int8", "--int4", "--until", "int4",
                          "--out", "out"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)]), "COLUMNS": "200"})
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    stages = {s["name"]: s for s in json.loads((tmp_path / "out" / "manifest.json").read_text())["stages"]}
    for stage, step in (("fp16", "AutoCast"), ("int8", "INT8 calibration"), ("int4", "INT4 weight quantization (round to nearest)")):  # the profile's int4_method
        assert stages[stage]["status"] == "failed"
        assert stages[stage]["reason"].startswith(f"{stage}: ModelOpt's {step} needs at least ")
        assert stages[stage]["reason"].endswith(f"or leave out --{stage}")
    assert stages["optimize"]["status"] == "done"
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".") or "fp16" in p.name or "int" in p.name) == []


def test_a_session_fits_beside_modelopt_where_twice_the_model_is_left_over(tmp_path, monkeypatch):
    """The FP32 reference's session is counted at twice the model's bytes (its weights and onnxruntime's prepacked
    GEMM weights) on top of what the check counts for ModelOpt."""
    onnx.save(_matmul_model(), str(tmp_path / "m.onnx"))
    weights = stored_bytes(tmp_path / "m.onnx")
    needed = quant.MODELOPT_LEAST_PEAK["other"]["int8"] * weights
    monkeypatch.setattr(memory, "available_bytes", lambda: needed + 2 * weights)
    assert quant.room_for_a_session_beside_modelopt(tmp_path / "m.onnx", "int8")
    monkeypatch.setattr(memory, "available_bytes", lambda: needed + 2 * weights - 1)
    assert not quant.room_for_a_session_beside_modelopt(tmp_path / "m.onnx", "int8")


ROOM_FOR_MODELOPT_ONLY = """
import sys, threading
import quant
quant.room_for_a_session_beside_modelopt = lambda source, step: False
import time
import quant.accuracy
run_reference = quant.accuracy.BackgroundOutputs._run
def slow_reference(self, *args):  # long enough to still be running when ModelOpt starts, if it ran beside it
    time.sleep(2)
    run_reference(self, *args)
quant.accuracy.BackgroundOutputs._run = slow_reference
import modelopt.onnx.quantization as modelopt_quantization
from modelopt.onnx import autocast
def alone(real):
    def run(*args, **kwargs):  # ModelOpt starts with no FP32 reference run beside it
        assert not [t for t in threading.enumerate() if t.name == "fp32-reference"], "the FP32 reference runs beside ModelOpt"
        return real(*args, **kwargs)
    return run
modelopt_quantization.quantize = alone(modelopt_quantization.quantize)
autocast.convert_to_mixed_precision = alone(autocast.convert_to_mixed_precision)
from pipeline.cli import main
sys.argv = ["pipeline", *sys.argv[1:]]
main()
"""


def test_where_the_reference_session_does_not_fit_beside_modelopt_it_runs_first(tmp_path):
    """A 0.5B decoder's int8 stage: the FP32 reference run beside ModelOpt took the memory the check had counted for
    ModelOpt, and the check refused ModelOpt (13.9 GiB available, 16.6 needed) where it fits alone. Where the session
    does not fit beside ModelOpt, it runs to its end first; the stages pass as before."""
    (tmp_path / "small.toml").write_text(SMALL_MLP_PROFILE.replace("[quant]", '[quant]\nint4_method = "rtn_dq"  # AWQ cannot quantize a Gemm with transB=1'))
    run = subprocess.run([sys.executable, "-c", ROOM_FOR_MODELOPT_ONLY, "build", "--profile", "small.toml", "--fp16", "--int8", "--int4",
                          "--until", "int4", "--out", "out"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)]), "COLUMNS": "200"})
    assert run.returncode == 0, run.stderr
    stages = {s["name"]: s for s in json.loads((tmp_path / "out" / "manifest.json").read_text())["stages"]}
    assert [stages[name]["status"] for name in ("fp16", "int8", "int4")] == ["done"] * 3
