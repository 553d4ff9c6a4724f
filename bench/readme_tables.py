"""The README's generated tables: each bench script renders its table from its results file and
writes it between its two markers (`--readme` after a run, `--readme-only` from the recorded file);
tests/test_bench_tables.py and tests/test_readme_report.py check the README holds exactly that."""

from __future__ import annotations

import argparse
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def add_readme_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--readme", action="store_true", help="write the table into README.md")
    parser.add_argument("--readme-only", action="store_true", help="only rewrite README.md's table from the results file")


def write_block(start_marker: str, end_marker: str, table: str) -> None:
    """Replace what README.md holds between the two markers with `table`."""
    text = README.read_text()
    start, end = text.index(start_marker), text.index(end_marker)
    README.write_text(text[: start + len(start_marker)] + "\n" + table + text[end:])
