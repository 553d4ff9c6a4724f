"""`compare`'s results for a reader. The aligned comparison (compare.py `align_models`): the verdict
line, a text table of the rows where the graphs part, JSON, and HTML: the two executions side by
side, aligned rows joined, the first divergence highlighted and shown first with the rows around it
(the verdict links to its place among every row), runs of equal rows folded (click to unfold); every
model-supplied string in the HTML goes through jinja2's autoescape. The comparison by tensor name
(compare.py `compare_models`), against torch module by module (divergence.py) and of the two
exporters: text tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def verdict_line(result: dict[str, Any]) -> str:
    counts = result["counts"]
    tally = (f"{len(result['rows'])} rows: {counts['equal']} equal, {counts['different']} different, "
             f"{counts['only_a']} only in A, {counts['only_b']} only in B")
    first = result["first_divergence"]
    if first is None:
        return f"no divergence: every paired float result is equal within {result['tolerance']:g}; {tally}"
    a, b = first["a"], first["b"]
    cosine = f"{first['cosine']:.6f}" if first["cosine"] is not None else "-"
    return (f"first divergence at row {first['row']}: A {a['op'] or a['kind']} {a['name']!r} (module {a['module'] or '-'}) vs "
            f"B {b['op'] or b['kind']} {b['name']!r} (module {b['module'] or '-'}): max_abs_diff {first['max_abs_diff']:.3g}, "
            f"cosine {cosine}; {tally}")


def shown_rows(rows: list[dict[str, Any]], everything: bool, context: int = 1) -> list[dict[str, Any] | int]:
    """The rows to print: all, or those where the graphs part (a different value, a different op,
    a result of one side only) with `context` rows around each; a folded run is its length."""
    if everything:
        return list(rows)
    notable = [r["mark"] != "=" or r["a"]["op"] != r["b"]["op"] for r in rows]
    keep = [any(notable[max(0, k - context): k + context + 1]) for k in range(len(rows))]
    shown: list[dict[str, Any] | int] = []
    for row, kept in zip(rows, keep):
        if kept:
            shown.append(row)
        elif shown and isinstance(shown[-1], int):
            shown[-1] += 1
        else:
            shown.append(1)
    return shown


def alignment_text(result: dict[str, Any], everything: bool = False) -> str:
    def cells(side: dict | None) -> list[str]:
        if side is None:
            return ["", "", "", ""]
        return [side["op"] or side["kind"], "x".join(map(str, side["shape"])) or "scalar", side["fingerprint"], side["name"]]

    shown = shown_rows(result["rows"], everything)
    table = [(r["row"], r["mark"], *cells(r["a"]), *cells(r["b"]), f"{r['max_abs_diff']:.3g}" if r["max_abs_diff"] is not None else "")
             for r in shown if not isinstance(r, int)]
    header = ("row", "", "A op", "shape", "values", "name", "B op", "shape", "values", "name", "max abs")
    widths = [max(len(str(row[k])) for row in [header, *table]) for k in range(len(header))]

    def line(row: tuple) -> str:
        left = "  ".join(f"{row[k]!s:<{widths[k]}}" for k in range(2, 6))
        right = "  ".join(f"{row[k]!s:<{widths[k]}}" for k in range(6, 10))
        return f"{row[0]!s:>{widths[0]}} {row[1]!s:1}  {left} | {right}  {row[10]!s:>{widths[10]}}".rstrip()

    lines = [verdict_line(result),
             f"A {result['a']} vs B {result['b']}: aligned by {result['aligned_by']} ({result['shared_names']} of {result['a_results']} "
             f"result names shared); one sample; equal: max |B-A| / max |A| <= {result['tolerance']:g} ({result['precision']}); "
             f"traces kept {result['trace_mib']['a']:g} + {result['trace_mib']['b']:g} MiB"]
    lines += [f"inputs: {note}" for note in result["inputs"]]
    for side in ("a", "b"):
        missing = result["not_exposed"][side]
        if missing:
            lines.append(f"{side.upper()}: {len(missing)} results have no type onnxruntime can return and are not listed (first: {missing[0]!r})")
    lines.append(line(header))
    rows = iter(table)
    for item in shown:
        lines.append(f"{'':>{widths[0]}}    ... {item} equal row{'s' if item != 1 else ''}" if isinstance(item, int) else line(next(rows)))
    return "\n".join(lines) + "\n"


def alignment_json(result: dict[str, Any]) -> str:
    """The result as JSON; an infinite or NaN difference is written as the string "inf" / "nan"."""
    import json

    def safe(value: Any) -> Any:
        if isinstance(value, float) and not np.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {k: safe(v) for k, v in value.items()}
        if isinstance(value, list):
            return [safe(v) for v in value]
        return value

    return json.dumps(safe(result), indent=2) + "\n"


# ---------------------------------------------------------------- by name, against torch, two exporters


def node_errors_text(result: dict[str, Any], top: int) -> str:
    """compare_models' result: the output errors, then the `top` nodes where the error grows most."""
    rows = result["nodes"][:top]
    wheres = [f"{row['node']} -> {row['qdq']}" if row["qdq"] else row["node"] for row in rows]
    width = max([len("node (-> the Q/DQ on its output)"), *map(len, wheres)])
    module_width = max([len("module"), *(len(row["module"]) for row in rows)])
    lines = [f"A {result['reference']} vs B {result['candidate']}: {result['compared_tensors']} tensors compared on {result['feeds']} "
             f"sample{'s' if result['feeds'] != 1 else ''}",
             "output error (max |B-A| / max |A|): " + ", ".join(f"{k} {v:.3g}" if v is not None else f"{k} -" for k, v in result["outputs"].items()),
             f"{'node (-> the Q/DQ on its output)':<{width}}  {'module':<{module_width}}  {'op':<20} {'input err':>10} {'output err':>10} {'growth':>10}"]
    for where, row in zip(wheres, rows):
        lines.append(f"{where:<{width}}  {row['module'] or '-':<{module_width}}  {row['op_type']:<20} {row['input_error']:>10.3g} {row['error']:>10.3g} {row['growth']:>10.3g}")
    return "\n".join(lines) + "\n"


