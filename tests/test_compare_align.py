"""`compare A B` aligned by execution: two exports of one model whose tensor names have nothing in
common (dynamo vs TorchScript) align with every float result paired equal, the nodes that differ
shown; a perturbed initializer is named as the first divergent row, in its module, on an exporter
pair and on an FP32/FP16 pair; inputs that differ only in name are fed by position."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import TINY_MLP_PROFILE, run_cli, write_profile
from onnx import numpy_helper

from pipeline.core.profiles import load_profile
from pipeline.core.samples import make_inputs
from pipeline.core.scopes import module_name, node_scope
from pipeline.diagnose.compare import AlignedRow, Alignment, align_models
from pipeline.diagnose.render import render
from pipeline.export import export_model

CORPUS = ("hf-llama-tiny", "hf-gpt2-tiny", "hf-bert-tiny")


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each corpus profile exported by both exporters: (dynamo, torchscript)."""
    folder = tmp_path_factory.mktemp("exports")
    pairs = {}
    for name in CORPUS:
        for exporter in ("dynamo", "torchscript"):
            export_model(load_profile(name), folder / f"{name}.{exporter}.onnx", exporter=exporter)
        pairs[name] = (folder / f"{name}.dynamo.onnx", folder / f"{name}.torchscript.onnx")
    return pairs


def align(a: Path, b: Path, profile: str, **kwargs) -> Alignment:
    feeds = make_inputs(load_profile(profile), seed=30_000)
    with tempfile.TemporaryDirectory() as workdir:
        return align_models(a, b, feeds, Path(workdir), **kwargs)


def perturb(source: Path, target: Path, module: str, scale: float = 0.5) -> str:
    """Copy the model with the largest initializer read by a node of `module` changed by `scale` x its
    max |w| on a tenth of its entries; returns the initializer's name."""
    model = onnx.load(str(source))
    initializers = {t.name: t for t in model.graph.initializer}
    reading = [t for n in model.graph.node if module_name(node_scope(n.name, {p.key: p.value for p in n.metadata_props})) == module
               for t in n.input if t in initializers]
    name = max(reading, key=lambda t: int(np.prod(initializers[t].dims)))
    weight = numpy_helper.to_array(initializers[name]).copy()
    flat = weight.reshape(-1)
    flat[:: 10] += scale * np.abs(flat).max()
    initializers[name].CopyFrom(numpy_helper.from_array(weight, name))
    onnx.save(model, str(target))
    return name


def float_pairs(result: Alignment) -> list[AlignedRow]:
    return [r for r in result.rows if r.a and r.b and r.a.dtype.startswith("float")]


def test_llama_exporters_align_and_the_output_names_what_differs(exports, tmp_path):
    dynamo, torchscript = exports["hf-llama-tiny"]
    result = run_cli("compare", str(dynamo), str(torchscript), "--profile", "hf-llama-tiny")
    assert result.returncode == 0, result.stderr
    verdict, header, columns, *rows = result.stdout.splitlines()
    assert verdict.startswith("no divergence: every paired float result is equal within 0.0001;")
    assert "aligned by execution (1 of" in header  # the names have nothing in common but the inputs
    marks = [row.split()[1] for row in rows if row.split()[0].isdigit()]
    assert set(marks) <= {"=", "~", "-", "+"} and "-" in marks and "+" in marks
    assert any("equal rows" in row for row in rows), "runs of equal rows are folded"
    # the nodes that differ: dynamo's GatherND is paired with what TorchScript computes instead, values equal
    gathernd = [row for row in rows if " GatherND " in row.split("|")[0]]
    assert gathernd and all(row.split()[1] == "=" and "GatherND" not in row.split("|")[1] for row in gathernd)
    # dynamo transposes each Linear weight at run time; TorchScript stores it transposed: paired equal
    assert any(row.split()[1:3] == ["=", "Transpose"] and row.split("|")[1].split()[0] == "initializer" for row in rows)

    data = json.loads(run_cli("compare", str(dynamo), str(torchscript), "--profile", "hf-llama-tiny", "-f", "json").stdout)
    assert data["first_divergence"] is None and data["aligned_by"] == "execution" and data["verdict"] == verdict
    pairs = [r for r in data["rows"] if r["a"] and r["b"] and r["a"]["dtype"].startswith("float")]
    assert len(pairs) > 100 and all(r["mark"] == "=" and r["relative"] <= 1e-4 for r in pairs)
    outputs = [r for r in data["rows"] if r["a"] and r["a"]["name"] == "last_hidden_state"]
    assert outputs and outputs[0]["b"]["name"] == "last_hidden_state" and outputs[0]["mark"] == "="


