"""The code stays free of unused names, undefined names and the bug patterns ruff knows (config in pyproject)."""

import shutil
import subprocess

import pytest
from conftest import REPO


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff comes with the dev extra")
def test_ruff_is_clean():
    result = subprocess.run(["ruff", "check", "pipeline", "trt", "quant", "tests", "bench"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60  # issue 32: past these, a module or a function holds more than one idea


def oversized(root) -> list[str]:
    """The modules of our packages over MAX_MODULE_LINES lines and the functions over MAX_FUNCTION_LINES."""
    import ast

    found = []
    for package in ("pipeline", "quant", "trt"):
        for path in sorted((root / package).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            if source.count("\n") > MAX_MODULE_LINES:
                found.append(f"{path.relative_to(root)}: {source.count(chr(10))} lines")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    return found


def test_no_module_or_function_outgrows_one_idea():
    assert oversized(REPO) == []


def test_the_size_check_sees_a_long_function(tmp_path):
    (tmp_path / "quant").mkdir()
    (tmp_path / "quant" / "long.py").write_text("def f():\n" + "    x = 1\n" * 61)
    assert oversized(tmp_path) == ["quant/long.py:1 f: 62 lines"]
