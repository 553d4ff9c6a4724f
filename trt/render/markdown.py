"""Markdown output: the verdict first, then the tables. Every model-supplied string is neutralized
(control characters as escapes) and escaped for Markdown table syntax."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trt.render.text import cell, nodes_preview, region_label
from trt.views import Diff, Report


def md_escape(value: Any) -> str:
    text = cell(value)
    for char in "\\|`*_[]<>":
        text = text.replace(char, "\\" + char)
    return text


def md_table(columns: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(md_escape(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _findings(findings: list[str]) -> str:
    return "## Findings\n\n" + "".join(f"- {md_escape(f)}\n" for f in findings) if findings else ""


def report_md(report: Report) -> str:
    s, source = report.summary, report.source
    parts = [
        f"# TensorRT fusion report: {md_escape(Path(source.layer_info).name)}\n",
        f"**{md_escape(report.verdict)}**\n",
        md_table(["", ""], [["format", source.format], ["onnx", source.onnx], ["layers", s.layers], ["regions", s.regions],
                            ["myelin kernels", s.myelin_layers], ["myelin graphs (per profile)", s.myelin_graphs], ["profiles", s.profiles],
                            ["onnx nodes referenced", s.metadata_onnx_nodes], ["resolved in onnx", s.resolved_onnx_nodes], ["total ms", s.total_time_ms]]),
        _findings(report.findings),
        f"## Modules (scope depth {report.module_depth})\n\n" + md_table(
            ["module", "onnx nodes", "layers", "myelin kernels", "time ms"],
            [[m.module, m.onnx_nodes, m.layers, m.myelin_kernels, m.time_ms] for m in report.modules]),
        "## Regions\n\n" + md_table(
            ["#", "region", "kind", "layers", "precision", "ms", "onnx nodes"],
            [[r.index, r.name, r.kind, len(r.layers), r.precision, r.time_ms, nodes_preview(r.onnx_nodes)] for r in report.regions]),
        "## Layers\n\n" + md_table(
            ["#", "layer", "type", "region", "precision", "ms", "onnx nodes"],
            [[i, l.name, l.type, l.region, l.precision, l.time_ms, nodes_preview(l.onnx_nodes)] for i, l in enumerate(report.layers)]),
    ]
    return "\n".join(p for p in parts if p)


def diff_md(diff: Diff) -> str:
    a, b = diff.a, diff.b
    parts = [
        f"# TensorRT engine diff (joined by {diff.join})\n\nA: `{md_escape(a.source.layer_info)}` ({a.summary.precision})  \n"
        f"B: `{md_escape(b.source.layer_info)}` ({b.summary.precision})\n",
        f"**{md_escape(diff.verdict)}**\n",
        md_table(["", "A", "B", "delta"], [[k.replace("_", " "), v.a, v.b, v.delta] for k, v in diff.totals.items()]),
        _findings(diff.findings),
    ]
    if diff.regions:
        parts.append("## Where A's compute regions run in B\n\n" + md_table(
            ["A region", "nodes", "status", "B regions", "precision"],
            [[r.a.name, r.nodes, r.status + (" (approximate)" if r.approximate else ""), "; ".join(p.region.name for p in r.b), r.precision_change]
             for r in diff.regions]))
    for splits, title in ((diff.splits, "Cut in B"), (diff.merges, "Cut in A")):
        if splits:
            parts.append(f"## {title}\n\n" + md_table(
                ["region", "nodes", "pieces", "Q/DQ at the cuts"],
                [[s.a_region.name, s.nodes, "; ".join(p.region.name for p in s.pieces), ", ".join(dict.fromkeys(c.quantize for c in s.cuts if c.quantize))]
                 for s in splits]))
    if diff.aligned:
        parts.append("## Compute regions aligned by order and kind (node names do not join)\n\n" + md_table(
            ["A region", "A prec", "B region", "B prec"],
            [[region_label(r.a), r.a and r.a.precision, region_label(r.b), r.b and r.b.precision] for r in diff.aligned]))
    parts.append("## Modules\n\n" + md_table(
        ["module", "layers A", "layers B", "delta", "ms A", "ms B"],
        [[m.module, m.layers_a, m.layers_b, m.layers_delta, m.time_a_ms, m.time_b_ms] for m in diff.modules]))
    return "\n".join(p for p in parts if p)
