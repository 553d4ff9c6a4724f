"""Engine diff by region on real TensorRT outputs: identity, symmetry, the Swin 8.2 and ResNet (TREx)
FP16/INT8 pairs, nodes TensorRT folds away, and the Q/DQ pairs at a cut."""

import json

import pytest
from conftest import TRT_DATA, run_cli
from trt_facts import names_only_records

from trt.diff import build_diff, diff_from_files
from trt.onnx_graph import Node, OnnxGraph
from trt.parsers import parse_layer_info
from trt.plan import EnginePlan, Layer
from trt.views import Split

LAYER_FILES = sorted(p.name for p in TRT_DATA.iterdir() if p.suffix in (".json", ".log") and not p.name.endswith(".profile.json"))
SWIN = ("trt82_swin_tiny_fp16_T4_builder_layers.log", "trt82_swin_tiny_int8_T4_builder_layers.log")
RESNET50 = ("trex_tf_resnet50_RTX3090_fp16.graph.json", "trex_tf_resnet50_RTX3090_qat_int8.graph.json")
RESNET18 = ("trex_resnet18_A100_fp16.graph.json", "trex_resnet18_A100_qat_int8.graph.json")


@pytest.mark.parametrize("name", LAYER_FILES)
def test_an_engine_against_itself_is_identical_and_nothing_else(trt_fixtures, name):
    diff = diff_from_files(trt_fixtures / name, trt_fixtures / name)
    assert diff.identical and diff.splits == [] and diff.merges == []
    assert diff.findings == ["identical: the two files describe the same layers, regions and precisions"]
    assert diff.verdict.startswith("identical")
    assert all(r.status == "same" and r.precision_change is None for r in diff.regions)


def _cuts(splits: list[Split]) -> list[tuple]:
    return sorted((s.a_region.name, tuple(p.region.name for p in s.pieces)) for s in splits)


@pytest.mark.parametrize("pair", [SWIN, RESNET50, RESNET18])
def test_split_and_merge_are_symmetric(trt_fixtures, pair):
    forward = diff_from_files(*(trt_fixtures / name for name in pair))
    backward = diff_from_files(*(trt_fixtures / name for name in reversed(pair)))
    assert _cuts(forward.splits) == _cuts(backward.merges) and _cuts(forward.merges) == _cuts(backward.splits)


def test_swin_fp16_int8_per_region(trt_fixtures):
    """TensorRT 8.2, layer names only: Conv_0 goes FP16 -> INT8; INT8 ends the Myelin region earlier and runs
    Gemm_2128 (and the final reshape) outside it, which the FP16 region's range end shows."""
    diff = diff_from_files(*(trt_fixtures / name for name in SWIN))
    conv = next(r for r in diff.regions if r.a.name == "Conv_0")
    assert (conv.status, conv.precision_change) == ("same", "FP16 -> INT8")
    (split,) = diff.splits
    int8_records = names_only_records(trt_fixtures / SWIN[1])
    myelin_b = next(r["name"] for r in int8_records if r["type"] == "Myelin")
    after = [r for r in int8_records[[r["name"] for r in int8_records].index(myelin_b) + 1 :] if r["type"] not in ("Reformat", "NoOp")]
    assert split.a_region.kind == "myelin" and split.approximate
    assert [p.region.name for p in split.pieces] == [myelin_b] + [r["name"] for r in after]
    assert diff.verdict.startswith("B (INT8): A (FP16)'s Myelin region") and "cut into 2 regions" in diff.verdict
    assert "lint-qdq" not in diff.verdict, "no Q/DQ pair is known at this cut"
    # issue 36: the finding said the region spans "(1 ONNX node)": a names-only range names its ends, not its nodes
    (finding,) = [f for f in diff.findings if "runs in B (INT8) as 2 regions" in f]
    assert "(a names-only range: its ONNX nodes are known with --onnx-a)" in finding and "ONNX node)" not in finding


def test_resnet50_fp16_int8_aligned_per_region_with_precision_changes(trt_fixtures):
    """TensorFlow ResNet-50 (TREx): the QAT export renamed the nodes (`quant_...`), so regions are aligned
    by order and kind; every convolution goes FP16 -> INT8."""
    diff = diff_from_files(*(trt_fixtures / name for name in RESNET50))
    assert diff.join == "order-and-type"
    raw = [json.loads((trt_fixtures / name).read_text())["Layers"] for name in RESNET50]
    convs = [sum(layer["LayerType"].endswith("Convolution") for layer in layers) for layers in raw]
    pairs = [r for r in diff.aligned if r.a and r.b and r.a.type.endswith("Convolution") and r.b.type.endswith("Convolution")]
    assert len(pairs) == min(convs)
    assert all(r.precision_change == "FP16 -> INT8" for r in pairs)
    assert "changed precision" in diff.verdict


