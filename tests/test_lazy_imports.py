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
