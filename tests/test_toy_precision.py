"""Adding a precision is its registry entry and its stage module (pipeline/precisions.py): a toy precision,
a copy of BF16 under another name, registered before the CLI starts, is accepted by build, quantize, bench,
jobs plan and diff without another file of the project changing."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO, TESTS, TINY_MLP_PROFILE, write_profile

# the two files a new precision needs: its stage module (here BF16's, renamed) and its entry, registered here
# before the CLI reads the registry
MAIN = textwrap.dedent("""
    import dataclasses, sys
    from pipeline import precisions
    toy = dataclasses.replace(precisions.by_name("bf16"), name="toy", label="TOY", module="toy_stage", summary="BF16 under another name")
    precisions.PRECISIONS = (*precisions.PRECISIONS, toy)
    from pipeline.cli import main
    sys.argv = ["pipeline", *sys.argv[1:]]
    main()
""")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toy")
    stage = (REPO / "pipeline" / "stages" / "bf16.py").read_text().replace("bf16", "toy").replace("BF16", "TOY")
    (folder / "toy_stage.py").write_text(stage.replace("convert_toy", "convert_bf16"))  # the library call stays BF16's
    (folder / "toy_main.py").write_text(MAIN)
    write_profile(folder, TINY_MLP_PROFILE + "[quant]\naccuracy_samples = 2\nmin_cosine_toy = 0.9\n")
    return folder


def run(folder, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(TESTS), str(REPO)]), "COLUMNS": "200"}
    return subprocess.run([sys.executable, str(folder / "toy_main.py"), *args], cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def test_a_registered_precision_gets_its_flags_and_its_stage(toy):
    for command in ("build", "quantize"):
        assert "--toy" in run(toy, command, "--help").stdout
    built = run(toy, "build", "--profile", "p.toml", "--toy", "--until", "toy", "--out", "out")
    assert built.returncode == 0, built.stderr
    assert [line.split()[0] for line in built.stdout.splitlines() if line.split()[1:2] == ["done"]] == ["export", "optimize", "toy"]
    assert (toy / "out" / "model.toy.onnx").is_file()
    record = json.loads((toy / "out" / "manifest.json").read_text())["stages"][-1]
    assert record["name"] == "toy" and record["metrics"]["min_cosine"] == 0.9 and "quant.min_cosine_toy" in record["key"]["settings"]
    made = run(toy, "quantize", "out/model.opt.onnx", "-o", "q.onnx", "--toy", "--profile", "p.toml")
    assert made.returncode == 0 and made.stdout.startswith("wrote q.onnx: ") and "TOY (AutoCast" in made.stdout, made.stderr
    assert (toy / "q.onnx").read_bytes() == (toy / "out" / "model.toy.onnx").read_bytes()


def test_bench_runs_every_precision_built_and_says_which_this_backend_cannot(toy):
    if not (toy / "out" / "manifest.json").is_file():
        pytest.skip("needs the build of the test above")
    timed = run(toy, "bench", "out", "--backend", "ort-cpu", "--iterations", "3", "--warmup", "0", "--profile", "p.toml")
    assert timed.returncode == 0, timed.stderr
    assert "  fp32: p50" in timed.stdout and "   toy: not timed: " in timed.stdout and "no kernel" in timed.stdout
    assert set(json.loads((toy / "out" / "bench.ort-cpu.json").read_text())["not_timed"]) == {"toy"}


def test_jobs_plan_and_a_misspelt_gate_know_the_new_precision(toy):
    (toy / "matrix.toml").write_text('name = "toy"\nprecisions = ["fp32", "toy"]\nbackends = ["ort-cpu"]\nrepeats = 1\n'
                                     '[[models]]\nprofile = "p.toml"\n')
    planned = run(toy, "jobs", "plan", "matrix.toml")
    assert planned.returncode == 0 and " toy " in planned.stdout, planned.stderr
    write_profile(toy, TINY_MLP_PROFILE + "[quant]\nmin_cosine_tyo = 0.9\n", "typo.toml")
    refused = run(toy, "build", "--profile", "typo.toml", "--toy", "--out", "typo")
    assert refused.returncode == 2 and "quant.min_cosine_tyo: no precision 'tyo' has this gate; did you mean min_cosine_toy?" in refused.stderr
    assert not (toy / "typo").exists()


def test_diff_compares_any_two_engines_of_a_build(toy, tmp_path):
    """A build folder whose manifest records two engines' layer information (real TensorRT files: a ResNet-18
    FP16 and QAT INT8 engine, tests/data/trt) as fp16's and toy's: `diff FOLDER --a fp16 --b toy` reads them."""
    layers = {name: tmp_path / f"{name}.layers.json" for name in ("fp16", "toy")}
    shutil.copy(TESTS / "data" / "trt" / "trex_resnet18_A100_fp16.graph.json", layers["fp16"])
    shutil.copy(TESTS / "data" / "trt" / "trex_resnet18_A100_qat_int8.graph.json", layers["toy"])
    record = {"name": "build", "status": "done", "seconds": 1.0, "outputs": {f"{n}_layers": p.name for n, p in layers.items()}}
    (tmp_path / "manifest.json").write_text(json.dumps({"profile": "p", "stages": [record]}))
    diffed = run(toy, "diff", str(tmp_path), "--a", "fp16", "--b", "toy", "--format", "json")
    assert diffed.returncode == 0, diffed.stderr
    direct = run(toy, "diff", str(layers["fp16"]), str(layers["toy"]), "--format", "json")
    assert json.loads(diffed.stdout) == json.loads(direct.stdout)
    missing = run(toy, "diff", str(tmp_path), "--a", "fp16", "--b", "int8")
    assert missing.returncode == 2 and "--b int8: " in missing.stderr and "its engines: fp16, toy" in missing.stderr
