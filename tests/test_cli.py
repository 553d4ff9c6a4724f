"""The CLI as a user runs it: outputs, manifest, caching, and exit codes (0, 1, 2) with one-line errors."""

import json
from pathlib import Path

import onnx
import pytest
from conftest import REPO, TINY_MLP_PROFILE, TRT_DATA, run_cli, write_profile


def stages(out_dir):
    return {s["name"]: s for s in json.loads((out_dir / "manifest.json").read_text())["stages"]}


def test_build_default_profile_exports_verifies_and_caches(tmp_path):
    first = run_cli("build", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    out = tmp_path / "artifacts" / "bert-tiny"
    export = stages(out)["export"]
    assert export["status"] == "done" and export["metrics"]["max_abs_diff"] <= 1e-4
    assert onnx.load(str(out / export["outputs"]["onnx"]), load_external_data=False).graph.node
    assert "\nexport    done" in first.stdout and "max_abs_diff=" in first.stdout and "recorded in artifacts/bert-tiny/manifest.json" in first.stdout
    second = run_cli("build", cwd=tmp_path)
    assert second.returncode == 0 and stages(out)["export"]["status"] == "cached"
    assert "cached" in second.stdout


def test_build_from_onnx_skips_export(tmp_path):
    profile = write_profile(tmp_path, TINY_MLP_PROFILE)
    assert run_cli("export", "--profile", str(profile), "-o", str(tmp_path / "m.onnx")).returncode == 0
    result = run_cli("build", "--profile", str(profile), "--onnx", str(tmp_path / "m.onnx"), "--out", str(tmp_path / "o"))
    assert result.returncode == 0, result.stderr
    export = stages(tmp_path / "o")["export"]
    assert export["status"] == "skipped" and "starting from" in export["reason"]
    assert export["outputs"]["onnx"] == str((tmp_path / "m.onnx").resolve())


def test_strict_does_not_fail_a_chosen_onnx_start(tmp_path):
    profile = write_profile(tmp_path, TINY_MLP_PROFILE)
    assert run_cli("export", "--profile", str(profile), "-o", str(tmp_path / "m.onnx")).returncode == 0
    result = run_cli("build", "--strict", "--until", "optimize", "--profile", str(profile), "--onnx", str(tmp_path / "m.onnx"), "--out", str(tmp_path / "o"))
    assert result.returncode == 0, result.stderr


def one_line_error(result, code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["build", "--profile", "no-such"], "error: profile 'no-such' not found"),
        (["build", "--onnx", "missing.onnx"], "missing.onnx: no such ONNX file"),
        (["build", "--onnx", "garbage.onnx"], "garbage.onnx: not an ONNX model"),
    ],
)
def test_bad_input_exit_2_one_line(tmp_path, args, expected):
    (tmp_path / "garbage.onnx").write_bytes(b"\x00\x01 definitely not protobuf \xff" * 10)
    assert expected in one_line_error(run_cli(*args, "--out", str(tmp_path / "o"), cwd=tmp_path), 2)


def test_unsupported_operator_exit_2(tmp_path):
    text = 'name = "poly"\n[model]\nfactory = "factories:polygamma_model"\n[[inputs]]\nname = "x"\ndtype = "float32"\nshape = [2, 8]\n'
    line = one_line_error(run_cli("export", "--profile", str(write_profile(tmp_path, text)), "-o", str(tmp_path / "m.onnx")), 2)
    assert "aten.polygamma" in line and "'1.1' (_Special)" in line
    assert not (tmp_path / "m.onnx").exists()


def test_numerical_failure_exit_1_and_recorded(tmp_path):
    profile = write_profile(tmp_path, TINY_MLP_PROFILE + "[export]\ntolerance = 1e-12\n")
    line = one_line_error(run_cli("build", "--profile", str(profile), "--out", str(tmp_path / "o")), 1)
    assert "max_abs_diff=" in line and "tolerance 1e-12" in line
    assert stages(tmp_path / "o")["export"]["status"] == "failed"
    assert not (tmp_path / "o" / "model.onnx").exists()


def test_usage_errors_exit_2(tmp_path):
    assert run_cli("build", "--no-such-flag").returncode == 2
    assert run_cli("build", "--until", "nonsense").returncode == 2
    assert run_cli("export").returncode == 2  # -o is required
    assert run_cli("--help").returncode == 0 and "build" in run_cli("--help").stdout


def test_debug_shows_the_traceback(tmp_path):
    result = run_cli("--debug", "build", "--profile", "no-such", cwd=REPO)
    assert result.returncode != 0 and "Traceback" in result.stderr and "ProfileError" in result.stderr


def test_the_output_files_suffix_chooses_the_format(tmp_path):
    """A new user's `report ... -o r.html` wrote text into the .html file; `--format` still decides when given."""
    log = TRT_DATA / "trex_resnet18_A100_fp16.graph.json"
    assert run_cli("report", str(log), "-o", str(tmp_path / "r.html")).returncode == 0
    assert (tmp_path / "r.html").read_text().startswith("<!doctype html>")
    assert run_cli("report", str(log), "-o", str(tmp_path / "r.json")).returncode == 0
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["layers"] > 0
    assert run_cli("report", str(log), "-o", str(tmp_path / "forced.html"), "--format", "md").returncode == 0
    assert not (tmp_path / "forced.html").read_text().startswith("<!doctype html>")



@pytest.mark.skipif(Path("/dev/nvidiactl").exists() or Path("/dev/nvidia0").exists(), reason="a machine with a GPU runs ort-cuda")
def test_bench_on_cuda_without_a_gpu_is_one_line_not_onnxruntimes_log(tmp_path):
    """onnxruntime-gpu printed two native error lines per model (its search for CUDA's libraries) before our one line."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(tmp_path / "m.onnx"))
    write_profile(tmp_path, TINY_MLP_PROFILE)
    result = run_cli("bench", "m.onnx", "--profile", "p.toml", "--backend", "ort-cuda", cwd=tmp_path)
    assert result.returncode == 3 and result.stderr.splitlines() == [
        "error: --backend ort-cuda: no CUDA GPU here; run it on a machine with an NVIDIA GPU, or time this CPU with --backend ort-cpu"]
