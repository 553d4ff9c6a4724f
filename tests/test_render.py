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