@pytest.mark.parametrize("name", ["hf-gpt2-tiny", "hf-bert-tiny"])
def test_corpus_exporter_pairs_align_with_every_graph_output_paired(exports, name):
    dynamo, torchscript = exports[name]
    result = align(dynamo, torchscript, name)
    assert result.first_divergence is None
    pairs = float_pairs(result)
    assert len(pairs) > 50 and all(r.mark == "=" for r in pairs)
    outputs = [o.name for o in onnx.load(str(dynamo), load_external_data=False).graph.output]
    paired = {r.a.name: r.b.name for r in pairs}
    assert all(paired.get(o) == o for o in outputs), "each graph output is paired with the same output of B"
    # more than half of A's float results find their counterpart, though no name is shared
    floats_a = [r for r in result.rows if r.a and r.a.dtype.startswith("float") and r.a.kind == "result"]
    assert sum(1 for r in floats_a if r.b) > 0.5 * len(floats_a)


def test_a_perturbed_initializer_is_the_first_divergence_on_an_exporter_pair(exports, tmp_path):
    dynamo, torchscript = exports["hf-llama-tiny"]
    module = "layers.1.mlp.down_proj"
    weight = perturb(torchscript, tmp_path / "perturbed.onnx", module)
    result = align(dynamo, tmp_path / "perturbed.onnx", "hf-llama-tiny")
    first = result.first_divergence
    assert first is not None and first.a.module == module and first.b.module == module
    assert first.b.name in (weight, *[r.b.name for r in result.rows if r.b and r.b.op == "MatMul"])
    before = [r for r in result.rows[: first.row - 1] if r.mark == "~"]
    assert before == [], "nothing diverges before it"
    later = [r for r in float_pairs(result)[-3:]]
    assert any(r.mark == "~" for r in later), "the divergence reaches the outputs"

    # html: one table row per aligned row, the verdict links to the highlighted first divergence, equal runs folded
    page = render(result, "html")
    assert f'<a href="#row{first.row}">first divergence at row {first.row}' in page
    assert f'<tr id="row{first.row}" class="first">' in page and page.count('class="first"') == 2  # among the rows around it, and in place
    assert page.count("<tr id=\"row") == len(result.rows) and "Around the first divergence" in page
    assert "<tbody hidden>" in page and "equal rows (" in page


def test_a_perturbed_initializer_is_the_first_divergence_on_an_fp32_fp16_pair(exports, tmp_path):
    from quant.fp16 import convert_fp16

    name = "hf-bert-tiny"
    source = exports[name][1]
    fp16 = tmp_path / "model.fp16.onnx"
    convert_fp16(source, fp16, [], [], [make_inputs(load_profile(name), seed=1)])
    clean = align(source, fp16, name)
    assert clean.precision == "fp16" and clean.aligned_by == "names, then execution"
    assert clean.first_divergence is None, clean.first_divergence
    assert max(r.relative for r in float_pairs(clean)) > 1e-4, "fp16 is not equal at the fp32 tolerance: the band is in use"
    module = "encoder.layer.1.intermediate.dense"
    perturb(fp16, tmp_path / "perturbed.onnx", module)
    first = align(source, tmp_path / "perturbed.onnx", name).first_divergence
    assert first is not None and first.a.module == module and first.b.module == module


def test_inputs_that_differ_only_in_name_are_fed_by_position(exports, tmp_path):
    dynamo, torchscript = exports["hf-bert-tiny"]
    model = onnx.load(str(torchscript))
    for node in model.graph.node:
        node.input[:] = ["input0" if t == "input_ids" else t for t in node.input]
    next(i for i in model.graph.input if i.name == "input_ids").name = "input0"
    onnx.save(model, str(tmp_path / "renamed.onnx"))
    result = align(dynamo, tmp_path / "renamed.onnx", "hf-bert-tiny")
    assert result.inputs == ["B's input 'input0' fed A's 'input_ids' (matched by position, dtype and rank)"]
    assert result.first_divergence is None


