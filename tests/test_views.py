"""One view per command (issue 36): report, diff and compare render one result to each of their formats,
which differ in layout, never in conclusion: every format opens with the same verdict line. compare's
HTML shows the comparison its text shows (not an aligned single-sample view instead), its columns are
defined in the output, its tables fit the page, and a build folder's files are compared with the
profile the build recorded."""

import html
import json
import re

import pytest
from conftest import REPO, TINY_MLP_PROFILE, TRT_DATA, run_cli, write_profile

from trt.diff import diff_from_files
from trt.render import FORMATS, render
from trt.report import report_from_files

LAYER_FILES = sorted(p.name for p in TRT_DATA.iterdir() if p.suffix in (".json", ".log") and not p.name.endswith(".profile.json"))
DIFF_PAIRS = [
    ("trt82_swin_tiny_fp16_T4_builder_layers.log", "trt82_swin_tiny_int8_T4_builder_layers.log", None, None),
    ("trex_tf_resnet50_RTX3090_fp16.graph.json", "trex_tf_resnet50_RTX3090_qat_int8.graph.json",
     "trex_tf_resnet50_RTX3090_fp16.profile.json", "trex_tf_resnet50_RTX3090_qat_int8.profile.json"),
    ("trex_resnet18_A100_fp16.graph.json", "trex_resnet18_A100_qat_int8.graph.json", None, None),
    ("bert-fp16-trt10.10.detailed.log", "bert-fp16-trt10.10.detailed.log", None, None),
]
CNN_PROFILE = ('name = "tiny-cnn"\n[model]\nfactory = "factories:tiny_cnn"\n[dims.batch]\nmin = 1\nopt = 2\nmax = 4\n'
               '[[inputs]]\nname = "x"\ndtype = "float32"\nshape = ["batch", 3, 16, 16]\n')


def verdict_of(output: str, fmt: str) -> str:
    """The verdict line as a reader of `fmt` sees it."""
    if fmt == "json":
        return json.loads(output)["verdict"]
    if fmt == "html":
        found = re.search(r'<div class="verdict[^"]*">(.*?)</div>', output, re.DOTALL)
        return html.unescape(re.sub(r"<[^>]+>", "", found.group(1)))
    if fmt == "md":
        line = next(line for line in output.splitlines() if line.startswith("**") and line.endswith("**"))
        return re.sub(r"\\(.)", r"\1", line[2:-2])
    return output.splitlines()[0]


@pytest.mark.parametrize("name", LAYER_FILES)
def test_a_report_shows_one_verdict_in_every_format(trt_fixtures, name):
    report = report_from_files(trt_fixtures / name)
    assert {fmt: verdict_of(render(report, fmt), fmt) for fmt in FORMATS} == dict.fromkeys(FORMATS, report.verdict)


@pytest.mark.parametrize("a, b, timing_a, timing_b", DIFF_PAIRS, ids=[pair[1] for pair in DIFF_PAIRS])
def test_a_diff_shows_one_verdict_in_every_format(trt_fixtures, a, b, timing_a, timing_b):
    diff = diff_from_files(trt_fixtures / a, trt_fixtures / b, timing_a=timing_a and trt_fixtures / timing_a, timing_b=timing_b and trt_fixtures / timing_b)
    assert {fmt: verdict_of(render(diff, fmt), fmt) for fmt in FORMATS} == dict.fromkeys(FORMATS, diff.verdict)


# ---------------------------------------------------------------- compare on a real small model


@pytest.fixture(scope="module")
def cnn_build(tmp_path_factory):
    """A small CNN (two conv blocks, a residual, a classifier) built to model.opt.onnx and model.int8.onnx from a
    profile file: the build's manifest records it."""
    folder = tmp_path_factory.mktemp("cnn")
    profile = write_profile(folder, CNN_PROFILE, "cnn.toml")
    result = run_cli("build", "--profile", str(profile), "--int8", "--until", "int8", "--out", str(folder / "out"))
    assert result.returncode == 0, result.stderr
    return folder / "out"


def compare_outputs(*args: str) -> dict[str, str]:
    """`compare ARGS` in every format."""
    outputs = {}
    for fmt in ("text", "json", "html"):
        result = run_cli("compare", *args, "-f", fmt)
        assert result.returncode == 0, result.stderr
        outputs[fmt] = result.stdout
    return outputs


def cnn_args(cnn_build, *args: str) -> list[str]:
    """`args` with the build's files as paths, and the profile named (as if the build folder recorded none)."""
    return [*(str(cnn_build / a) if a.endswith(".onnx") else a for a in args), "--profile", str(cnn_build.parent / "cnn.toml")]


@pytest.mark.parametrize("args", [("model.opt.onnx", "model.int8.onnx"), ("model.opt.onnx", "model.int8.onnx", "--align"), ("--torch", "model.opt.onnx")],
                         ids=["by name", "aligned", "torch"])
