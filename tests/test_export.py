"""Export stage on real models: both exporters, numerics vs torch, node names vs the real TensorRT log."""

import re

import numpy as np
import onnx
import pytest
from conftest import TINY_MLP_PROFILE, write_profile

from pipeline.core.errors import InputError, ProfileError, StageFailed
from pipeline.core.profiles import load_profile
from pipeline.core.samples import make_inputs
from pipeline.core.verify import run_onnx
from pipeline.export import export_model


def log_node_names(log_path) -> set[str]:
    """Distinct `[ONNX Layer: name]` entries of a TensorRT builder log (the model's specification)."""
    return set(re.findall(r"\[ONNX Layer: ([^\]]+)\]", log_path.read_text()))


def test_torchscript_export_names_nodes_as_the_real_tensorrt_log(bert_tiny_torchscript, trt_fixtures):
    wanted = log_node_names(trt_fixtures / "bert-fp16-trt10.10.detailed.log")
    assert len(wanted) == 334
    names = {node.name for node in onnx.load(str(bert_tiny_torchscript), load_external_data=False).graph.node}
    found = wanted & names
    assert len(found) / len(wanted) >= 0.95, sorted(wanted - names)[:20]


def test_bert_tiny_both_exporters_match_torch(bert_tiny_torchscript, tmp_path):
    profile = load_profile("bert-tiny")
    result = export_model(profile, tmp_path / "dynamo.onnx", exporter="dynamo")
    assert result.exporter == "dynamo" and result.max_abs_diff <= 1e-4
    model = onnx.load(str(tmp_path / "dynamo.onnx"), load_external_data=False)
    assert [i.name for i in model.graph.input] == ["concat_ids", "sent_ids", "pos_ids", "concat_mask"]
    assert model.graph.input[3].type.tensor_type.elem_type == onnx.TensorProto.BOOL
    # both exports compute the same score on the same valid inputs
    feeds = make_inputs(profile, seed=7)
    (a,) = run_onnx(tmp_path / "dynamo.onnx", feeds)
    (b,) = run_onnx(bert_tiny_torchscript, feeds)
    assert a.shape == (1,) and np.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_dynamic_dims_are_exported_and_checked_at_two_shapes(tmp_path, exporter):
    profile = load_profile(str(write_profile(tmp_path, TINY_MLP_PROFILE)))
    result = export_model(profile, tmp_path / "m.onnx", exporter=exporter)
    assert [s["x"] for s in result.checked_shapes] == [[4, 8], [2, 8]]  # opt, then opt // 2
    (out,) = run_onnx(tmp_path / "m.onnx", {"x": np.ones((11, 8), np.float32)})
    assert out.shape == (11, 4)


def test_factory_may_return_its_own_example_inputs(tmp_path):
    text = TINY_MLP_PROFILE.replace("factories:tiny_mlp", "factories:tiny_mlp_with_examples")
    result = export_model(load_profile(str(write_profile(tmp_path, text))), tmp_path / "m.onnx")
    assert result.max_abs_diff <= 1e-4


def test_factory_dynamic_shapes_by_argument_name(tmp_path):
    text = TINY_MLP_PROFILE.replace("factories:tiny_mlp", "factories:tiny_mlp_with_dynamic_shapes")
    export_model(load_profile(str(write_profile(tmp_path, text))), tmp_path / "m.onnx")
    (out,) = run_onnx(tmp_path / "m.onnx", {"x": np.ones((5, 8), np.float32)})
    assert out.shape == (5, 4)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_unsupported_operator_names_op_and_module(tmp_path, exporter):
    text = '[model]\nfactory = "factories:polygamma_model"\n[[inputs]]\nname = "x"\ndtype = "float32"\nshape = [2, 8]\n'
    profile = load_profile(str(write_profile(tmp_path, 'name = "poly"\n' + text)))
    with pytest.raises(InputError) as info:
        export_model(profile, tmp_path / "m.onnx", exporter=exporter)
    message = str(info.value)
    assert "aten.polygamma" in message and "module '1.1' (_Special)" in message and exporter in message
    assert not (tmp_path / "m.onnx").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["p.toml"], "no temporary file may be left behind"


