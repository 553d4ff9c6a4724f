"""The performance page's performance tables are the recorded benchmark results, never typed by hand."""

import importlib.util
import json
import sys

import pytest
from conftest import REPO


def bench_module(name: str):
    if str(REPO / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "bench"))  # the bench scripts import their shared readme_tables
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["build_overhead", "optimize_speed", "reference_overlap", "sizes", "encoder_decoders"])
def test_readme_table_is_rendered_from_the_results_file(name):
    module = bench_module(name)
    text = getattr(module, "DOCS", REPO / "docs" / "performance.md").read_text()
    block = text[text.index(module.TABLE_START) + len(module.TABLE_START) : text.index(module.TABLE_END)]
    assert block == "\n" + module.readme_table(json.loads(module.RESULTS.read_text()))


@pytest.mark.parametrize("name", ["build_overhead", "optimize_speed"])
def test_recorded_verdicts_follow_from_the_recorded_figures(name):
    """meets_targets is what the figures say (a results file edited by hand would disagree)."""
    module = bench_module(name)
    result = json.loads(module.RESULTS.read_text())
    assert result["targets"] == module.TARGETS
    if name == "build_overhead":
        time_ratios = [r["pipeline"]["seconds"] / r["direct_seconds"] for r in result["runs"]]
        assert result["summary"]["time_ratio"]["max"] == round(max(time_ratios), 3)
        assert result["meets_targets"]["time_ratio"] == (result["summary"]["time_ratio"]["median"] <= module.TARGETS["time_ratio"])
    else:
        assert result["meets_targets"]["ratio_48_over_12_layers"] == (result["ratio_48_over_12_layers"] <= module.TARGETS["ratio_48_over_12_layers"])


def test_the_optimum_export_tables_are_the_recorded_results():
    """docs/decoders.md's export times against Optimum and their files are rendered from the results file."""
    module = bench_module("optimum_export")
    text = (REPO / "docs" / "decoders.md").read_text()
    block = text[text.index(module.TABLE_START) + len(module.TABLE_START) : text.index(module.TABLE_END)]
    results = json.loads(module.RESULTS.read_text())
    assert block == "\n" + module.readme_table(results)
    ratios = [r["t5"]["ours (torchscript)"] / r["t5"]["optimum"] for r in results["runs"]]
    assert results["ours_over_optimum"]["t5"]["ours (torchscript)"]["max"] == round(max(ratios), 2)