def test_nodes_keeps_a_subset(exports):
    dynamo, torchscript = exports["hf-bert-tiny"]
    result = align(dynamo, torchscript, "hf-bert-tiny", nodes=r"layer\.0\.")
    kept = [side for r in result.rows for side in (r.a, r.b) if side and side.kind != "input"]
    assert kept and all(".layer.0." in "." + side.module + "." or "layer.0" in side.node for side in kept)
    assert result.first_divergence is None and float_pairs(result)


def test_exporters_compares_both_exports_with_torch_and_each_other(tmp_path):
    profile = write_profile(tmp_path, TINY_MLP_PROFILE)
    result = run_cli("compare", "--exporters", "--profile", str(profile), "-f", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data["torch"]) == {"dynamo", "torchscript"}
    for side in data["torch"].values():
        assert side["mapped"] > 0 and side["first_diverging"] is None and side["outputs_max_abs_diff"] <= side["tolerance"]
    errors = {e: side["outputs_max_abs_diff"] for e, side in data["torch"].items()}
    assert data["closer_to_torch"] == (None if errors["dynamo"] == errors["torchscript"] else min(errors, key=errors.get))
    aligned = data["alignment"]
    assert aligned["a"] == "dynamo export" and aligned["first_divergence"] is None and aligned["counts"]["equal"] > 0


@pytest.mark.parametrize("optimizer", ["onnxslim", "onnxscript"])
def test_our_optimized_graph_aligns_with_another_optimizers(exports, tmp_path, optimizer):
    """model.opt.onnx against onnxslim's or onnxscript's optimization of the same export: they keep some
    names and list independent branches in another order; every paired result is equal."""
    from pipeline.optimize import optimize_file

    source = exports["hf-bert-tiny"][0]
    optimize_file(source, tmp_path / "model.opt.onnx")
    if optimizer == "onnxslim":
        import onnxslim

        other = onnxslim.slim(onnx.load(str(source)))
    else:
        from onnxscript import optimizer as onnxscript_optimizer

        other = onnxscript_optimizer.optimize(onnx.load(str(source)))
    onnx.save(other, str(tmp_path / "other.onnx"))
    result = align(tmp_path / "model.opt.onnx", tmp_path / "other.onnx", "hf-bert-tiny")
    assert result.first_divergence is None
    pairs = float_pairs(result)
    assert all(r.mark == "=" for r in pairs)
    outputs = [o.name for o in onnx.load(str(tmp_path / "model.opt.onnx"), load_external_data=False).graph.output]
    assert all(any(r.a.name == o and r.b.name == o for r in pairs) for o in outputs)
    floats_b = [r for r in result.rows if r.b and r.b.dtype.startswith("float") and r.b.kind == "result"]
    assert sum(1 for r in floats_b if r.a) > 0.8 * len(floats_b), "most of B's float results find their counterpart in A"


