"""Rendering: every real file as a self-contained HTML page (verdict, then the fusion map, then the tables),
names from untrusted models escaped, the fusion map's runs matching the regions."""

import re

import pytest
from conftest import TRT_DATA, mnist_with_a_layer_named, run_cli

from trt.diff import diff_from_files
from trt.render import render
from trt.report import report_from_files

LAYER_FILES = sorted(p.name for p in TRT_DATA.iterdir() if p.suffix in (".json", ".log") and not p.name.endswith(".profile.json"))
EXTERNAL = re.compile(r"""(?:src|href)\s*=|url\(|@import|https?://""", re.IGNORECASE)


def self_contained(page: str) -> bool:
    return page.startswith("<!doctype html>") and page.rstrip().endswith("</html>") and not EXTERNAL.search(page)


@pytest.mark.parametrize("name", LAYER_FILES)
def test_every_real_file_renders_a_self_contained_page(trt_fixtures, name):
    report = report_from_files(trt_fixtures / name)
    page = render(report, "html")
    assert self_contained(page)
    assert page.index('class="verdict"') < page.index("<svg") < page.index("<table")
    regions = list(report.fusion_map["region"])
    for i in range(1, len(regions) - 1):  # a node the engine does not name, inside one region, is drawn in it
        if regions[i] is None:
            after = next((r for r in regions[i:] if r is not None), None)
            regions[i] = after if after is not None and after == regions[i - 1] else None
    runs = 1 + sum(1 for a, b in zip(regions, regions[1:]) if a != b) if regions else 0
    assert page.count("<rect") == 2 * runs, "one rectangle (and its precision band) per run of nodes in one region"
    diff = render(diff_from_files(trt_fixtures / name, trt_fixtures / name), "html")
    assert self_contained(diff) and diff.count("<svg") == 2


def test_html_and_markdown_escape_model_supplied_names(tmp_path, trt_fixtures):
    evil = '<script>alert("x")</script>'
    path = mnist_with_a_layer_named(tmp_path, evil)
    for fmt, escaped in (("html", "&lt;script&gt;"), ("md", "\\<script\\>")):
        result = run_cli("report", str(path), "-f", fmt)
        assert result.returncode == 0 and escaped in result.stdout and "<script>alert" not in result.stdout


def test_fusion_map_marks_standalone_q_dq_layers(trt_fixtures):
    report = report_from_files(trt_fixtures / "trt852_namesonly_yolo_qdq_int8.layers.json")
    standalone = {n for r in report.regions if r.qdq for n in r.onnx_nodes}
    assert standalone and {name for _, name in report.fusion_map["qdq"]} == standalone
    page = render(report, "html")
    assert page.count('fill="#c00"') == len(report.fusion_map["qdq"])


def test_the_fusion_maps_counts_add_up_to_the_pages_totals(trt_fixtures):
    """The new user read "52 regions along 93 ONNX nodes" above a summary of 86 regions and 148 ONNX nodes (YOLO), and a diff's
    map of 2 and 3 regions above totals of 4 and 7 (Swin): each count now says what it counts, and they add up."""
    yolo = report_from_files(trt_fixtures / "trt852_namesonly_yolo_qdq_int8.layers.json")
    label = re.search(r'<div class="label">(.*?)</div>', render(yolo, "html")).group(1)
    found = re.fullmatch(r"engine: (\d+) ONNX nodes the layers name besides (\d+) Q/DQ nodes, in (\d+) of its (\d+) regions \(the others: (.*)\); "
                         r"\d+ changes of region; (\d+) markers", label)
    nodes, qdq, drawn, regions, others, markers = found.groups()
    assert int(nodes) + int(qdq) == yolo.summary.metadata_onnx_nodes == 148 and int(regions) == yolo.summary.regions == 86
    assert int(drawn) + sum(int(n) for n in re.findall(r"(\d+) ", others)) == 86 and int(markers) == len(yolo.fusion_map["qdq"])
    swin = diff_from_files(trt_fixtures / "trt82_swin_tiny_fp16_T4_builder_layers.log", trt_fixtures / "trt82_swin_tiny_int8_T4_builder_layers.log")
    labels = re.findall(r'<div class="label">(.*?)</div>', render(swin, "html"))
    totals = [int(re.search(r" of its (\d+) regions", text).group(1)) for text in labels]
    assert totals == [swin.totals["regions"].a, swin.totals["regions"].b] == [4, 7]


@pytest.mark.parametrize("name", ["trt852_namesonly_yolo_qdq_int8.layers.json", "trt82_swin_tiny_int8_T4_builder_layers.log"])
def test_names_wrap_between_their_parts_and_markers_are_drawn_whole(trt_fixtures, name):
    """"(app / roximate)", "Laye / r* 4178": names broke anywhere (word-break: break-all); they wrap at spaces and after
    / _ . now. The first Q/DQ marker was cut in half at the map's left edge."""
    report = report_from_files(trt_fixtures / name)
    for page in (render(report, "html"), render(diff_from_files(trt_fixtures / name, trt_fixtures / name), "html")):
        assert "break-all" not in page and "overflow-wrap: anywhere" not in page
        for svg in re.findall(r"<svg .*?</svg>", page, re.DOTALL):
            width = float(re.search(r'<svg width="([\d.]+)"', svg).group(1))
            xs = [float(x) for path in re.findall(r'<path d="([^"]+)"', svg) for x in re.findall(r"[ML]([-\d.]+),", path)]
            assert all(0 <= x <= width for x in xs), "every marker inside the map"
    page = render(report, "html")
    layer = next(layer.name for layer in report.layers if "_" in layer.name and not set("<>&'\"") & set(layer.name))
    wrapped = re.sub(r"([/_.])", r"\1<wbr>", layer)
    assert f'<td class="name">{wrapped}</td>' in page