def test_resnet18_alignment_pairs_every_convolution(trt_fixtures):
    diff = diff_from_files(*(trt_fixtures / name for name in RESNET18))
    pairs = [(r.a.name, r.b.name) for r in diff.aligned if r.a and r.b]
    assert ("Conv_5 + Add_6 + Relu_7", "layer1.0.conv2.weight + QuantizeLinear_32 + Conv_34 + Add_36 + Relu_37") in pairs
    b_qdq = [layer.name for layer in parse_layer_info(trt_fixtures / RESNET18[1]).layers if layer.qdq]
    assert diff.b.breakdown.qdq_layers == b_qdq and not any(r.b and r.b.name in b_qdq for r in diff.aligned)


def test_names_only_region_against_its_kernels_is_the_same_region(trt_fixtures, bert_tiny_torchscript):
    """The same BERT engine seen as one ForeignNode (names only) and as 88 kernels (detailed): with the ONNX the
    range resolves, and all of it runs in the detailed engine's one Myelin graph. Nodes in the range that
    TensorRT folded (absent from the detailed Metadata) are not a split."""
    names_only, detailed = trt_fixtures / "bert-fp16-trt10.10.layer_names_only.log", trt_fixtures / "bert-fp16-trt10.10.detailed.log"
    diff = diff_from_files(names_only, detailed, onnx_a=bert_tiny_torchscript, onnx_b=bert_tiny_torchscript)
    assert diff.join == "onnx-names" and diff.splits == [] and diff.merges == []
    (row,) = diff.regions
    assert row.status == "same" and [p.region.name for p in row.b] == ["Myelin graph 0"]
    a_nodes = set(parse_layer_info(names_only).layers[0].onnx_nodes)
    b_nodes = {n for layer in parse_layer_info(detailed).layers for n in layer.onnx_nodes}
    assert a_nodes - b_nodes, "the ForeignNode names nodes TensorRT folded away"


def test_too_few_names_to_join_says_so(trt_fixtures):
    diff = diff_from_files(trt_fixtures / "bert-fp16-trt10.10.layer_names_only.log", trt_fixtures / "bert-fp16-trt10.10.detailed.log")
    assert diff.join == "order-and-type"
    assert "too few to join" in diff.findings[0] and "--onnx-a" in diff.findings[0]


def test_q_dq_pairs_at_each_cut_come_from_b_s_graph():
    """The graph walk on a constructed plan (not TensorRT output): A runs MatMul->Add->Relu as one Myelin graph,
    B runs MatMul, then Add+Relu, with a Q/DQ pair between them in B's ONNX."""
    def layer(name, nodes, graph=None):
        return Layer(name=name, type="kgen" if graph is not None else "CaskGemm", onnx_nodes=nodes, mapping="metadata", myelin_graph=graph)

    a = EnginePlan("a", "constructed", "detailed", [layer("k0_myl0_0", ["mm", "add"], 0), layer("k1_myl0_1", ["relu"], 0)])
    b = EnginePlan("b", "constructed", "detailed", [layer("mm", ["mm"]), layer("q_dq", ["q", "dq"]), layer("add + relu", ["add", "relu"])])
    for plan in (a, b):
        plan.settle()
    graph_b = OnnxGraph("b.onnx", [Node("mm", "MatMul", ["x", "w"], ["t"], ()), Node("q", "QuantizeLinear", ["t", "s", "z"], ["tq"], ()),
                                   Node("dq", "DequantizeLinear", ["tq", "s", "z"], ["td"], ()), Node("add", "Add", ["td", "c"], ["u"], ()),
                                   Node("relu", "Relu", ["u"], ["y"], ())], set())
    diff = build_diff(a, b, None, graph_b)
    (split,) = diff.splits
    assert [p.region.name for p in split.pieces] == ["mm", "add + relu"] and split.qdq_pairs == 1
    (cut,) = split.cuts
    assert (cut.from_node, cut.to_node, cut.quantize, cut.dequantize) == ("mm", "add", "q", "dq")
    assert diff.fusion_map["qdq"] == [[diff.fusion_map["nodes"].index("add"), "q -> dq"]]
    assert _cuts(build_diff(b, a, graph_b, None).merges) == _cuts(diff.splits)


def test_diff_cli(tmp_path, trt_fixtures):
    a, b = (str(trt_fixtures / name) for name in SWIN)
    text = run_cli("diff", a, b)
    assert text.returncode == 0 and text.stdout.startswith("B (INT8): A (FP16)'s Myelin region")
    assert "Cut in B" in text.stdout and "Gemm_2128" in text.stdout
    html = run_cli("diff", a, b, "-f", "html", "-o", str(tmp_path / "d.html"))
    page = (tmp_path / "d.html").read_text()
    assert html.returncode == 0 and page.index('class="verdict') < page.index("Fusion map") < page.index("<table")
    compact = run_cli("diff", a, b, "-f", "json")
    assert json.loads(compact.stdout)["splits"][0]["approximate"] is True