def test_the_html_tables_size_columns_to_their_content_and_wrap_only_names(tmp_path):
    """At 1,400 px the new user saw 2,193 cells cut with an ellipsis: numbers (`9.54e…`), headers (`max …`), ops, shapes. The
    columns now size to their content: numbers, ops, shapes, values and headers on one line, whole; names wrap at spaces and
    after / _ . (never inside a word)."""
    import re

    from pipeline.diagnose.compare import NodeComparison, NodeError

    profile = write_profile(tmp_path, 'name = "tiny-cnn-bn"\n[model]\nfactory = "factories:tiny_cnn"\nkwargs = { trained_bn = true }\n'
                                      '[dims.batch]\nmin = 1\nopt = 2\nmax = 4\n[[inputs]]\nname = "x"\ndtype = "float32"\nshape = ["batch", 3, 16, 16]\n')
    result = run_cli("compare", "--exporters", "--profile", str(profile), "-f", "html", "-o", str(tmp_path / "e.html"))
    assert result.returncode == 0, result.stderr
    aligned = (tmp_path / "e.html").read_text()
    by_name = render(NodeComparison("a.onnx", "b.onnx", 4, 45, {"output": 0.00418}, [NodeError(
        "node__native_batch_norm_legit_no_training_2__0", "BatchNormalization", "getitem_6", 0.159, 0.0334, 0.125, "getitem_6_QuantizeLinear", "blocks.0.bn2")]), "html")
    for page in (aligned, by_name):
        assert "ellipsis" not in page and "table-layout: fixed" not in page and "<colgroup>" not in page
        assert re.search(r"\n th, td \{[^}]*white-space: nowrap", page) and re.search(r"\n td\.name \{[^}]*white-space: normal", page)
    # names break after their separators; ops, shapes and values are in cells that never wrap
    assert '<td class="name">/<wbr>stem/<wbr>stem.<wbr>0/<wbr>Conv_<wbr>output_<wbr>0</td>' in aligned
    assert '<td class="join">Conv</td><td>2x8x16x16</td>' in aligned and '<th class="num">max abs</th>' in aligned
    assert '<td class="name">blocks.<wbr>0.<wbr>bn2</td><td>BatchNormalization</td><td class="num">0.0334</td>' in by_name
    # the exporters agree (only weights differ, the verdict says): the verdict is not marked as a warning
    assert '<div class="verdict">both exports are equally close to torch' in aligned


def test_the_verdict_names_the_largest_output_errors_and_counts_the_rest():
    """A 30-layer decoder's 61 outputs (logits and 60 cache tensors) made compare's first line 1,900 characters long."""
    from pipeline.diagnose.compare import VERDICT_OUTPUTS, NodeComparison

    outputs = {"logits": 0.379, **{f"present.{i}.key": i / 1000 for i in range(60)}}
    verdict = NodeComparison("a.onnx", "b.onnx", 4, 61, outputs, []).verdict
    assert verdict.endswith("error at the outputs: logits 0.379, present.59.key 0.059, present.58.key 0.058, present.57.key 0.057 "
                            f"and {61 - VERDICT_OUTPUTS} more (--format json has each)"), verdict
    assert len(verdict) < 250


def test_an_index_choice_b_makes_differently_is_named_as_a_changed_choice_not_rounding(tmp_path):
    """A top-1 routing (scores, TopK, Gather of the chosen expert's row): where B's scores round the other way, B gathers
    another row. compare said "input err 0, output err 1.66" at the Gather of an INT8 mixture of experts (OLMoE), its
    float input unchanged and its integer input, the routing, not compared."""
    from onnx import TensorProto, helper

    from pipeline.diagnose.compare import compare_models

    rng = np.random.default_rng(0)
    router, experts = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((4, 16)).astype(np.float32)

    def write(path: Path, router_weights: np.ndarray) -> Path:
        nodes = [helper.make_node("MatMul", ["x", "router"], ["scores"], name="route"),
                 helper.make_node("TopK", ["scores", "k"], ["top", "chosen"], name="pick", axis=-1),
                 helper.make_node("Gather", ["experts", "chosen"], ["expert"], name="take_expert", axis=0)]
        graph = helper.make_graph(nodes, "moe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 8])],
                                  [helper.make_tensor_value_info("expert", TensorProto.FLOAT, [32, 1, 16])],
                                  [numpy_helper.from_array(router_weights, "router"), numpy_helper.from_array(experts, "experts"),
                                   numpy_helper.from_array(np.array([1], np.int64), "k")])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
        return path

    feeds = [{"x": rng.standard_normal((32, 8)).astype(np.float32)}]
    a = write(tmp_path / "a.onnx", router)
    b = write(tmp_path / "b.onnx", router + rng.standard_normal(router.shape).astype(np.float32) * 0.3)
    result = compare_models(a, b, feeds, tmp_path)
    top = result.nodes[0]
    assert (top.node, top.input_error) == ("take_expert", 0.0) and 0 < top.index_change < 1
    assert f"its integer input differs in {top.index_change:.1%} of elements" in result.verdict
    assert compare_models(a, a, feeds, tmp_path).nodes[0].index_change == 0
