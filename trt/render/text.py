"""Text output: the verdict first, wrapping tables for the short summaries, compact fixed-width tables for the
long lists (the first MAX_ROWS rows unless `all_rows`): a 40,000-layer engine prints as fast as its summary."""

from __future__ import annotations

import io
from typing import Any

from rich.box import Box
from rich.console import Console
from rich.table import Table

from pipeline.core.text import printable
from trt.plan import Region
from trt.views import Diff, Report

# the short tables wrap their cells (rich) but look like the long ones: a dashed rule under the header, no box
DASHED = Box("    \n    \n -  \n    \n    \n    \n    \n    \n", ascii=True)
MAX_ROWS = 200
NODES_SHOWN = 4
NAME_WIDTH = 70


def cell(value: Any) -> str:
    """A value for a table: names and text from the files on one line, every control character escaped."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return printable(str(value), one_line=True)


def nodes_preview(nodes: list[str]) -> str:
    if not nodes:
        return "0"
    return f"{len(nodes)}: {', '.join(nodes[:NODES_SHOWN])}" + (", ..." if len(nodes) > NODES_SHOWN else "")


def counts(values: dict[str, int], limit: int = 8) -> str:
    items = list(values.items())
    return ", ".join(f"{k} {v}" for k, v in items[:limit]) + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def text(view: Report | Diff, width: int, all_rows: bool) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, markup=False, highlight=False, emoji=False, color_system=None)
    out.write(printable(view.verdict, one_line=True) + "\n\n")
    for number, section in enumerate(_report(view, all_rows) if isinstance(view, Report) else _diff(view, all_rows)):
        out.write("\n" if number else "")
        if isinstance(section, str):
            out.write(section)
        else:
            console.print(section)
    return out.getvalue()


def rich_table(title: str, columns: list[str], rows: list[list[Any]], right: tuple[str, ...] = ()) -> Table:
    table = Table(title=printable(title, one_line=True), title_justify="left", show_header=any(columns), box=DASHED, show_edge=False,
                  pad_edge=False, padding=(0, 1, 0, 0))
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left", overflow="fold")
    for row in rows:
        table.add_row(*[cell(v) for v in row])
    return table


def compact_table(title: str, columns: list[str], rows: list[list[Any]], total: int, all_rows: bool, right: tuple[str, ...] = (), what: str = "rows") -> str:
    """A fixed-width table; long cells end in '…'; past MAX_ROWS rows (unless all_rows) a line says how many are left."""
    shown = rows if all_rows else rows[:MAX_ROWS]
    cells = [[cell(v) for v in row] for row in shown]
    widths = [min(max([len(column)] + [len(row[i]) for row in cells]), NAME_WIDTH) for i, column in enumerate(columns)]

    def line(values: list[str]) -> str:
        parts = []
        for value, size, column in zip(values, widths, columns):
            value = value if len(value) <= size else value[: size - 1] + "…"
            parts.append(value.rjust(size) if column in right else value.ljust(size))
        return "  ".join(parts).rstrip()

    lines = [printable(title, one_line=True), line(columns), "  ".join("-" * size for size in widths), *(line(row) for row in cells)]
    if total > len(shown):
        lines.append(f"... {total - len(shown)} more {what} (the first {len(shown)} of {total} shown; --all lists every one)")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- report


def _report(report: Report, all_rows: bool) -> list[Any]:
    s, source, breakdown = report.summary, report.source, report.breakdown
    graphs = breakdown.myelin_kernels_per_graph
    header = [
        ["layer info", f"{source.layer_info} ({source.format})"],
        ["onnx", source.onnx or "- (pass --onnx to resolve names and roll up modules)"],
        ["layers / regions", f"{s.layers} / {s.regions}"],
        ["myelin kernels / graphs", f"{s.myelin_layers} / {s.myelin_graphs}" + (f" per profile ({s.profiles} profiles)" if s.profiles > 1 else "")
         + "".join(f"  (graph {g}: {n} kernels)" for g, n in list(graphs.items())[:8]) + ("  ..." if len(graphs) > 8 else "")],
        ["onnx nodes referenced", s.metadata_onnx_nodes],
        ["resolved in onnx", "-" if s.resolved_onnx_nodes is None else f"{s.resolved_onnx_nodes} (unresolved: {len(s.unresolved_onnx_nodes)})"],
        ["layer types", counts(breakdown.layer_types)],
        ["precisions", counts(breakdown.precisions)],
        ["timed layers / total ms", f"{s.timed_layers} / {cell(s.total_time_ms)}"],
    ]
    if source.builds:
        header.insert(1, ["layer listing", f"{source.build} of {len(source.builds)} in this log (--build N picks another)"])
    if report.coverage:
        gaps = report.coverage.not_in_layers
        header.append(["onnx nodes in no layer", ", ".join(f"{k.replace('_', ' ')} {len(v)}" for k, v in gaps.items())])
    sections: list[Any] = [rich_table("Engine summary", ["", ""], header)]
    if report.findings:
        sections.append(rich_table("Findings", ["#", "finding"], [[i, f] for i, f in enumerate(report.findings, 1)]))
    regions = [[r.index, r.name, r.kind + ("" if r.compute else " (copy)"), len(r.layers), r.precision, r.time_ms, nodes_preview(r.onnx_nodes)]
               for r in (report.regions if all_rows else report.regions[:MAX_ROWS])]
    sections.append(compact_table("Regions (a Myelin graph or a standalone layer)", ["#", "region", "kind", "layers", "precision", "ms", "onnx nodes"], regions,
                                  len(report.regions), all_rows, ("#", "layers", "ms"), "regions"))
    modules = report.modules
    shown = modules if all_rows else modules[:MAX_ROWS]
    sections.append(rich_table(f"Modules (scope depth {report.module_depth})" + ("" if len(shown) == len(modules) else f", the first {len(shown)} of {len(modules)}"),
                               ["module", "onnx nodes", "layers", "myelin kernels", "time ms", "precisions"],
                               [[m.module, m.onnx_nodes, m.layers, m.myelin_kernels, m.time_ms, counts(m.precisions)] for m in shown],
                               ("onnx nodes", "layers", "myelin kernels", "time ms")))
    layers = [[i, layer.name, layer.type, layer.region, layer.precision, layer.time_ms,
               nodes_preview(layer.onnx_nodes) + ("" if layer.mapping in (None, "metadata") else f" [{layer.mapping}]")]
              for i, layer in enumerate(report.layers if all_rows else report.layers[:MAX_ROWS])]
    sections.append(compact_table("Layers", ["#", "layer", "type", "region", "precision", "ms", "onnx nodes"], layers, len(report.layers), all_rows,
                                  ("#", "region", "ms"), "layers"))
    return sections


# ---------------------------------------------------------------- diff


def region_label(region: Region | None) -> str:
    if region is None:
        return "-"
    return f"{region.name} ({region.type}, {len(region.layers)} layer{'s' if len(region.layers) != 1 else ''})" if region.kind == "myelin" else region.name


def _diff(diff: Diff, all_rows: bool) -> list[Any]:
    rows = [[key.replace("_", " "), v.a, v.b, v.delta] for key, v in diff.totals.items()]
    rows.append(["precisions", counts(diff.a.breakdown.precisions), counts(diff.b.breakdown.precisions), ""])
    sides = "\n".join(f"{side}: {printable(report.source.layer_info, one_line=True)} ({report.summary.precision})" for side, report in (("A", diff.a), ("B", diff.b)))
    sections: list[Any] = [f"{sides}\njoined by {diff.join}\n", rich_table("Totals", ["", "A", "B", "delta"], rows, ("delta",))]
    if diff.findings:
        sections.append(rich_table("Findings", ["#", "finding"], [[i, f] for i, f in enumerate(diff.findings, 1)]))
    for splits, title in ((diff.splits, "Cut in B: regions of A that B runs as several pieces"), (diff.merges, "Cut in A: regions of B that A runs as several pieces")):
        rows = []
        for split in splits:
            for i, piece in enumerate(split.pieces):
                first = i == 0
                rows.append([split.a_region.name + (" ~" if split.approximate else "") if first else "", split.nodes if first else "",
                             piece.region.name, piece.region.type, piece.region.precision, len(piece.nodes)])
            pairs = list(dict.fromkeys(f"{c.quantize} -> {c.dequantize}" if c.dequantize else c.quantize for c in split.cuts if c.quantize))
            if pairs:
                rows.append(["", "", f"Q/DQ at the cuts ({split.qdq_source}): " + ", ".join(pairs[:6]) + (" ..." if len(pairs) > 6 else ""), "", "", ""])
        if rows:
            sections.append(compact_table(title + " (~ approximate)", ["region", "nodes", "piece", "type", "precision", "shared nodes"], rows, len(rows), all_rows,
                                          ("nodes", "shared nodes"), "rows"))
    if diff.regions:
        rows = [[r.a.name, r.nodes, r.status + (" ~" if r.approximate else ""), r.b[0].region.name + (f" (+{len(r.b) - 1} more)" if len(r.b) > 1 else "") if r.b else "-",
                 r.precision_change or ""] for r in diff.regions]
        sections.append(compact_table("Where A's compute regions run in B (~ approximate)", ["A region", "nodes", "status", "B region", "precision"], rows,
                                      len(rows), all_rows, ("nodes",), "regions"))
    if diff.aligned:
        rows = [[region_label(r.a), r.a and r.a.precision, region_label(r.b), r.b and r.b.precision, r.precision_change or ""] for r in diff.aligned]
        sections.append(compact_table("Compute regions aligned by order and kind (node names do not join)", ["A region", "A prec", "B region", "B prec", "change"], rows,
                                      len(rows), all_rows, (), "regions"))
    modules = diff.modules if all_rows else diff.modules[:MAX_ROWS]
    sections.append(rich_table("Modules", ["module", "layers A", "layers B", "delta", "ms A", "ms B", "delta ms"],
                               [[m.module, m.layers_a, m.layers_b, m.layers_delta, m.time_a_ms, m.time_b_ms, m.time_delta_ms] for m in modules],
                               ("layers A", "layers B", "delta", "ms A", "ms B", "delta ms")))
    return sections
