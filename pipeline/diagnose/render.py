"""The aligned comparison (compare.py `align_models`) for a reader: the verdict line, a text table of the
rows where the graphs part, JSON, and `compare --format html`: the two executions side by side,
aligned rows joined, the first divergence highlighted and shown first with the rows around it (the
verdict links to its place among every row), runs of equal rows folded (click to unfold).
Every model-supplied string in the HTML goes through jinja2's autoescape."""

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
