"""On a GPU machine with TensorRT (our Docker image): `pytest -m gpu`. Real engines, real properties.

What the conformance tests (tests/test_trt_conformance.py) check against the real bindings with a
simulated GPU, these check on a real one: both builders, the per-layer profile, the CUDA-event timing,
the engine accuracy check through Polygraphy, the timing cache reused across builds.
"""

import json

import pytest
from conftest import run_cli

from trt.capability import tensorrt_missing
from trt.parsers import parse_layer_info, parse_timing

pytestmark = pytest.mark.gpu
PRECISIONS = ("fp32", "fp16", "int8")


@pytest.fixture(scope="module", autouse=True)
def tensorrt_and_gpu():
    """Each test fails with the one line that says what this machine lacks, not with a build's assertion."""
    missing = tensorrt_missing()
    if missing:
        pytest.fail(f"`pytest -m gpu` needs TensorRT and a GPU: {missing}; run it in our Docker image (docker/gpu-check.sh)", pytrace=False)


def build(out, *options):
    result = run_cli("build", "--fp16", "--int8", "--strict", "--out", str(out), *options, timeout=3600)
    assert result.returncode == 0, result.stderr
    return {s["name"]: s for s in json.loads((out / "manifest.json").read_text())["stages"]}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    build(out)
    return out


@pytest.fixture(scope="module")
def polygraphy_built(tmp_path_factory):
    """The same build with `[build] builder = "polygraphy"`."""
    from pipeline.core.profiles import REPO_PROFILES

    folder = tmp_path_factory.mktemp("gpu-polygraphy")
    profile = folder / "bert-tiny-polygraphy.toml"
    profile.write_text((REPO_PROFILES / "bert-tiny.toml").read_text().replace('name = "bert-tiny"', 'name = "bert-tiny-polygraphy"')
                       + '\n[build]\nbuilder = "polygraphy"\n')
    return folder, build(folder / "out", "--profile", str(profile))


def test_engines_deserialize(built):
    import tensorrt as trt

    runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
    for prec in PRECISIONS:
        assert runtime.deserialize_cuda_engine((built / f"{prec}.engine").read_bytes()) is not None


def test_layer_json_parses_and_has_metadata(built):
    for prec in PRECISIONS:
        plan = parse_layer_info(built / f"{prec}.layers.json")
        assert plan.verbosity == "detailed" and any(layer.mapping == "metadata" and layer.onnx_nodes for layer in plan.layers)


def test_every_engine_layer_is_profiled_over_every_run(built):
    stages = {s["name"]: s for s in json.loads((built / "manifest.json").read_text())["stages"]}
    for prec in PRECISIONS:
        names = {layer.name for layer in parse_layer_info(built / f"{prec}.layers.json").layers}
        records = json.loads((built / f"{prec}.profile.json").read_text())
        timed = {record.name for record in parse_timing(built / f"{prec}.profile.json")}
        assert records[0]["count"] == 20, "the profile's iterations ([build] profile_iterations)"
        assert timed == names and stages["build"]["metrics"][prec]["profiled_layers"] == len(names)


def test_engine_accuracy_against_onnxruntime_fp32_is_recorded(built):
    metrics = {s["name"]: s for s in json.loads((built / "manifest.json").read_text())["stages"]}["build"]["metrics"]
    gates = {"fp32": 0.999, "fp16": 0.999, "int8": 0.99}  # the fp16 / int8 stages' default gates
    for prec, minimum in gates.items():
        accuracy = metrics[prec]["accuracy"]
        assert accuracy["samples"] == 16 and accuracy["cosine_centered"] >= minimum, (prec, accuracy)


def test_a_second_build_reuses_the_timing_cache(built):
    stages = build(built, "--force")
    assert {stages["build"]["metrics"][prec]["timing_cache"] for prec in PRECISIONS} == {"reused"}


def test_polygraphy_builder_builds_profiles_and_checks_the_same_engines(built, polygraphy_built):
    folder, stages = polygraphy_built
    out = folder / "out"
    assert [stages[name]["status"] for name in ("build", "report", "diff", "bench")] == ["done"] * 4
    for prec in PRECISIONS:
        metrics = stages["build"]["metrics"][prec]
        assert metrics["builder"] == "polygraphy" and metrics["accuracy"]["cosine_centered"] >= 0.99
        assert metrics["layers"] == len(parse_layer_info(out / f"{prec}.layers.json").layers) > 0
        assert "[I] Building engine with configuration" in (out / f"{prec}.build.log").read_text()


def test_int8_engine_has_int8_layers(built):
    report = json.loads((built / "int8.report.json").read_text())
    assert report["breakdown"]["precisions"].get("INT8", 0) > 0


def test_diff_and_bench_ran(built):
    stages = {s["name"]: s for s in json.loads((built / "manifest.json").read_text())["stages"]}
    assert stages["diff"]["status"] == "done" and stages["bench"]["status"] == "done"
    bench = json.loads((built / "bench.trt.json").read_text())
    assert set(bench["models"]) == set(PRECISIONS) and all(m["p50_ms"] > 0 for m in bench["models"].values())


def test_bench_ort_cuda(built):
    result = run_cli("bench", str(built), "--backend", "ort-cuda", "--iterations", "50")
    assert result.returncode == 0, result.stderr
    assert json.loads((built / "bench.ort-cuda.json").read_text())["models"]["fp32"]["p50_ms"] > 0
