"""`python -m pipeline --help` must not import the heavy libraries (checked with -X importtime)."""

import subprocess
import sys

import pytest
from conftest import REPO

HEAVY = {"torch", "onnxruntime", "modelopt", "tensorrt", "onnx", "onnx_ir"}


def imported_top_level_modules(*python_args: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *python_args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.mark.parametrize("args", [("--help",), ("build", "--help"), ("export", "--help"), ("profiles",)])
def test_help_imports_no_heavy_library(args):
    names = imported_top_level_modules("-m", "pipeline", *args)
    assert "pipeline" in names and "typer" in names, "importtime output not understood"
    assert not names & HEAVY


def test_the_check_can_fail():
    """The same parser does see a heavy import when one happens."""
    assert "onnx" in imported_top_level_modules("-c", "import pipeline.cli, onnx")


def test_optimize_command_never_imports_sympy(bert_tiny_torchscript, tmp_path):
    """onnx_ir imports sympy for symbolic-dim arithmetic the optimize command never does
    (pipeline/deferred_sympy.py): the command runs without it, and writes the same bytes as a process that has it."""
    out = tmp_path / "deferred.onnx"
    names = imported_top_level_modules("-m", "pipeline", "optimize", str(bert_tiny_torchscript), "-o", str(out))
    assert "onnx_ir" in names and "sympy" not in names
    eager = tmp_path / "eager.onnx"
    subprocess.run([sys.executable, "-c", f"import sympy; from pipeline.optimize import optimize_file; optimize_file({str(bert_tiny_torchscript)!r}, {str(eager)!r})"],
                   cwd=REPO, check=True, timeout=300)
    assert out.read_bytes() == eager.read_bytes()


def test_deferred_sympy_answers_like_sympy():
    """The first use of a deferred module imports it: symbolic-dim arithmetic works and sees the one real sympy."""
    code = (
        "import sys; from pipeline import deferred_sympy; deferred_sympy.defer()\n"
        "import onnx_ir as ir\n"
        "assert 'sympy.core' not in sys.modules\n"
        "dim = ir.SymbolicDim('batch') * 2 + 1\n"
        "import sympy; from sympy import Expr\n"
        "assert str(dim) == '2*batch + 1' and dim.evaluate({'batch': 3}) == 7\n"
        "assert isinstance(dim._expr, Expr) and sys.modules['sympy'] is sympy and type(sympy).__name__ == 'module'\n"
        "print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "ok", result.stderr[-2000:]
