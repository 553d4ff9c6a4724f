"""The code stays free of unused names, undefined names and the bug patterns ruff knows (config in pyproject)."""

import shutil
import subprocess

import pytest
from conftest import REPO


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff comes with the dev extra")
def test_ruff_is_clean():
    result = subprocess.run(["ruff", "check", "pipeline", "trt", "quant", "tests", "bench"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
