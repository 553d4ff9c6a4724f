"""Declarative stages: each stage's settings hold only what it declared, and changing a setting reruns
exactly the stages that read it (the others are cached, or rerun only because an input file changed)."""

import shutil

import numpy as np
import pytest
from conftest import TESTS, TINY_MLP_PROFILE, write_profile
from rich.console import Console

from pipeline import precisions
from pipeline.core.manifest import Manifest
from pipeline.core.profiles import load_profile
from pipeline.runner import Runner
from pipeline.settings import Options, Settings, UndeclaredSetting, settings_registry
from pipeline.stage import Context, Stage, StageResult
from pipeline.stages import catalogue

STAGES = catalogue()
EXPORT, OPTIMIZE, FP16, INT8, FP8, INT4, BF16 = (next(s for s in STAGES if s.name == n) for n in ("export", "optimize", "fp16", "int8", "fp8", "int4", "bf16"))
REGISTRY = settings_registry()
CPU_STAGES = [EXPORT, OPTIMIZE, FP16, INT8]
BASE_OPTIONS = {"fp16": True, "int8": True}


def as_options(given: dict) -> Options:
    """Options from the flags as a dict ({"fp16": True, "calib": path}): the precisions' flags and the rest."""
    flags = {p.name for p in precisions.optional()}
    return Options(frozenset(name for name in flags if given.get(name)), **{k: v for k, v in given.items() if k not in flags})
# an MLP ModelOpt quantizes (it leaves GEMMs with K or N under 16 in float: an INT8 stage with nothing quantized fails)
PROFILE = (TINY_MLP_PROFILE.replace("factories:tiny_mlp", "factories:small_mlp").replace('shape = ["batch", 8]', 'shape = ["batch", 32]')
           + "[quant]\nsamples = 4\naccuracy_samples = 4\n")


def changed(profile, **sections):
    """`profile` with fields of its sections replaced: changed(p, quant={"samples": 5})."""
    update = {name: getattr(profile, name).model_copy(update=fields) for name, fields in sections.items()}
    return profile.model_copy(update=update)


def calib_file(folder):
    path = folder / "calib.npz"
    if not path.exists():
        np.savez(path, x=np.random.default_rng(1).standard_normal((6, 32)).astype(np.float32))
    return path


NONE = lambda folder: {}  # noqa: E731

