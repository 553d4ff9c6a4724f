"""What a first run shows (issue 27): each stage once, the Docker command once, and on the default
profile the verdict of the real TensorRT 10.10 log of this very model; and the rough edges a first
run hit: a stage failed in this run is not "earlier run", --debug keeps the exit code, `| head -1`
is not an error."""

import os
import subprocess
import sys

import onnx
from conftest import REPO, TESTS, TINY_MLP_PROFILE, TRT_DATA, run_cli, write_profile
from onnx import TensorProto, helper

REAL_LOG = TRT_DATA / "bert-fp16-trt10.10.detailed.log"
STAGES = ("export", "optimize", "build", "report", "diff", "bench")


def stage_lines(stdout: str, stage: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.split()[:1] == [stage]]


def test_a_cpu_run_of_the_default_profile_prints_each_stage_once_and_ends_with_the_real_logs_verdict(bert_tiny_torchscript, tmp_path):
    from trt.report import report_from_files

    result = run_cli("build", "--profile", "bert-tiny", "--onnx", str(bert_tiny_torchscript), "--out", "o", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for stage in STAGES:
        assert len(stage_lines(result.stdout, stage)) == 1, (stage, result.stdout)
    assert "skipped" in stage_lines(result.stdout, "build")[0] and "docker" not in stage_lines(result.stdout, "build")[0]
    assert result.stdout.count("docker run") == 1, result.stdout
    docker = next(line for line in result.stdout.splitlines() if "docker run" in line)
    assert docker.strip().endswith("trt-pipeline build --profile bert-tiny --onnx " + str(bert_tiny_torchscript) + " --out o --strict")
    last = [line.strip() for line in result.stdout.splitlines() if line.strip()][-2:]
    assert last == [f"python -m pipeline report {REAL_LOG}", report_from_files(REAL_LOG).verdict]
    assert last[1].startswith("FP16 engine: the whole network runs as 1 Myelin region")
    assert "runs code from" not in result.stdout, "the default profile's factory is ours"
    bench = run_cli("bench", "o", "--backend", "trt", cwd=tmp_path)  # the engines of a CPU build are where the Docker command says
    assert bench.returncode == 3 and "error: bench --backend trt needs TensorRT and a GPU" in bench.stderr and "docker run" in bench.stderr


def relu_model(path, input_name: str = "x") -> None:
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("Relu", [input_name], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", 8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])]),
        opset_imports=[helper.make_opsetid("", 20)]), str(path))


def test_another_profile_gets_the_docker_command_but_not_the_bert_log(tmp_path):
    relu_model(tmp_path / "m.onnx")
    profile = write_profile(tmp_path, TINY_MLP_PROFILE)
    result = run_cli("build", "--profile", str(profile), "--onnx", "m.onnx", "--out", "o", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("docker run") == 1 and "bert-fp16-trt10.10" not in result.stdout


def test_a_stage_that_refused_in_this_run_is_not_shown_as_an_earlier_run(tmp_path):
    """Into a new folder; the line is the reason as recorded, brackets and all (`[[inputs]]` is not rich markup)."""
    relu_model(tmp_path / "m.onnx", input_name="tokens")
    write_profile(tmp_path, TINY_MLP_PROFILE)
    result = run_cli("build", "--profile", "p.toml", "--onnx", "m.onnx", "--out", "new", cwd=tmp_path)
    assert result.returncode == 2
    (line,) = stage_lines(result.stdout.replace(" \n", " "), "export")
    assert "refused" in line and "earlier run" not in result.stdout, result.stdout
    assert "model input 'tokens' is not in profile tiny-mlp's [[inputs]] (x)" in line


def test_debug_shows_the_traceback_and_keeps_the_exit_code(tmp_path):
    for args in (("--debug", "report", str(tmp_path / "missing.json")), ("report", str(tmp_path / "missing.json"), "--debug")):  # after the command too
        result = run_cli(*args)
        assert result.returncode == 2
        assert "Traceback" in result.stderr and result.stderr.strip().splitlines()[-1].startswith("error: ")


def test_a_closed_pipe_ends_the_command_quietly(tmp_path):
    """`build ... | head -1`: the reader leaves after the first line; the build stops with exit 0 and says nothing."""
    relu_model(tmp_path / "m.onnx")
    write_profile(tmp_path, TINY_MLP_PROFILE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)])}
    process = subprocess.Popen([sys.executable, "-m", "pipeline", "build", "--profile", "p.toml", "--onnx", "m.onnx", "--out", "o"],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline().startswith(b"profile tiny-mlp")
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) == 0 and stderr == ""