def test_the_export_tolerance_is_relative_to_outputs_above_one(tmp_path):
    """Outputs near 1e6 carry float32 rounding near 0.1: an absolute 1e-4 would fail every such export.
    Above 1 the tolerance scales with the output's largest magnitude, and a failure says so."""
    text = TINY_MLP_PROFILE.replace("factories:tiny_mlp", "factories:scaled_tiny_mlp")
    profile = load_profile(str(write_profile(tmp_path, text)))
    result = export_model(profile, tmp_path / "m.onnx")
    assert profile.export.tolerance < result.max_abs_diff < profile.export.tolerance * 1e6
    strict = load_profile(str(write_profile(tmp_path, text + "[export]\ntolerance = 1e-12\n", "strict.toml")))
    with pytest.raises(StageFailed, match=r"> tolerance 1e-12 x \S+, the output's largest magnitude \(dynamo exporter"):
        export_model(strict, tmp_path / "strict.onnx")

def test_tolerance_failure_reports_the_numbers(tmp_path):
    """The dynamo export of GELU differs from torch by ~1e-7: a 1e-12 tolerance must fail, with figures."""
    profile = load_profile(str(write_profile(tmp_path, TINY_MLP_PROFILE + "[export]\ntolerance = 1e-12\n")))
    with pytest.raises(StageFailed, match=r"max_abs_diff=\S+ > tolerance 1e-12 \(dynamo exporter, opset 20, input shapes"):
        export_model(profile, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize(
    ("factory", "expected"),
    [("no_such_module:f", "module 'no_such_module' is not importable"), ("factories:missing", "has no function 'missing'"),
     ("factories:not_a_module", "returned int, expected a torch.nn.Module or")],
)
def test_bad_factory(tmp_path, factory, expected):
    text = TINY_MLP_PROFILE.replace("factories:tiny_mlp", factory)
    with pytest.raises(ProfileError, match=expected):
        export_model(load_profile(str(write_profile(tmp_path, text))), tmp_path / "m.onnx")


PADDED_POOL_PROFILE = """name = "padded-pool"
[model]
factory = "factories:padded_max_pool"
[dims.batch]
min = 1
opt = 4
max = 8
[[inputs]]
name = "x"
dtype = "float32"
shape = ["batch", 4, 16, 16]
"""


def test_the_export_is_checked_as_written_not_through_onnxruntimes_pad_fusion(tmp_path):
    """onnxruntime's basic-level PadFusion folds Pad(0) into the MaxPool after it, whose padding is -inf: over a window of
    negative values the file computes 0 and the fused pool the negative maximum (what failed BiT's export by 3e-3).
    The export's check runs the graph as written, so a correct file passes."""
    profile = load_profile(str(write_profile(tmp_path, PADDED_POOL_PROFILE)))
    result = export_model(profile, tmp_path / "m.onnx")
    assert result.max_abs_diff <= 1e-6


LENGTH_LOOP_PROFILE = """name = "length-loop"
[model]
factory = "factories:steps_over_its_length"
[dims.batch]
min = 1
opt = 2
max = 4
[dims.seq]
min = 2
opt = 8
max = 16
[[inputs]]
name = "x"
dtype = "float32"
shape = ["batch", "seq", 3]
"""


def test_a_dim_the_models_code_fixes_is_refused_naming_the_dim_and_the_line(tmp_path):
    """torch.onnx retries a specialized dim with torch's suggested fix (the example's size): the file then takes one
    length. The export says which dim, at what size, where the model's code fixed it, and what to set; it writes nothing."""
    profile = load_profile(str(write_profile(tmp_path, LENGTH_LOOP_PROFILE)))
    with pytest.raises(InputError) as info:
        export_model(profile, tmp_path / "m.onnx")
    message = str(info.value)
    assert "dim 'seq' at 8" in message and "factories.py" in message and "min = opt = max" in message, message
    assert [p.name for p in tmp_path.iterdir()] == ["p.toml"]
    static = load_profile(str(write_profile(tmp_path, LENGTH_LOOP_PROFILE.replace("min = 2", "min = 8").replace("max = 16", "max = 8"), "s.toml")))
    assert export_model(static, tmp_path / "s.onnx").max_abs_diff == 0.0


def test_init_writes_a_dim_the_models_code_fixes_static_at_the_size_it_was_fixed(tmp_path):
    """init's export trial (pipeline/models/starter.py) turns the refusal above into a profile that exports: the dim at
    the size the export fixed it at, commented; the export of the written profile then passes."""
    import tomlkit

    from pipeline.models.starter import choose_exporter

    document, path = tomlkit.parse(LENGTH_LOOP_PROFILE), tmp_path / "written.toml"
    choose_exporter(document, path, "StepsOverItsLength")
    path.write_text(tomlkit.dumps(document))
    assert [document["dims"]["seq"][key] for key in ("min", "opt", "max")] == [8, 8, 8]
    assert "StepsOverItsLength's code fixes it" in path.read_text()
    assert export_model(load_profile(str(path)), tmp_path / "m.onnx").max_abs_diff == 0.0


def test_init_writes_the_profile_untried_when_its_budget_runs_out_during_the_export_trial(tmp_path):
    """The export trial is init's last step: out of time there, the profile the model ran on is written as it was,
    its comment saying the export was not tried (a budget of 0 off the main thread: spent as the step starts, no timing)."""
    import threading

    import tomlkit

    from pipeline.core.budget import TimeBudget
    from pipeline.models.starter import choose_exporter

    document = tomlkit.parse(LENGTH_LOOP_PROFILE + '[export]\nexporter = "dynamo"\n')

    def init_out_of_time() -> None:
        with TimeBudget(0, "the test"):
            choose_exporter(document, tmp_path / "written.toml", "StepsOverItsLength")

    worker = threading.Thread(target=init_out_of_time)
    worker.start()
    worker.join()
    text = tomlkit.dumps(document)
    assert "# not tried: exporting StepsOverItsLength with the dynamo exporter did not finish within init's time budget" in text
    assert [document["dims"]["seq"][key] for key in ("min", "max")] == [2, 16]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_forward_that_draws_random_numbers_is_refused_in_one_line(tmp_path, exporter):
    """Its outputs differ on every run: the check's failure is explained, exit 2, and nothing is left in --out."""
    from conftest import run_cli

    text = TINY_MLP_PROFILE.replace("factories:tiny_mlp", "factories:random_mask") + f'[export]\nexporter = "{exporter}"\n'
    result = run_cli("build", "--profile", str(write_profile(tmp_path, text)), "--until", "export", "--out", str(tmp_path / "out"))
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(errors) == 1, result.stderr
    assert "Sequential's forward draws random numbers (RandomUniformLike node" in errors[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_a_dim_the_exported_graph_takes_at_one_size_only_is_refused_by_name(tmp_path):
    """xLSTM's exported graph ran at the profile's opt sizes and failed at the export check's others (onnxruntime's
    Gather out of bounds): an index the exporter kept as a number. Each differing dim is tried alone and the one that
    fails is named, as a dim the exporter fixed (exit 2), where before the line named a temporary file."""
    from onnx import TensorProto, helper

    from pipeline.core.verify import OnnxSession
    from pipeline.fixed_dims import DimFixed, dim_the_graph_fixed

    index = helper.make_tensor("index", TensorProto.INT64, [], [100])  # runs while seq > 100 (opt 128), not at 64
    graph = helper.make_graph([helper.make_node("Gather", ["x", "index"], ["y"], axis=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])], [index])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(tmp_path / "m.onnx"))
    profile = load_profile(str(write_profile(tmp_path, 'name = "m"\n[model]\nfactory = "factories:small_mlp"\n[dims.batch]\nmin = 1\nopt = 4\n'
                                                        'max = 16\n[dims.seq]\nmin = 8\nopt = 128\nmax = 512\n[[inputs]]\nname = "x"\n'
                                                        'dtype = "float32"\nshape = ["batch", "seq"]\n')))
    session = OnnxSession(tmp_path / "m.onnx")
    with pytest.raises(StageFailed):
        session.run(make_inputs(profile, seed=0, dims={"batch": 2, "seq": 64}))
    fixed = dim_the_graph_fixed(profile, session, {"batch": 2, "seq": 64}, "M")
    assert isinstance(fixed, DimFixed) and (fixed.dim, fixed.size) == ("seq", 128) and fixed.exit_code == 2
    assert str(fixed).startswith("export: M's exported graph runs at seq = 128 but not at seq = 64 although [dims.seq] is 8..512 "
                                 "(onnxruntime: Gather node")
    assert "set [dims.seq] min = opt = max to the size you deploy" in str(fixed)
    assert dim_the_graph_fixed(profile, session, {"batch": 2, "seq": 128}, "M") is None  # the batch alone runs


