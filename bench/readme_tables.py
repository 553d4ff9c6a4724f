"""The performance page's generated tables: each bench script renders its table from its results file
and writes it between its two markers in docs/performance.md (`--readme` after a run, `--readme-only`
from the recorded file); tests/test_bench_tables.py and tests/test_readme_report.py check the page
holds exactly that. (The options keep their names from when the tables were in the README.)"""

from __future__ import annotations

import argparse
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "performance.md"


def add_readme_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--readme", action="store_true", help="write the table into docs/performance.md")
    parser.add_argument("--readme-only", action="store_true", help="only rewrite docs/performance.md's table from the results file")


def write_block(start_marker: str, end_marker: str, table: str, page: Path = PAGE) -> None:
    """Replace what `page` (docs/performance.md) holds between the two markers with `table`."""
    text = page.read_text()
    start, end = text.index(start_marker), text.index(end_marker)
    page.write_text(text[: start + len(start_marker)] + "\n" + table + text[end:])
