"""A stage's code key is the import closure of its entry, computed (pipeline/codekeys.py): editing a module a
stage imports, directly or not, reruns it; editing any other module does not. Checked by editing every module
of a copy of the project, one at a time, and computing every stage's key."""

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO

from pipeline.codekeys import import_closure, imports_of

# run in a copy of the project: edit each module in turn, record which stages' code keys moved
EDIT_EVERY_MODULE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from pipeline import codekeys
    from pipeline.stages import catalogue

    stages = catalogue()
    def keys():
        codekeys.clear_caches()
        return {s.name: codekeys.code_key(s.run.__module__) for s in stages}
    before = keys()
    closures = {s.name: list(codekeys.import_closure(s.run.__module__)) for s in stages}
    moved = {}
    for path in sorted(p for package in ("pipeline", "quant", "trt") for p in Path(package).rglob("*.py")):
        module = ".".join(path.with_suffix("").parts).removesuffix(".__init__")
        source = path.read_text()
        path.write_text(source + "\\n# edited\\n")
        moved[module] = sorted(name for name, key in keys().items() if key != before[name])
        path.write_text(source)
    json.dump({"closures": closures, "moved": moved}, sys.stdout)
""")


@pytest.fixture(scope="module")
def edits(tmp_path_factory):
    copy = tmp_path_factory.mktemp("project")
    for package in ("pipeline", "quant", "trt", "profiles"):
        shutil.copytree(REPO / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-c", EDIT_EVERY_MODULE], cwd=copy, env={"PYTHONPATH": str(copy), "PATH": ""},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_editing_a_module_reruns_exactly_the_stages_that_import_it(edits):
    closures, moved = edits["closures"], edits["moved"]
    assert len(moved) > 100
    for module, stages in moved.items():
        assert stages == sorted(name for name, closure in closures.items() if module in closure), module


def test_the_modelopt_caller_reruns_the_ptq_stages_and_bench_code_reruns_bench(edits):
    moved = edits["moved"]
    assert moved["quant.ptq"] == ["fp8", "int4", "int8"]
    assert moved["pipeline.stages.bench"] == ["bench"] and moved["trt.bench"] == ["bench"]
    assert moved["trt.build"] == ["bench", "build"]  # bench runs engines through trt.build's helpers
    assert moved["pipeline.models.decoder"] == ["bf16", "export", "fp16"]  # the export and AutoCast's reference feeds (FP16, and BF16 through it) use it
    assert moved["pipeline.cli.app"] == [] and moved["pipeline.runner"] == []  # the CLI and the runner decide no result


def test_the_closure_follows_imports_inside_functions_but_not_type_checking_ones(tmp_path, monkeypatch):
    package = tmp_path / "pipeline_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import quant.lint\n"
                                   "def f():\n    from quant import presets\n    import trt.plan\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("pipeline.codekeys.OURS", ("pipeline_probe", "quant", "trt"))
    assert imports_of("pipeline_probe.a") == ("quant.presets", "trt.plan")
    assert "quant.lint" not in import_closure("pipeline_probe.a") and "quant.presets" in import_closure("pipeline_probe.a")