def test_an_exported_graph_onnxruntime_cannot_run_is_the_exporters_failure_not_a_temporary_file(tmp_path, monkeypatch):
    """SmolVLM's vision graph failed onnxruntime's GatherND at the export's own sizes; the line named the atomic
    write's temporary file. It names the exporter, the shapes and onnxruntime's node, and nothing is left."""
    from pipeline.core import verify

    def refuses(self, feeds, run_options=None):
        raise StageFailed("the session's own line") from RuntimeError(
            "Non-zero status code returned while running GatherND node. Name:'g' Status Message: invalid index found, index = 6")

    monkeypatch.setattr(verify.OnnxSession, "run", refuses)
    profile = load_profile(str(write_profile(tmp_path, TINY_MLP_PROFILE)))
    with pytest.raises(StageFailed, match=r"^export: the dynamo exporter's graph does not run on onnxruntime at input shapes \{.*\} "
                                          r"\(GatherND node 'g': invalid index found, index = 6\); try the other exporter \(--exporter\)$"):
        export_model(profile, tmp_path / "m.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.toml"]


def test_an_arange_of_numbers_exports_as_the_constant_torch_computes(tmp_path):
    """arange(1/7, 1.0, 1/7) has 7 elements in torch (its length counted in double), 6 in the exporter's float32 Range:
    SmolVLM's vision embeddings declared shapes onnxruntime then failed on. Exported as torch's constant, it matches."""
    from conftest import run_cli

    text = TINY_MLP_PROFILE.replace("factories:tiny_mlp", "factories:seventh_steps")
    result = run_cli("build", "--profile", str(write_profile(tmp_path, text)), "--until", "export", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "Range" not in {node.op_type for node in onnx.load(tmp_path / "out" / "model.onnx").graph.node}


def test_bucketize_exports_as_a_count_that_onnxruntime_runs(tmp_path):
    """torch decomposes bucketize into a binary search whose GatherND reads past 13 boundaries (SmolVLM's and
    Idefics3's vision position ids: onnxruntime failed at every shape). Exported as a count of the boundaries below
    each value, the graph matches torch and reads no index."""
    from conftest import run_cli

    text = TINY_MLP_PROFILE.replace("factories:tiny_mlp", "factories:bucketized_positions")
    result = run_cli("build", "--profile", str(write_profile(tmp_path, text)), "--until", "export", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    ops = {node.op_type for node in onnx.load(tmp_path / "out" / "model.onnx").graph.node}
    assert "ReduceSum" in ops and not ops & {"GatherND", "Loop"}


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_the_module_is_let_go_before_onnxruntime_loads_the_export(tmp_path, monkeypatch, exporter):
    """Issue 33: torch's outputs are computed first and the module let go, so the module and onnxruntime's session never
    hold the weights at once (at 0.5B parameters that pair was the export's peak)."""
    import weakref

    from pipeline import export

    built, module_alive = [], []
    real_build = export.build_module

    def build(profile):
        result = real_build(profile)
        built.append(weakref.ref(result[0]))
        return result

    class Probe(export.OnnxSession):
        def __init__(self, *args, **kwargs):
            module_alive.append(built[0]() is not None)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(export, "build_module", build)
    monkeypatch.setattr(export, "OnnxSession", Probe)
    result = export_model(load_profile(str(write_profile(tmp_path, TINY_MLP_PROFILE))), tmp_path / "m.onnx", exporter=exporter)
    assert module_alive == [False] and result.max_abs_diff < 1e-5
