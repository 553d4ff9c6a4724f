"""The corpus results bench/models.py recorded, and the README table made from them."""

import importlib.util
import json

from conftest import REPO

from pipeline.core.profiles import load_profile


def bench_models():
    spec = importlib.util.spec_from_file_location("bench_models", REPO / "bench" / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_corpus_table_is_the_recorded_results():
    module = bench_models()
    readme = (REPO / "docs" / "performance.md").read_text()
    start, end = "<!-- corpus table: python bench/models.py --table -->\n", "<!-- end of corpus table -->"
    assert start in readme and end in readme
    assert readme.split(start, 1)[1].split(end, 1)[0] == module.table(json.loads(module.RESULTS.read_text()))


def test_every_corpus_model_and_exporter_is_recorded_and_explained():
    module = bench_models()
    results = json.loads(module.RESULTS.read_text())
    assert [(r["model"], r["exporter"]) for r in results["runs"]] == [(m, e) for m in module.CORPUS for e in module.EXPORTERS]
    for run in results["runs"]:
        load_profile(run["model"])  # each recorded model is a packaged profile
        if run["passed"]:
            assert run["fp16"]["cosine_centered"] >= 0.999 and run["int8"]["cosine_centered"] >= 0.99, run["model"]
            assert all(f["justification"] != "unjustified" for f in run["lint"]), (run["model"], run["lint"])
        else:
            assert run["error"] and run["error"].startswith("error: ") and run["exit_code"] in (1, 2), run
    assert all(r["passed"] for r in results["runs"] if r["exporter"] == "dynamo"), "every architecture passes with the dynamo exporter"