def aligned_output(result: dict[str, Any], fmt: str, everything: bool) -> str:
    """An aligned comparison (or compare --exporters' result, which holds one under "alignment") as text, json or html."""
    if fmt == "json":
        return alignment_json(result)
    if fmt == "html":
        return alignment_html(result.get("alignment", result))
    return exporters_text(result, everything) if "alignment" in result else alignment_text(result, everything)


def exporters_text(result: dict[str, Any], show_all: bool) -> str:
    """compare --exporters' result: each export against torch, which is closer, then the two exports aligned."""
    lines = []
    for exporter, side in result["torch"].items():
        first = side["first_diverging"]
        worst = side["worst_module"]
        lines.append(f"torch vs {exporter} ({side['nodes']} nodes): outputs max_abs_diff {side['outputs_max_abs_diff']:.3g}; "
                     f"{side['mapped']} of {side['modules']} modules mapped, "
                     + (f"first over the tolerance {side['tolerance']:g}: {first['module']} ({first['kind']}, {first['max_abs_diff']:.3g})" if first
                        else f"none over the tolerance {side['tolerance']:g}")
                     + (f"; largest: {worst['module']} {worst['max_abs_diff']:.3g}" if worst else ""))
    closer = result["closer_to_torch"]
    other = {"dynamo": "torchscript", "torchscript": "dynamo"}
    divergence = result["alignment"]["first_divergence"]
    where = (f"the {other[closer]} export parts from it at row {divergence['row']} (module {divergence['b' if closer == 'dynamo' else 'a']['module'] or '-'})"
             if closer and divergence else "the two exports agree on every paired result")
    lines.append(f"closer to torch: {closer} export; {where}" if closer else f"both exports are as close to torch; {where}")
    return "\n".join(lines) + "\n" + alignment_text(result["alignment"], show_all)


