"""Render a report or a diff as text (rich tables), Markdown, JSON or one self-contained HTML file.

Layer and node names come from untrusted models: Markdown escapes table syntax, HTML
autoescapes everything (jinja2), text output disables rich markup.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

FORMATS = ("text", "json", "md", "html")
MAX_NODES_SHOWN = 4


def render(data: dict[str, Any], fmt: str, kind: str, width: int = 160) -> str:
    """`kind` is "report" or "diff"."""
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    if fmt == "html":
        return _html(data, kind)
    if fmt == "md":
        return _report_md(data) if kind == "report" else _diff_md(data)
    return _text(data, kind, width)


# ---------------------------------------------------------------- text


def _text(data: dict[str, Any], kind: str, width: int) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, markup=False, highlight=False, emoji=False, color_system=None)
    for table in (_report_tables(data) if kind == "report" else _diff_tables(data)):
        console.print(table)
    return buffer.getvalue()


def _table(title: str, columns: list[str], rows: list[list[Any]], right: tuple[str, ...] = ()) -> Table:
    table = Table(title=title, title_justify="left", show_header=any(columns))
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left", overflow="fold")
    for row in rows:
        table.add_row(*[_cell(v) for v in row])
    return table


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _nodes_preview(nodes: list[str]) -> str:
    shown = ", ".join(nodes[:MAX_NODES_SHOWN])
    return f"{len(nodes)}: {shown}" + (", ..." if len(nodes) > MAX_NODES_SHOWN else "") if nodes else "0"


def _report_tables(report: dict[str, Any]) -> list[Any]:
    s, source, breakdown = report["summary"], report["source"], report["breakdown"]
    header = [
        ["layer info", f"{source['layer_info']} ({source['format']})"],
        ["onnx", source["onnx"] or "- (pass --onnx to resolve names and roll up modules)"],
        ["layers", s["layers"]],
        ["myelin kernels / graphs", f"{s['myelin_layers']} / {s['myelin_graphs']}" + "".join(f"  (graph {g}: {n} kernels)" for g, n in breakdown["myelin_kernels_per_graph"].items())],
        ["onnx nodes referenced", s["metadata_onnx_nodes"]],
        ["resolved in onnx", "-" if s["resolved_onnx_nodes"] is None else f"{s['resolved_onnx_nodes']} (unresolved: {len(s['unresolved_onnx_nodes'])})"],
        ["layer types", ", ".join(f"{k} {v}" for k, v in breakdown["layer_types"].items())],
        ["precisions", ", ".join(f"{k} {v}" for k, v in breakdown["precisions"].items())],
        ["timed layers / total ms", f"{s['timed_layers']} / {_cell(s['total_time_ms'])}"],
    ]
    if report["coverage"]:
        gaps = report["coverage"]["not_in_layers"]
        header.append(["onnx nodes in no layer", ", ".join(f"{k.replace('_', ' ')} {v['count']}" for k, v in gaps.items())])
    tables: list[Any] = [_table("Engine summary", ["", ""], header)]  # no header row
    if report["findings"]:
        tables.append(_table("Findings", ["#", "finding"], [[i, f] for i, f in enumerate(report["findings"], 1)]))
    modules = [[m["module"], m["onnx_nodes"], m["layers"], m["myelin_kernels"], m["time_ms"], _counts(m["precisions"])] for m in report["modules"]]
    tables.append(_table(f"Modules (scope depth {report['module_depth']})", ["module", "onnx nodes", "layers", "myelin kernels", "time ms", "precisions"], modules, ("onnx nodes", "layers", "myelin kernels", "time ms")))
    layers = [
        [i, layer["name"], layer["type"], layer["myelin_graph"], layer["precision"], layer["time_ms"], _nodes_preview(layer["onnx_nodes"]) + ("" if layer["mapping"] in (None, "metadata") else f" [{layer['mapping']}]")]
        for i, layer in enumerate(report["layers"])
    ]
    tables.append(_table("Layers", ["#", "layer", "type", "myelin graph", "precision", "ms", "onnx nodes"], layers, ("#", "ms")))
    return tables


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def _diff_tables(diff: dict[str, Any]) -> list[Any]:
    totals = diff["totals"]
    rows = [[key, v["a"], v["b"], v["delta"]] for key, v in totals.items() if key != "precisions"]
    rows.append(["precisions", _counts(totals["precisions"]["a"]), _counts(totals["precisions"]["b"]), ""])
    tables: list[Any] = [
        _table(f"Diff  A: {diff['a']['layer_info']}  B: {diff['b']['layer_info']}  (joined by {diff['join']})", ["", "A", "B", "delta"], rows, ("delta",)),
    ]
    if diff["findings"]:
        tables.append(_table("Findings", ["#", "finding"], [[i, f] for i, f in enumerate(diff["findings"], 1)]))
    if diff["splits"]:
        split_rows = [
            [s["a_layer"], s["nodes"], len(s["b_layers"]), "; ".join(f"{b['name']} ({len(b['nodes'])})" for b in s["b_layers"][:6]) + (" ..." if len(s["b_layers"]) > 6 else ""), ", ".join(s["qdq_at_cut"][:6]) or "-"]
            for s in diff["splits"]
        ]
        tables.append(_table("Fused in A, split in B", ["A layer", "nodes", "B layers", "B layers (nodes)", "Q/DQ at the cut"], split_rows, ("nodes", "B layers")))
    label = "Modules" if diff["join"] == "onnx-names" else "Modules (scope fallback: node names differ)"
    module_rows = [[m["module"], m["layers_a"], m["layers_b"], m["layers_delta"], m["time_a_ms"], m["time_b_ms"], m["time_delta_ms"]] for m in diff["modules"]]
    tables.append(_table(label, ["module", "layers A", "layers B", "delta", "ms A", "ms B", "delta ms"], module_rows, ("layers A", "layers B", "delta", "ms A", "ms B", "delta ms")))
    if diff["aligned_layers"]:
        aligned = [[r["a"], r["precision_a"], r["b"], r["precision_b"], r["time_a_ms"], r["time_b_ms"]] for r in diff["aligned_layers"]]
        tables.append(_table("Compute layers aligned by order and type (fallback)", ["A layer", "A prec", "B layer", "B prec", "ms A", "ms B"], aligned, ("ms A", "ms B")))
    qdq_b = diff["qdq_layers"]["b"]
    if qdq_b:
        tables.append(_table("Q/DQ layers in B", ["#", "layer"], [[i, n] for i, n in enumerate(qdq_b, 1)]))
    return tables


# ---------------------------------------------------------------- markdown


def _md_escape(value: Any) -> str:
    text = _cell(value)
    for char in "\\|`*_[]<>":
        text = text.replace(char, "\\" + char)
    return text.replace("\n", " ")


def _md_table(columns: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_md_escape(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _report_md(report: dict[str, Any]) -> str:
    s, source = report["summary"], report["source"]
    parts = [
        f"# TensorRT fusion report: {_md_escape(Path(source['layer_info']).name)}\n",
        _md_table(["", ""], [["format", source["format"]], ["onnx", source["onnx"]], ["layers", s["layers"]], ["myelin kernels", s["myelin_layers"]],
                             ["myelin graphs", s["myelin_graphs"]], ["onnx nodes referenced", s["metadata_onnx_nodes"]],
                             ["resolved in onnx", s["resolved_onnx_nodes"]], ["total ms", s["total_time_ms"]]]),
    ]
    if report["findings"]:
        parts.append("## Findings\n\n" + "".join(f"- {_md_escape(f)}\n" for f in report["findings"]))
    parts.append(f"## Modules (scope depth {report['module_depth']})\n\n" + _md_table(
        ["module", "onnx nodes", "layers", "myelin kernels", "time ms"],
        [[m["module"], m["onnx_nodes"], m["layers"], m["myelin_kernels"], m["time_ms"]] for m in report["modules"]]))
    parts.append("## Layers\n\n" + _md_table(
        ["#", "layer", "type", "myelin graph", "precision", "ms", "onnx nodes"],
        [[i, l["name"], l["type"], l["myelin_graph"], l["precision"], l["time_ms"], _nodes_preview(l["onnx_nodes"])] for i, l in enumerate(report["layers"])]))
    return "\n".join(parts)


def _diff_md(diff: dict[str, Any]) -> str:
    totals = diff["totals"]
    parts = [
        f"# TensorRT engine diff (joined by {diff['join']})\n\nA: `{_md_escape(diff['a']['layer_info'])}`  \nB: `{_md_escape(diff['b']['layer_info'])}`\n",
        _md_table(["", "A", "B", "delta"], [[k, v["a"], v["b"], v["delta"]] for k, v in totals.items() if k != "precisions"]),
    ]
    if diff["findings"]:
        parts.append("## Findings\n\n" + "".join(f"- {_md_escape(f)}\n" for f in diff["findings"]))
    if diff["splits"]:
        parts.append("## Fused in A, split in B\n\n" + _md_table(
            ["A layer", "nodes", "B layers", "Q/DQ at the cut"],
            [[s["a_layer"], s["nodes"], len(s["b_layers"]), ", ".join(s["qdq_at_cut"][:8])] for s in diff["splits"]]))
    parts.append("## Modules\n\n" + _md_table(
        ["module", "layers A", "layers B", "delta", "ms A", "ms B"],
        [[m["module"], m["layers_a"], m["layers_b"], m["layers_delta"], m["time_a_ms"], m["time_b_ms"]] for m in diff["modules"]]))
    if diff["aligned_layers"]:
        parts.append("## Compute layers aligned by order and type (fallback)\n\n" + _md_table(
            ["A layer", "A prec", "B layer", "B prec"], [[r["a"], r["precision_a"], r["b"], r["precision_b"]] for r in diff["aligned_layers"]]))
    return "\n".join(parts)


# ---------------------------------------------------------------- html


def _html(data: dict[str, Any], kind: str) -> str:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"), autoescape=select_autoescape(default=True))
    env.filters["cell"] = _cell
    env.filters["nodes"] = _nodes_preview
    if kind == "report":
        peak = max([m["myelin_kernels"] for m in data["modules"]] + [m["layers"] for m in data["modules"]] + [1])
        peak_ms = max([m["time_ms"] or 0 for m in data["modules"]] + [0])
        return env.get_template("report.html.j2").render(report=data, peak=peak, peak_ms=peak_ms or 1.0)
    return env.get_template("diff.html.j2").render(diff=data)
