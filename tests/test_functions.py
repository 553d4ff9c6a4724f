"""`export --functions`: modules as ONNX local functions (TorchScript exporter), inlined by `optimize`
(and by the report and compare) with each inlined node keeping the module it came from."""

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from conftest import REPO, run_cli, write_profile

from pipeline.core.profiles import load_profile
from pipeline.core.samples import make_inputs
from pipeline.core.scopes import inline_functions_proto, module_name, node_scope
from pipeline.core.verify import OnnxSession
from pipeline.export import export_model
from pipeline.optimize import optimize_file

LAYERS = 4


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("functions")
    text = (REPO / "profiles" / "bert-tiny.toml").read_text().replace("layers = 12", f"layers = {LAYERS}")
    profile = load_profile(str(write_profile(folder, text, "bert4.toml")))
    plain, functions = folder / "plain.onnx", folder / "functions.onnx"
    export_model(profile, plain, exporter="torchscript")
    export_model(profile, functions, exporter="torchscript", functions=["EncoderLayer"])
    return profile, plain, functions


def outputs(path, feeds):
    return OnnxSession(path, as_written=True).run(feeds)


def test_each_layer_is_one_call_stamped_with_its_module(exports):
    _, _, functions = exports
    model = onnx.load(str(functions), load_external_data=False)
    calls = [n for n in model.graph.node if n.op_type.startswith("EncoderLayer")]
    assert model.functions and len(calls) == LAYERS
    assert [module_name(node_scope(n.name, {p.key: p.value for p in n.metadata_props})) for n in calls] == [f"encoder.layers.{i}" for i in range(LAYERS)]


def test_inlined_model_equals_the_function_model(exports, tmp_path):
    profile, _, functions = exports
    inlined = inline_functions_proto(onnx.load(str(functions)))
    assert not inlined.functions
    onnx.save(inlined, str(tmp_path / "inlined.onnx"))
    for seed in (1, 2):
        feeds = make_inputs(profile, seed=seed)
        for a, b in zip(outputs(functions, feeds), outputs(tmp_path / "inlined.onnx", feeds), strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    scopes = Counter(module_name(node_scope(n.name, {p.key: p.value for p in n.metadata_props})) for n in inlined.graph.node if n.op_type == "MatMul")
    assert all(scopes[f"encoder.layers.{i}"] > 0 for i in range(LAYERS)), "inlined nodes keep the module of their call"


def test_optimize_gives_the_same_result_on_both_forms(exports, tmp_path):
    profile, plain, functions = exports
    optimize_file(plain, tmp_path / "plain.opt.onnx")
    optimize_file(functions, tmp_path / "functions.opt.onnx")
    ops = [Counter(n.op_type for n in ir.load(tmp_path / name).graph) for name in ("plain.opt.onnx", "functions.opt.onnx")]
    assert ops[0] == ops[1] and not ir.load(tmp_path / "functions.opt.onnx").functions
    feeds = make_inputs(profile, seed=3)
    for a, b in zip(outputs(tmp_path / "plain.opt.onnx", feeds), outputs(tmp_path / "functions.opt.onnx", feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("args, message", [
    (("--functions", "EncoderLayer"), "--functions needs --exporter torchscript"),
    (("--exporter", "torchscript", "--functions", "Nope"), "--functions Nope: no submodule of that class; the model's classes are "),
])
def test_functions_bad_input(tmp_path, args, message):
    result = run_cli("export", "-o", str(tmp_path / "m.onnx"), *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "m.onnx").exists()


def test_compare_torch_folds_the_modules_inside_each_function_into_one_line(exports, tmp_path):
    """Issue 27: `compare --torch` on an export with functions listed every submodule of each function call as
    "not mapped" (183 lines for bert-tiny); the text shows one line per function call instead (JSON keeps every row)."""
    from pipeline.diagnose.divergence import compare_to_torch
    from pipeline.diagnose.render import render
    from pipeline.models.module import build_module

    profile, _, functions = exports
    result, _ = compare_to_torch(profile, build_module(profile)[0], functions, make_inputs(profile, seed=30_000), tmp_path)
    inside = [r for r in result.rows if r.tensor is None and r.module.startswith("encoder.layers.")]
    assert len(inside) > LAYERS * 5
    lines = render(result, "text").splitlines()
    folded = [line for line in lines if ".* " in line]
    assert [line.split()[0] for line in folded] == [f"encoder.layers.{i}.*" for i in range(LAYERS)]
    assert sum(int(line.split()[1]) for line in folded) == len(inside)
    assert all("inside a module exported as a function" in line for line in folded)
    assert len(lines) == 3 + len(result.rows) - len(inside) + LAYERS
