"""`compare`'s results for a reader: `render(result, fmt)` writes any of them (by name: compare.py
`NodeComparison`; aligned: compare.py `Alignment`; against torch and of the two exporters:
divergence.py) as text, JSON or one HTML page. Every format opens with the result's `verdict` and
shows the same rows: the formats differ in layout, never in conclusion. The aligned HTML puts the two
executions side by side, aligned rows joined, the first divergence highlighted and shown first with
the rows around it (the verdict links to its place among every row), runs of equal rows folded
(click to unfold). Every model-supplied string in the HTML goes through jinja2's autoescape."""

from __future__ import annotations

from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.text import html_breakable
from pipeline.diagnose.compare import AlignedRow, Alignment, NodeComparison
from pipeline.diagnose.divergence import ExportersComparison, TorchComparison, some

FORMATS = ("text", "json", "html")
NODE_COLUMNS = ("node (-> the Q/DQ on its output)", "module", "op", "input err", "output err", "growth")
NODE_NUMBERS = (3, 4, 5)  # the columns that hold numbers, right-aligned
NODE_NAMES = (0, 1)  # the columns that hold names, wrapped between their parts in the HTML
NODE_LEGEND = ("error: max |B-A| / max |A| over the samples; input err: the largest error among the node's inputs; output err: the "
               "error of its output (in B after the Q/DQ pair on it, if any); growth: output err - input err, what this node adds (largest first); "
               "ids N%: the share of an integer input's elements (indices, a top-k pick) that differ in B")
TORCH_COLUMNS = ("module", "class", "max abs", "relative", "tensor / note")
TORCH_NUMBERS = (2, 3)
TORCH_NAMES = (0, 4)


def render(result: NodeComparison | Alignment | TorchComparison | ExportersComparison, fmt: str, everything: bool = False, top: int = 15) -> str:
    """`result` in `fmt` (text, json or html). Text and HTML list the `top` nodes of a comparison by name,
    and the rows where an alignment parts (with one row around each) unless `everything`."""
    if fmt == "json":
        return _json(result.to_json())
    if fmt == "html":
        return _html(result, top)
    if isinstance(result, NodeComparison):
        return "\n".join([result.verdict, _node_header(result), NODE_LEGEND, _text_table(NODE_COLUMNS, _node_rows(result, top), NODE_NUMBERS)]) + "\n"
    if isinstance(result, TorchComparison):
        return "\n".join([result.verdict, _torch_header(result), _text_table(TORCH_COLUMNS, _torch_rows(result), TORCH_NUMBERS)]) + "\n"
    if isinstance(result, ExportersComparison):
        return "\n".join([result.verdict, *_export_checks(result)]) + "\n" + alignment_text(result.alignment, everything)
    return alignment_text(result, everything)


def _json(value: dict[str, Any]) -> str:
    """JSON; an infinite or NaN difference is written as the string "inf" / "nan"."""
    import json

    def safe(value: Any) -> Any:
        if isinstance(value, float) and not np.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {k: safe(v) for k, v in value.items()}
        if isinstance(value, list):
            return [safe(v) for v in value]
        return value

    return json.dumps(safe(value), indent=2) + "\n"


def _text_table(columns: tuple[str, ...], rows: list[list[str]], numbers: tuple[int, ...]) -> str:
    """Columns padded to their widest cell; the `numbers` columns right-aligned."""
    widths = [max(len(row[k]) for row in [list(columns), *rows]) for k in range(len(columns))]

    def line(row) -> str:
        return "  ".join(cell.rjust(w) if k in numbers else cell.ljust(w) for k, (cell, w) in enumerate(zip(row, widths))).rstrip()

    return "\n".join(line(row) for row in [columns, *rows])


# ---------------------------------------------------------------- by name, against torch, two exporters


def _node_header(result: NodeComparison) -> str:
    return (f"A {result.reference} vs B {result.candidate}: {result.compared_tensors} tensors compared on {result.feeds} "
            f"sample{'s' if result.feeds != 1 else ''}")


def _node_rows(result: NodeComparison, top: int) -> list[list[str]]:
    return [[f"{n.node} -> {n.qdq}" if n.qdq else n.node, n.module or "-", n.op_type,
             f"{n.input_error:.3g}" + (f" ids {n.index_change:.0%}" if n.index_change else ""), f"{n.error:.3g}", f"{n.growth:.3g}"]
            for n in result.nodes[:top]]