def test_build_names_the_factory_file_it_runs_when_it_is_outside_the_profiles_folder(tmp_path):
    """A profile's factory is code (docs/models.md): a module found elsewhere on the import path is named before it
    runs (one beside the profile, or ours, is not: see the first test)."""
    (tmp_path / "elsewhere").mkdir()
    far = tmp_path / "elsewhere" / "far_models.py"
    far.write_text("def make():\n    raise RuntimeError('not built in this test')\n")
    (tmp_path / "profiles").mkdir()
    write_profile(tmp_path / "profiles", TINY_MLP_PROFILE.replace("factories:tiny_mlp", "far_models:make"))
    result = run_cli("build", "--profile", "profiles/p.toml", "--out", "o", cwd=tmp_path, path=(tmp_path / "elsewhere",))
    assert result.returncode == 2 and "raised RuntimeError: not built in this test" in result.stderr
    assert f"note: model.factory far_models:make runs code from {far}" in result.stdout


def test_lief_reports_no_leaks_at_exit_once_quant_silences_it():
    """ModelOpt imports lief (quant/fp16.py and int8.py then call the silencer); lief's nanobind bindings print
    "nanobind: leaked ..." at exit for any object still alive then. An object kept alive on purpose shows
    that the report is there unless quant switches it off."""
    keep_one_alive = "import ctypes, lief; b = lief.parse(sys.executable); ctypes.pythonapi.Py_IncRef(ctypes.py_object(b))\n"
    runs = {}
    for silenced in (False, True):
        code = "import sys\n" + keep_one_alive + ("from quant import silence_lief_leak_report; silence_lief_leak_report()\n" if silenced else "")
        runs[silenced] = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert runs[silenced].returncode == 0, runs[silenced].stderr[-2000:]
    assert "nanobind: leaked" in runs[False].stderr
    assert "nanobind" not in runs[True].stderr


def test_a_dynamo_decomposition_failure_names_its_cause_and_the_exporter_that_works():
    """HF Swin with a dynamic batch (checked by hand: a 2-stage Swin from hf_config fails this way, ~1 min, and
    exports with torchscript): torch.export succeeds, then decomposing `view` fails on the symbolic shape. The
    chain below is the one torch raises (its ConversionError text, shortened); it names `aten.view` only in the
    failing FX node, which is not an operator without an ONNX translation."""
    from torch.onnx._internal.exporter._errors import ConversionError

    from pipeline.core.profiles import load_profile
    from pipeline.export_failures import exporter_failure

    cause = ValueError("Cannot view a tensor with shape torch.Size([4*s21, 16, 2, 16]) and strides (512, 16, 256, 1) as a tensor with shape (4*s21, 16, 32)!\n\n"
                       "While executing %view_27 : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%transpose_11, [%mul_168, 16, -1]), kwargs = {})")
    try:
        try:
            raise cause
        except ValueError as err:
            raise ConversionError("Failed to decompose the FX graph for ONNX compatibility. \x1b[96mThis is step 2/3\x1b[0m of exporting the model to ONNX.\n\n"
                                  f"## Exception summary\n\n<class 'ValueError'>: {cause}\n") from err
    except ConversionError as err:
        line = str(exporter_failure(err, None, (), "dynamo", load_profile("bert-tiny")))
    assert line.startswith("export: the dynamo exporter could not decompose the model at its dynamic dims: Cannot view a tensor with shape torch.Size([4*s21, 16, 2, 16])")
    assert 'set `[export] exporter = "torchscript"` in the profile' in line and "no ONNX translation" not in line


def test_export_functions_leaves_torchs_onnx_log_off(tmp_path):
    """torch's TorchScript export turns its ONNX log on and never off; with --functions its module hooks then
    printed "Skipping module attribute 'freeze'" on each later forward (our check against torch), after the
    export's own output was captured."""
    import torch

    from pipeline.core.profiles import load_profile
    from pipeline.export import export_model

    profile = load_profile(str(write_profile(tmp_path, TINY_MLP_PROFILE)))
    export_model(profile, tmp_path / "m.onnx", exporter="torchscript", functions=["GELU"])
    assert not torch._C._jit_is_onnx_log_enabled()
