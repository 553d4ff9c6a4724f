"""The performance page's report speed table and fuzz summary are the recorded benchmark results, never typed by hand."""

import json
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
from report_speed import FUZZ_RESULTS, RESULTS, TABLE_END, TABLE_START, readme_table  # noqa: E402


def test_readme_table_is_generated_from_the_results():
    text = (REPO / "docs" / "performance.md").read_text()
    block = text[text.index(TABLE_START) + len(TABLE_START) : text.index(TABLE_END)]
    assert block == "\n" + readme_table(json.loads(RESULTS.read_text()), json.loads(FUZZ_RESULTS.read_text()))