# one change per setting: (profile -> profile, options); every setting of the registry has one
CHANGES = {
    "onnx": (lambda p, d: p, lambda d: {"onnx": TESTS / "data" / "does-not-matter.onnx"}),
    "calib": (lambda p, d: p, lambda d: {"calib": calib_file(d)}),
    "precisions": (lambda p, d: p, lambda d: {"fp16": False}),
    "weak_fp16": (lambda p, d: p, lambda d: {"weak_fp16": True}),
    "repair": (lambda p, d: p, lambda d: {"repair": False}),
    "model": (lambda p, d: changed(p, model={"seed": 4}), NONE),
    "inputs": (lambda p, d: p.model_copy(update={"inputs": [p.inputs[0].model_copy(update={"range": (-2.0, 2.0)})]}), NONE),
    "dims": (lambda p, d: p.model_copy(update={"dims": {"batch": p.dims["batch"].model_copy(update={"max": 8})}}), NONE),
    "export": (lambda p, d: changed(p, export={"tolerance": 2e-4}), NONE),
    "optimize": (lambda p, d: changed(p, optimize={"tolerance": 2e-5}), NONE),
    "quant.preset": (lambda p, d: p, lambda d: {"preset": "modelopt"}),
    "quant.samples": (lambda p, d: changed(p, quant={"samples": 5}), NONE),
    "quant.calibration_method": (lambda p, d: changed(p, quant={"calibration_method": "max"}), NONE),
    "quant.int8_float_dtype": (lambda p, d: changed(p, quant={"int8_float_dtype": "fp16"}), NONE),
    "quant.accuracy_samples": (lambda p, d: changed(p, quant={"accuracy_samples": 3}), NONE),
    "quant.min_cosine_fp16": (lambda p, d: changed(p, quant={"min_cosine": {"fp16": 0.99}}), NONE),
    "quant.min_cosine_int8": (lambda p, d: changed(p, quant={"min_cosine": {"int8": 0.98}}), NONE),
    "quant.min_cosine_fp8": (lambda p, d: changed(p, quant={"min_cosine": {"fp8": 0.98}}), NONE),
    "quant.min_cosine_int4": (lambda p, d: changed(p, quant={"min_cosine": {"int4": 0.97}}), NONE),
    "quant.min_cosine_bf16": (lambda p, d: changed(p, quant={"min_cosine": {"bf16": 0.98}}), NONE),
    "quant.min_token_agreement_fp16": (lambda p, d: changed(p, quant={"min_token_agreement": {"fp16": 0.9}}), NONE),
    "quant.min_token_agreement_int8": (lambda p, d: changed(p, quant={"min_token_agreement": {"int8": 0.9}}), NONE),
    "quant.int4_method": (lambda p, d: changed(p, quant={"int4_method": "rtn_dq"}), NONE),
    "quant.fp16_exclude_op_types": (lambda p, d: changed(p, quant={"fp16_exclude_op_types": ["Gelu"]}), NONE),
    "quant.fp16_exclude_nodes": (lambda p, d: changed(p, quant={"fp16_exclude_nodes": ["no_such_node"]}), NONE),
    "quant.int8_exclude_nodes": (lambda p, d: changed(p, quant={"int8_exclude_nodes": ["no_such_node"]}), NONE),
    "quant.fp8_exclude_nodes": (lambda p, d: changed(p, quant={"fp8_exclude_nodes": ["no_such_node"]}), NONE),
    "build.verbosity": (lambda p, d: p, lambda d: {"verbosity": "layer_names_only"}),
    "build.workspace_mib": (lambda p, d: changed(p, build={"workspace_mib": 2048}), NONE),
    "build.optimization_level": (lambda p, d: changed(p, build={"optimization_level": 4}), NONE),
    "build.log_severity": (lambda p, d: changed(p, build={"log_severity": "verbose"}), NONE),
    "build.builder": (lambda p, d: changed(p, build={"builder": "trtexec"}), NONE),
    "build.profile_warmup": (lambda p, d: changed(p, build={"profile_warmup": 1}), NONE),
    "build.profile_iterations": (lambda p, d: changed(p, build={"profile_iterations": 3}), NONE),
    "build.bench_warmup": (lambda p, d: changed(p, build={"bench_warmup": 1}), NONE),
    "build.bench_iterations": (lambda p, d: changed(p, build={"bench_iterations": 3}), NONE),
}


def test_every_setting_has_a_change_here():
    assert set(CHANGES) == set(REGISTRY)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("settings")
    return load_profile(str(write_profile(folder, PROFILE))), folder


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_a_setting_changes_the_key_of_exactly_the_stages_that_read_it(tiny, name):
    """Every stage, the TensorRT ones included: its settings' key moves exactly when it declared the setting."""
    profile, folder = tiny
    edit_profile, edit_options = CHANGES[name]
    after_profile, after_options = edit_profile(profile, folder), {**BASE_OPTIONS, **edit_options(folder)}
    moved = {stage.name for stage in STAGES
             if Settings(stage.name, profile, as_options(BASE_OPTIONS), stage.reads).keys()
             != Settings(stage.name, after_profile, as_options(after_options), stage.reads).keys()}
    assert moved == {stage.name for stage in STAGES if name in stage.reads}


def run(profile, folder, options, stages=CPU_STAGES):
    ctx = Context(profile, folder, Manifest.load_or_new(folder / "manifest.json", profile.name), as_options(options))
    with open(folder / "console.txt", "a") as console:
        return {r.name: r for r in Runner(ctx, Console(file=console, width=200)).run(stages)}


@pytest.fixture(scope="module")
def first_run(tiny, tmp_path_factory):
    profile, _ = tiny
    out = tmp_path_factory.mktemp("first")
    records = run(profile, out, BASE_OPTIONS)
    assert {r.status for r in records.values()} == {"done"}
    return out


READ_ON_CPU = sorted({name for stage in CPU_STAGES for name in stage.reads} - {"onnx"})