def torch_text(result: dict[str, Any]) -> str:
    """compare --torch's result: one row per torch module, its unmapped submodules folded."""
    rows = result["rows"]
    width = max([len("module"), *(len(r["module"]) for r in rows)])
    kind_width = max([len("class"), *(len(r["kind"]) for r in rows)])
    first = result["first_diverging"]
    lines = [f"torch ({result['profile']}) vs {result['onnx']}: {result['mapped']} of {result['modules']} modules mapped to an ONNX tensor; "
             f"tolerance {result['tolerance']:g} (max |onnx - torch|)",
             f"first diverging module: {first['module']} ({first['kind']}, max_abs_diff {first['max_abs_diff']:.3g})" if first
             else "no mapped module exceeds the tolerance",
             f"{'module':<{width}}  {'class':<{kind_width}}  {'max abs':>9} {'relative':>9}  tensor / note"]
    for r in _fold_submodules(rows):
        if isinstance(r, list):
            notes = "; ".join(dict.fromkeys(child["note"] for child in r[1:]))
            lines.append(f"{r[0] + '.*':<{width}}  {f'{len(r) - 1} modules':<{kind_width}}  {'-':>9} {'-':>9}  not mapped: {notes}")
            continue
        mark = " <- over tolerance" if r["max_abs_diff"] is not None and not r["max_abs_diff"] <= result["tolerance"] else ""
        if r["tensor"] is None:
            lines.append(f"{r['module']:<{width}}  {r['kind']:<{kind_width}}  {'-':>9} {'-':>9}  not mapped: {r['note']}")
        else:
            relative = f"{r['relative']:9.2e}" if r["relative"] is not None else f"{'-':>9}"
            note = f" ({r['note']})" if r["note"] else ""
            lines.append(f"{r['module']:<{width}}  {r['kind']:<{kind_width}}  {r['max_abs_diff']:9.2e} {relative}  {r['tensor']}{note}{mark}")
    return "\n".join(lines) + "\n"


def _fold_submodules(rows: list[dict[str, Any]]) -> list:
    """Rows, with the unmapped submodules of each mapped module (e.g. one exported as an ONNX function) as one
    entry [that module, its unmapped submodules' rows...], where the first of them was."""
    mapped = {r["module"] for r in rows if r["tensor"] is not None}
    folded: list = []
    groups: dict[str, list] = {}
    for r in rows:
        parts = r["module"].split(".")
        owner = next((".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1) if ".".join(parts[:i]) in mapped), None) if r["tensor"] is None else None
        if owner is None:
            folded.append(r)
            continue
        if owner not in groups:
            groups[owner] = [owner]
            folded.append(groups[owner])
        groups[owner].append(r)
    return folded


# ---------------------------------------------------------------- html

FOLD = 3  # a run of more plain equal rows than this is folded
CONTEXT = 6  # rows shown either side of the first divergence at the top of the page


def _plain(row: dict[str, Any]) -> bool:
    return row["mark"] == "=" and row["a"]["op"] == row["b"]["op"]


def _blocks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive rows grouped: runs of more than FOLD plain equal rows (same op on both sides) folded."""
    blocks: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []

    def flush() -> None:
        if len(run) > FOLD:
            blocks.append({"folded": True, "rows": list(run)})
        elif run:
            blocks.append({"folded": False, "rows": list(run)})
        run.clear()

    for row in rows:
        if _plain(row):
            run.append(row)
            continue
        flush()
        if blocks and not blocks[-1]["folded"]:
            blocks[-1]["rows"].append(row)
        else:
            blocks.append({"folded": False, "rows": [row]})
    flush()
    return blocks


def alignment_html(result: dict[str, Any]) -> str:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"), autoescape=select_autoescape(default=True))
    first = (result["first_divergence"] or {}).get("row")
    classes = {"=": "eq", "~": "diff", "-": "onlya", "+": "onlyb"}

    def row_class(row: dict[str, Any]) -> str:
        if row["row"] == first:
            return "first"
        if row["mark"] == "=" and not _plain(row):
            return "opdiff"
        return classes[row["mark"]]

    around = result["rows"][max(0, first - 1 - CONTEXT): first + CONTEXT] if first else []
    return env.get_template("compare.html.j2").render(r=result, verdict=verdict_line(result), blocks=_blocks(result["rows"]), around=around,
                                                      row_class=row_class)