def _torch_header(result: TorchComparison) -> str:
    return (f"torch ({result.profile}) vs {result.onnx}: {result.mapped} of {result.modules} modules mapped to an ONNX tensor; "
            f"tolerance {result.tolerance:g} (max |onnx - torch|)")


def _torch_rows(result: TorchComparison) -> list[list[str]]:
    """One row per torch module, the unmapped submodules of a mapped module (e.g. one exported as an ONNX function) as one row."""
    rows = []
    for r in _fold_submodules(result.rows):
        if isinstance(r, list):
            notes = "; ".join(dict.fromkeys(child.note for child in r[1:]))
            rows.append([r[0] + ".*", f"{len(r) - 1} modules", "-", "-", f"not mapped: {notes}"])
        elif r.tensor is None:
            rows.append([r.module, r.kind, "-", "-", f"not mapped: {r.note}"])
        else:
            over = " <- over tolerance" if not r.max_abs_diff <= result.tolerance else ""
            relative = f"{r.relative:.2e}" if r.relative is not None else "-"
            rows.append([r.module, r.kind, f"{r.max_abs_diff:.2e}", relative, r.tensor + (f" ({r.note})" if r.note else "") + over])
    return rows


def _fold_submodules(rows: list) -> list:
    """Rows, with the unmapped submodules of each mapped module as one entry [that module, its unmapped
    submodules' rows...], where the first of them was."""
    mapped = {r.module for r in rows if r.tensor is not None}
    folded: list = []
    groups: dict[str, list] = {}
    for r in rows:
        parts = r.module.split(".")
        owner = next((".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1) if ".".join(parts[:i]) in mapped), None) if r.tensor is None else None
        if owner is None:
            folded.append(r)
        elif owner in groups:
            groups[owner].append(r)
        else:
            groups[owner] = [owner, r]
            folded.append(groups[owner])
    return folded


def _export_checks(result: ExportersComparison) -> list[str]:
    """One line per exporter: its export against torch."""
    lines = []
    for exporter, side in result.torch.items():
        first, worst = side.first_diverging, side.worst_module
        lines.append(f"torch vs {exporter} ({side.nodes} nodes): outputs max_abs_diff {side.outputs_max_abs_diff:.3g}; "
                     f"{side.mapped} of {side.modules} modules mapped"
                     + (f" ({len(side.fused)} folded by the exporter into the one before, compared at the pair's node: {some(side.fused)})" if side.fused else "") + ", "
                     + (f"first over the tolerance {side.tolerance:g}: {first.module} ({first.kind}, {first.max_abs_diff:.3g})" if first
                        else f"none over the tolerance {side.tolerance:g}")
                     + (f"; largest: {worst.module} {worst.max_abs_diff:.3g}" if worst else ""))
    return lines


# ---------------------------------------------------------------- aligned


def _source(result: Alignment) -> str:
    return (f"A {result.a} vs B {result.b}: aligned by {result.aligned_by} ({result.shared_names} of {result.a_results} result names shared); "
            f"one sample; equal: max |B-A| / max |A| <= {result.tolerance:g} ({result.precision})")


def shown_rows(rows: list[AlignedRow], everything: bool, context: int = 1) -> list[AlignedRow | int]:
    """The rows to print: all, or those where the graphs part (a different value, a different op,
    a result of one side only) with `context` rows around each; a folded run is its length."""
    if everything:
        return list(rows)
    notable = [r.mark != "=" or r.a.op != r.b.op for r in rows]
    keep = [any(notable[max(0, k - context): k + context + 1]) for k in range(len(rows))]
    shown: list[AlignedRow | int] = []
    for row, kept in zip(rows, keep):
        if kept:
            shown.append(row)
        elif shown and isinstance(shown[-1], int):
            shown[-1] += 1
        else:
            shown.append(1)
    return shown


def alignment_text(result: Alignment, everything: bool = False) -> str:
    def cells(side) -> list[str]:
        if side is None:
            return ["", "", "", ""]
        return [side.op or side.kind, "x".join(map(str, side.shape)) or "scalar", side.fingerprint, side.name]

    shown = shown_rows(result.rows, everything)
    table = [(r.row, r.mark, *cells(r.a), *cells(r.b), f"{r.max_abs_diff:.3g}" if r.max_abs_diff is not None else "")
             for r in shown if not isinstance(r, int)]
    header = ("row", "", "A op", "shape", "values", "name", "B op", "shape", "values", "name", "max abs")
    widths = [max(len(str(row[k])) for row in [header, *table]) for k in range(len(header))]

    def line(row: tuple) -> str:
        left = "  ".join(f"{row[k]!s:<{widths[k]}}" for k in range(2, 6))
        right = "  ".join(f"{row[k]!s:<{widths[k]}}" for k in range(6, 10))
        return f"{row[0]!s:>{widths[0]}} {row[1]!s:1}  {left} | {right}  {row[10]!s:>{widths[10]}}".rstrip()

    lines = [result.verdict, f"{_source(result)}; traces kept {result.trace_mib['a']:g} + {result.trace_mib['b']:g} MiB"]
    lines += [f"inputs: {note}" for note in result.inputs]
    for side in ("a", "b"):
        missing = result.not_exposed[side]
        if missing:
            lines.append(f"{side.upper()}: {len(missing)} results have no type onnxruntime can return and are not listed (first: {missing[0]!r})")
    lines.append(line(header))
    rows = iter(table)
    for item in shown:
        lines.append(f"{'':>{widths[0]}}    ... {item} equal row{'s' if item != 1 else ''}" if isinstance(item, int) else line(next(rows)))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- html

FOLD = 3  # a run of more plain equal rows than this is folded
CONTEXT = 6  # rows shown either side of the first divergence at the top of the page


def _plain(row: AlignedRow) -> bool:
    return row.mark == "=" and row.a.op == row.b.op


def _blocks(rows: list[AlignedRow]) -> list[dict[str, Any]]:
    """Consecutive rows grouped: runs of more than FOLD plain equal rows (same op on both sides) folded."""
    blocks: list[dict[str, Any]] = []
    for plain, group in groupby(rows, _plain):
        group = list(group)
        if plain or not blocks or blocks[-1]["folded"]:  # a short plain run starts an unfolded block; other rows join the one before
            blocks.append({"folded": plain and len(group) > FOLD, "rows": group})
        else:
            blocks[-1]["rows"] += group
    return blocks


def _html(result: NodeComparison | Alignment | TorchComparison | ExportersComparison, top: int) -> str:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"), autoescape=select_autoescape(default=True))
    env.filters["breakable"] = html_breakable
    page = {"verdict": result.verdict, "checks": [], "r": None, "warn": isinstance(result, TorchComparison) and result.first_diverging is not None}
    if isinstance(result, NodeComparison):
        page |= {"title": "Where the error grows", "source": _node_header(result), "notes": [NODE_LEGEND], "columns": NODE_COLUMNS,
                 "numbers": NODE_NUMBERS, "names": NODE_NAMES, "rows": _node_rows(result, top)}
    elif isinstance(result, TorchComparison):
        page |= {"title": "The export against torch, module by module", "source": _torch_header(result), "notes": [], "columns": TORCH_COLUMNS,
                 "numbers": TORCH_NUMBERS, "names": TORCH_NAMES, "rows": _torch_rows(result)}
    else:
        aligned = result.alignment if isinstance(result, ExportersComparison) else result
        first = aligned.first_divergence.row if aligned.first_divergence else None
        around = aligned.rows[max(0, first - 1 - CONTEXT): first + CONTEXT] if first else []
        warn = not result.agrees if isinstance(result, ExportersComparison) else first is not None
        page |= {"title": "Two executions aligned", "source": _source(aligned), "notes": aligned.inputs, "r": aligned, "blocks": _blocks(aligned.rows), "warn": warn,
                 "around": around, "row_class": lambda row: _row_class(row, first),
                 "checks": _export_checks(result) + [aligned.verdict] if isinstance(result, ExportersComparison) else []}
    return env.get_template("compare.html.j2").render(**page)


def _row_class(row: AlignedRow, first: int | None) -> str:
    if row.row == first:
        return "first"
    if row.mark == "=" and not _plain(row):
        return "opdiff"
    return {"=": "eq", "~": "diff", "-": "onlya", "+": "onlyb"}[row.mark]
