"""`compare --format html`: the two executions side by side, aligned rows joined, the first
divergence highlighted and shown first with the rows around it (the verdict links to its place
among every row), runs of equal rows folded (click to unfold).
Every model-supplied string goes through jinja2's autoescape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quant.compare import verdict_line

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