def test_compare_shows_one_verdict_in_every_format(cnn_build, args):
    """Issue 36: for a small CNN the HTML page said "no divergence" (an aligned single-sample view) where the text
    named the error at block2.act; every format now shows the comparison the command line asks for."""
    outputs = compare_outputs(*cnn_args(cnn_build, *args))
    verdicts = {fmt: verdict_of(text, fmt) for fmt, text in outputs.items()}
    assert len(set(verdicts.values())) == 1, verdicts
    if args == ("model.opt.onnx", "model.int8.onnx"):
        assert verdicts["text"].startswith("largest error growth at ")
        rows = json.loads(outputs["json"])["nodes"][:15]
        first_cells = re.findall(r'<tr><td class="name">(.*?)</td>', outputs["html"])
        assert [html.unescape(c.replace("<wbr>", "")) for c in first_cells] == [f"{r['node']} -> {r['qdq']}" if r["qdq"] else r["node"] for r in rows], \
            "the page lists the nodes the text lists, in its order"


def test_compare_exporters_shows_one_verdict_in_every_format(tmp_path):
    profile = write_profile(tmp_path, TINY_MLP_PROFILE)
    outputs = compare_outputs("--exporters", "--profile", str(profile))
    verdicts = {fmt: verdict_of(text, fmt) for fmt, text in outputs.items()}
    assert len(set(verdicts.values())) == 1 and verdicts["json"].startswith(("closer to torch", "both exports")), verdicts


def test_compare_defines_its_columns(cnn_build):
    """Issue 36: compare's "input err / output err / growth" columns were defined nowhere: a line of the output
    defines them (in every format), and docs/compare.md."""
    outputs = {fmt: run_cli("compare", *cnn_args(cnn_build, "model.opt.onnx", "model.int8.onnx"), "-f", fmt).stdout for fmt in ("text", "html")}
    text, page = outputs["text"].splitlines(), html.unescape(outputs["html"])
    (legend,) = [line for line in text if all(f"{column}:" in line for column in ("input err", "output err", "growth"))]
    assert text.index(legend) < next(i for i, line in enumerate(text) if line.startswith("node (-> the Q/DQ on its output)"))
    assert legend in page and legend in (REPO / "docs" / "compare.md").read_text().replace("\n", " ")


def test_compare_pages_fit_the_width_they_are_given(cnn_build):
    """Issue 36: the aligned page needed ~1,620 px (its max-abs column off screen at 1,400), and a fixed layout then cut
    2,193 cells of the bert page with an ellipsis ('9.54e…'): every table takes the page's width with columns sized to
    their content; nothing is cut (no ellipsis, no overflow rule), and names wrap between their parts (<wbr> after
    / _ .), never inside a word."""
    for args in (("model.opt.onnx", "model.int8.onnx"), ("model.opt.onnx", "model.int8.onnx", "--align"), ("--torch", "model.opt.onnx")):
        page = run_cli("compare", *cnn_args(cnn_build, *args), "-f", "html").stdout
        assert re.search(r"table \{[^}]*width: 100%", page) and "table-layout: fixed" not in page, args
        assert "text-overflow" not in page and "overflow: hidden" not in page and "…" not in page, args
        assert re.search(r"td\.name \{[^}]*white-space: normal", page), args
        names = [html.unescape(re.sub(r"<wbr>", "", c)) for c in re.findall(r'<td class="name">(.*?)</td>', page)]
        assert names and all("<" not in n for n in names), args
        assert any("<wbr>" in c for c in re.findall(r'<td class="name">(.*?)</td>', page)), args


def test_aligned_int8_rows_name_their_module(cnn_build):
    """Issue 36: B's module column was empty for every INT8 row: ModelOpt's model keeps node names, not modules, and its
    Q/DQ nodes have none. B's nodes now take the module A records for their name, and a Q/DQ node the module of the node
    it quantizes."""
    data = json.loads(run_cli("compare", *cnn_args(cnn_build, "model.opt.onnx", "model.int8.onnx", "--align"), "-f", "json").stdout)
    results = [r for r in data["rows"] if r["b"] and r["b"]["kind"] == "result"]
    qdq = [r["b"] for r in results if r["b"]["op"] in ("QuantizeLinear", "DequantizeLinear")]
    assert qdq and all(side["module"] for side in qdq), qdq
    paired = [r for r in results if r["a"] and r["a"]["node"] == r["b"]["node"]]
    assert paired and all(r["b"]["module"] == r["a"]["module"] for r in paired)
    assert {side["module"] for side in qdq if side["name"].startswith("stem.0.weight")} == {"stem.0"}


def test_compare_reads_the_profile_a_build_recorded(cnn_build):
    """Issue 36: compare on one's own build needed --profile though manifest.json names it, and --torch on the INT8
    model said "compare a file written by our export stage" though our int8 stage wrote it."""
    by_name = run_cli("compare", str(cnn_build / "model.opt.onnx"), str(cnn_build / "model.int8.onnx"))
    assert by_name.returncode == 0 and by_name.stdout.startswith("largest error growth at "), by_name.stderr
    torch = run_cli("compare", "--torch", str(cnn_build / "model.opt.onnx"))
    assert torch.returncode == 0 and "torch (tiny-cnn) vs" in torch.stdout, torch.stderr
    int8 = run_cli("compare", "--torch", str(cnn_build / "model.int8.onnx"))
    assert int8.returncode == 2 and "written by our export stage" not in int8.stderr
    assert "compare --torch takes any ONNX file of this model whose nodes keep them" in int8.stderr