@pytest.mark.parametrize("name", READ_ON_CPU)
def test_changing_a_setting_reruns_exactly_the_stages_that_read_it(tiny, first_run, tmp_path, name):
    """A real second run on a tiny model: a stage that reads the setting reruns and says so; any other is
    cached, or reruns only because an earlier stage wrote a different file."""
    profile, folder = tiny
    out = tmp_path / "out"
    shutil.copytree(first_run, out)
    edit_profile, edit_options = CHANGES[name]
    records = run(edit_profile(profile, folder), out, {**BASE_OPTIONS, **edit_options(folder)})
    for stage in CPU_STAGES:
        record = records[stage.name]
        if name in stage.reads:
            assert record.status == "done" and f"setting {name}" in record.reason, (stage.name, record.reason)
        else:
            assert record.status == "cached" or (record.status == "done" and "input " in record.reason
                                                  and f"setting {name}" not in record.reason), (stage.name, record.status, record.reason)


def test_a_stage_reading_a_setting_it_did_not_declare_fails(tiny, tmp_path):
    profile, _ = tiny
    settings = Settings("int8", profile, Options(preset="modelopt"), ("quant.preset", "dims"))
    assert settings.profile.quant.preset == "modelopt" and settings.profile.dims == profile.dims
    for read in (lambda: settings.profile.quant.samples, lambda: settings.profile.build, lambda: settings.profile.inputs,
                 lambda: settings.calib):
        with pytest.raises(UndeclaredSetting, match="which it does not declare"):
            read()
    with pytest.raises(AttributeError, match="frozen"):
        settings.profile_view = None

    def sneaky(job):
        return StageResult({}, {"samples": job.settings.profile.quant.samples})

    ctx = Context(profile, tmp_path, Manifest.load_or_new(tmp_path / "manifest.json", profile.name))
    with pytest.raises(UndeclaredSetting, match="stage 'int8' read quant.samples"):
        Runner(ctx, Console(file=open(tmp_path / "c.txt", "w"))).run([Stage("int8", sneaky, reads=("quant.preset",))])
    (record,) = Manifest.load_or_new(tmp_path / "manifest.json", profile.name).stages
    assert record.status == "failed" and "quant.samples" in record.reason


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_quantize_and_build_give_the_same_model(tiny, first_run, tmp_path, precision):
    """`quantize` calls the stage's own entry with the settings its flags and the profile make: same bytes.
    (The command runs in this process: ModelOpt is imported once for the module.)"""
    from typer.testing import CliRunner

    from pipeline.cli import app

    _, folder = tiny
    output = tmp_path / f"q.{precision}.onnx"
    result = CliRunner().invoke(app, ["quantize", str(first_run / "model.opt.onnx"), "-o", str(output), f"--{precision}", "--profile", str(folder / "p.toml")])
    assert result.exit_code == 0, result.output
    assert output.read_bytes() == (first_run / f"model.{precision}.onnx").read_bytes()


# the fp8 / int4 / bf16 stages (issue 25): their own first run, and a rerun for each setting only they read
NEW_STAGES = [EXPORT, OPTIMIZE, FP8, INT4, BF16]
NEW_OPTIONS = {"fp8": True, "int4": True, "bf16": True}


# a sequence dim: the Linears export as MatMul (AWQ's INT4 leaves a Gemm with transB=1 in float)
SEQUENCE_PROFILE = PROFILE.replace('shape = ["batch", 32]', 'shape = ["batch", 2, 32]')


