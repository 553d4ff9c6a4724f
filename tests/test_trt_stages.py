"""Without TensorRT or a GPU (this machine): the engine stages are skipped with the reason and the way
forward, --strict turns that into exit 3; the onnxruntime CPU benchmark runs for real."""

import json
import shlex
from pathlib import Path

import pytest
from conftest import TINY_MLP_PROFILE, run_cli, write_profile


def stages(out):
    return {s["name"]: s for s in json.loads((out / "manifest.json").read_text())["stages"]}


def test_engine_stages_are_skipped_with_reason_and_next_step(tmp_path):
    profile = write_profile(tmp_path, TINY_MLP_PROFILE)
    result = run_cli("build", "--profile", str(profile), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    recorded = stages(tmp_path / "out")
    assert recorded["export"]["status"] == "done" and recorded["optimize"]["status"] == "done"
    for name in ("build", "bench"):
        assert recorded[name]["status"] == "skipped"
        assert "TensorRT is not installed here (import tensorrt" in recorded[name]["reason"]
        assert "docker run --rm --gpus all" in recorded[name]["reason"]
    assert recorded["report"]["status"] == "skipped" and "the build stage was skipped" in recorded["report"]["reason"]
    assert "Traceback" not in result.stderr


def docker_run(reason: str) -> tuple[list[str], list[str]]:
    """The pipeline arguments of the Docker hint in `reason`, and its -v mounts (host:container)."""
    tokens = shlex.split(reason.split("from this folder: ", 1)[1])
    run = tokens.index("run")
    image = tokens.index("trt-pipeline", run)
    assert tokens[run + 1: run + 8] == ["--rm", "--gpus", "all", "-v", "$PWD:$PWD", "-w", "$PWD"]
    return tokens[image + 1:], [tokens[i + 1] for i in range(run + 8, image) if tokens[i] == "-v"]


def test_docker_hint_repeats_the_users_build_and_mounts_its_files(tmp_path):
    folder = tmp_path / "my profiles"
    folder.mkdir()
    profile = write_profile(folder, TINY_MLP_PROFILE)
    out = tmp_path / "runs" / "a b"
    result = run_cli("build", "--profile", str(profile), "--out", str(out), "--weak-fp16", "--verbosity", "layer_names_only")
    assert result.returncode == 0, result.stderr
    for name in ("build", "bench"):
        arguments, mounts = docker_run(stages(out)[name]["reason"])
        assert arguments == ["build", "--profile", str(profile), "--weak-fp16", "--verbosity", "layer_names_only", "--out", str(out), "--strict"]
        mounted = [Path(m.split(":")[0]) for m in mounts]
        assert all(m == f"{host}:{host}" for m, host in zip(mounts, mounted)), "mounted at the same path inside the container"
        for path in (profile, out):
            assert any(path == host or host in path.parents for host in mounted), f"{path} is not reachable in the container: {mounts}"


def test_docker_hint_mounts_the_checkpoint_folder_a_profile_names(tmp_path):
    """A new user's profile next to a save_pretrained folder (`hf = "../checkpoint"`): the printed command mounted only
    the current folder and the output's, so the container would not find the checkpoint."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    transformers.BertModel(config).save_pretrained(tmp_path / "checkpoint")
    (tmp_path / "profiles").mkdir()
    made = run_cli("init", "--hf", "../checkpoint", "-o", "p.toml", cwd=tmp_path / "profiles")
    assert made.returncode == 0, made.stderr
    result = run_cli("build", "--profile", "p.toml", "--out", "out", "--until", "build", cwd=tmp_path / "profiles")
    assert result.returncode == 0, result.stderr
    _, mounts = docker_run(stages(tmp_path / "profiles" / "out")["build"]["reason"])
    assert f"{tmp_path / 'checkpoint'}:{tmp_path / 'checkpoint'}" in mounts, mounts


def test_docker_hint_keeps_paths_in_the_current_folder_relative(tmp_path):
    write_profile(tmp_path, TINY_MLP_PROFILE)
    result = run_cli("build", "--profile", "p.toml", "--out", "out", "--until", "build", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    arguments, mounts = docker_run(stages(tmp_path / "out")["build"]["reason"])
    assert arguments == ["build", "--profile", "p.toml", "--out", "out", "--strict"] and mounts == []


def test_bench_trt_without_tensorrt_exits_3_with_one_line(tmp_path):
    (tmp_path / "fp32.engine").write_bytes(b"not an engine: TensorRT is never reached")
    result = run_cli("bench", str(tmp_path), "--backend", "trt", "--iterations", "7")
    assert result.returncode == 3
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: bench --backend trt needs TensorRT and a GPU: TensorRT is not installed here")
    arguments, mounts = docker_run(lines[0])
    assert arguments == ["bench", str(tmp_path), "--backend", "trt", "--warmup", "10", "--iterations", "7", "--profile", "bert-tiny"]
    assert any(Path(m.split(":")[0]) == tmp_path for m in mounts)


def test_strict_exits_3_with_one_line(tmp_path):
    profile = write_profile(tmp_path, TINY_MLP_PROFILE)
    result = run_cli("build", "--strict", "--profile", str(profile), "--out", str(tmp_path / "out"))
    assert result.returncode == 3
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --strict: building engines needs TensorRT and a GPU")
    assert "docker run" in lines[0] and not (tmp_path / "out").exists()  # before the CPU stages, not after them (issue 36)


def test_bench_ort_cpu_writes_json_and_png(tmp_path):
    profile = write_profile(tmp_path, TINY_MLP_PROFILE)
    assert run_cli("export", "--profile", str(profile), "-o", str(tmp_path / "m.onnx")).returncode == 0
    result = run_cli("bench", str(tmp_path / "m.onnx"), "--backend", "ort-cpu", "--iterations", "25", "--warmup", "2",
                     "--profile", str(profile), "--batch", "3", "-o", str(tmp_path / "b.json"))
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    row = data["models"]["m"]
    assert data["backend"] == "ort-cpu" and data["batch"] == 3 and row["iterations"] == 25
    assert 0 < row["min_ms"] <= row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"] <= row["max_ms"]
    assert row["throughput_per_s"] > 0
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_of_a_build_reads_its_profile_from_the_manifest(tmp_path):
    """Issue 36: the first bench of one's own build failed with bert-tiny's input names unless --profile repeated it."""
    profile = write_profile(tmp_path, TINY_MLP_PROFILE)
    assert run_cli("build", "--profile", str(profile), "--fp16", "--until", "fp16", "--out", str(tmp_path / "out")).returncode == 0
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["profile_source"] == str(profile.resolve())
    for artifact in (tmp_path / "out", tmp_path / "out" / "model.fp16.onnx"):
        result = run_cli("bench", str(artifact), "--iterations", "3", "--warmup", "0", "-o", str(tmp_path / "b.json"))
        assert result.returncode == 0, result.stderr
    assert set(json.loads((tmp_path / "b.json").read_text())["models"]) == {"model.fp16"}
    from pipeline.artifacts import read_build

    assert read_build(tmp_path / "out")[1]["fp16"].onnx is not None
    with open(tmp_path / "out" / "model.fp16.onnx", "ab") as edited:  # no longer what the stage wrote: not served
        edited.write(b"\0")
    assert "fp16" not in read_build(tmp_path / "out")[1]


def test_bench_times_the_models_the_build_ran(tmp_path):
    """A new user's pre-LN transformer: the build ran its FP16 and FP8 models on onnxruntime, then bench segfaulted on
    the FP16 one (onnxruntime's extended fusions) and called FP8 unsupported. bench runs them as the build's checks do."""
    profile = write_profile(tmp_path, 'name = "pre-ln"\n[model]\nfactory = "factories:pre_ln_transformer"\n[dims.batch]\nmin = 1\nopt = 2\n'
                                      'max = 8\n[dims.seq]\nmin = 4\nopt = 32\nmax = 64\n[[inputs]]\nname = "ids"\ndtype = "int64"\n'
                                      'shape = ["batch", "seq"]\nrange = [0, 1000]\n')
    built = run_cli("build", "--profile", str(profile), "--fp16", "--fp8", "--until", "fp8", "--out", str(tmp_path / "out"))
    assert built.returncode == 0, built.stderr
    timed = run_cli("bench", str(tmp_path / "out"), "--iterations", "3", "--warmup", "0")
    assert timed.returncode == 0, timed.stderr
    result = json.loads((tmp_path / "out" / "bench.ort-cpu.json").read_text())
    assert set(result["models"]) == {"fp32", "fp16", "fp8"} and "graph optimization basic" in result["timing"]


def test_bench_bad_inputs(tmp_path):
    missing = run_cli("bench", str(tmp_path / "nope.onnx"))
    assert missing.returncode == 2 and "no such model file or artifacts folder" in missing.stderr
    empty = run_cli("bench", str(tmp_path))
    assert empty.returncode == 2 and "no manifest.json, so not a build's output folder; run `python -m pipeline build --out" in empty.stderr
    (tmp_path / "m.onnx").write_bytes(b"x")
    batch = run_cli("bench", str(tmp_path / "m.onnx"), "--batch", "4")
    assert batch.returncode == 2 and "has no dynamic 'batch' dim" in batch.stderr


def test_the_bench_chart_keeps_its_legend_off_the_marks():
    """The new user's one-model bench: the legend sat over the p99 mark. It is right of the plot now, clear of every mark."""
    import matplotlib.pyplot as plt

    from trt.bench import chart

    row = {"p50_ms": 0.2201, "p90_ms": 0.2566, "p99_ms": 0.2726, "mean_ms": 0.2285, "min_ms": 0.2079, "max_ms": 0.2744, "throughput_per_s": 8752.2, "iterations": 5}
    figure = chart({"backend": "ort-cpu", "batch": 2, "timing": "wall clock per run", "models": {"model.int8": {"model": "m.onnx", **row}}})
    figure.canvas.draw()
    axis = figure.axes[0]
    legend, plot_area = axis.get_legend().get_window_extent(), axis.get_window_extent()
    assert not legend.overlaps(plot_area) and legend.x1 <= figure.bbox.x1  # beside the plot, and inside the picture
    plt.close(figure)