@pytest.fixture(scope="module")
def tiny_sequence(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sequence")
    return load_profile(str(write_profile(folder, SEQUENCE_PROFILE))), folder


@pytest.fixture(scope="module")
def new_run(tiny_sequence, tmp_path_factory):
    profile, _ = tiny_sequence
    out = tmp_path_factory.mktemp("new")
    records = run(profile, out, NEW_OPTIONS, NEW_STAGES)
    assert {r.status for r in records.values()} == {"done"}, {n: r.reason for n, r in records.items()}
    return out


@pytest.mark.parametrize("name", ["quant.min_cosine_fp8", "quant.fp8_exclude_nodes", "quant.min_cosine_int4", "quant.min_cosine_bf16", "quant.int4_method",
                                  "quant.preset"])
def test_changing_a_new_precision_setting_reruns_exactly_its_stage(tiny_sequence, new_run, tmp_path, name):
    profile, folder = tiny_sequence
    out = tmp_path / "out"
    shutil.copytree(new_run, out)
    edit_profile, edit_options = CHANGES[name]
    records = run(edit_profile(profile, folder), out, {**NEW_OPTIONS, **edit_options(folder)}, NEW_STAGES)
    for stage in NEW_STAGES:
        record = records[stage.name]
        if name in stage.reads:
            assert record.status == "done" and f"setting {name}" in record.reason, (stage.name, record.reason)
        else:
            assert record.status == "cached", (stage.name, record.status, record.reason)
    assert sum(name in stage.reads for stage in NEW_STAGES) == 1


@pytest.mark.parametrize("precision", ["fp8", "int4", "bf16"])
def test_quantize_and_build_give_the_same_new_precision_model(tiny_sequence, new_run, tmp_path, precision):
    """quantize --fp8/--int4/--bf16 call the stages' own entries: the same bytes as the build wrote."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    _, folder = tiny_sequence
    output = tmp_path / f"q.{precision}.onnx"
    result = CliRunner().invoke(app, ["quantize", str(new_run / "model.opt.onnx"), "-o", str(output), f"--{precision}", "--profile", str(folder / "p.toml")])
    assert result.exit_code == 0, result.output
    assert output.read_bytes() == (new_run / f"model.{precision}.onnx").read_bytes()


def test_a_library_failing_on_a_valid_model_is_a_failed_stage(tiny, first_run, tmp_path, monkeypatch):
    """ModelOpt raising on the (valid) optimized model: the int8 stage is `failed`, one line naming the
    library's error, exit code 1 (a failed stage), not 2 (the user's input)."""
    import modelopt.onnx.quantization

    from pipeline.core.errors import StageFailed

    def broken(**kwargs):
        raise RuntimeError("calibration produced no ranges\nsecond line of the library's message")

    monkeypatch.setattr(modelopt.onnx.quantization, "quantize", broken)
    profile, _ = tiny
    out = tmp_path / "out"
    shutil.copytree(first_run, out)
    ctx = Context(profile, out, Manifest.load_or_new(out / "manifest.json", profile.name), as_options(BASE_OPTIONS))
    with pytest.raises(StageFailed) as info:
        Runner(ctx, Console(file=open(tmp_path / "c.txt", "w")), force=True).run(CPU_STAGES)
    assert info.value.exit_code == 1
    record = Manifest.load_or_new(out / "manifest.json", profile.name).get("int8")
    assert record.status == "failed" and "\n" not in record.reason
    assert record.reason.startswith("int8: ModelOpt cannot quantize") and "RuntimeError: calibration produced no ranges" in record.reason


def test_calibration_batches_come_from_the_profile_that_describes_the_model(tiny, first_run):
    """quantize --int8 --calib without --profile used bert-tiny's batch for any model: a profile describing
    other inputs says nothing of this model's batch (1), the model's own profile does (opt 4)."""
    from pipeline.stages.shared import calibration_batch

    profile, _ = tiny
    model = first_run / "model.opt.onnx"  # dynamic batch
    assert calibration_batch(profile, model) == profile.dims["batch"].opt == 4
    assert calibration_batch(load_profile("bert-tiny"), model) == 1


def test_the_table_in_docs_stages_md_is_what_the_stages_declare():
    import re

    from conftest import REPO

    lines = (REPO / "docs" / "stages.md").read_text().split("## Which settings each stage reads", 1)[1].splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if line.startswith("|")]
    header, documented = rows[0], {}
    for row in rows[2:]:
        for name in re.findall(r"`([\w.]+)`", row[0].split(" (")[0]):  # the settings named before any remark
            documented[name] = {header[i] for i, cell in enumerate(row) if cell == "x"}
    declared = {name: {s.name for s in STAGES if name in s.reads} for name in REGISTRY}
    assert documented == declared
