import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# No example database: a failure found once must not replay in every later run (CI's clean clone
# and a developer's tree alike) without saying what it is; each failure prints its reproducer
# (@reproduce_failure blob) and the falsifying example.
settings.register_profile("project", database=None, print_blob=True)
settings.load_profile("project")

# One torch thread per xdist worker (inherited by the CLI runs the tests start): two workers on two cores, each with torch's
# default of a thread per core, ran the torch-heavy tests 1.4-1.6x slower, their OpenMP threads contending for the cores.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


TRT_DATA = TESTS / "data" / "trt"


@pytest.fixture(scope="session")
def trt_fixtures() -> Path:
    """Real TensorRT outputs, copied unchanged with their provenance (tests/data/trt/README.md)."""
    return TRT_DATA


@pytest.fixture(scope="session")
def conformance(tmp_path_factory):
    """`conformance(version)`: the conformance scenarios' results against that TensorRT version's real
    bindings (tests/trt_bindings.py), run once per session per version."""
    from trt_bindings import Conformance

    return Conformance(tmp_path_factory.mktemp("conformance"))


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600, path: tuple[Path, ...] = (), **popen) -> subprocess.CompletedProcess:
    """Run `python -m pipeline ARGS` as a user would; tests' factories (and `path`) are importable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO), *map(str, path)]), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, **popen
    )


@pytest.fixture(scope="session")
def bert_tiny_torchscript(tmp_path_factory) -> Path:
    """bert-tiny exported once per session by the TorchScript exporter (node names as in the log)."""
    from pipeline.core.profiles import load_profile
    from pipeline.export import export_model

    path = tmp_path_factory.mktemp("bert_tiny_ts") / "model.onnx"
    export_model(load_profile("bert-tiny"), path, exporter="torchscript")
    return path


def write_profile(directory: Path, text: str, name: str = "p.toml") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


TINY_MLP_PROFILE = """
name = "tiny-mlp"
[model]
factory = "factories:tiny_mlp"
seed = 3
[dims.batch]
min = 1
opt = 4
max = 16
[[inputs]]
name = "x"
dtype = "float32"
shape = ["batch", 8]
"""


SMALL_MLP_PROFILE = """
name = "small-mlp"
[model]
factory = "factories:small_mlp"
seed = 5
[dims.batch]
min = 1
opt = 4
max = 16
[[inputs]]
name = "x"
dtype = "float32"
shape = ["batch", 32]
[quant]
samples = 1024  # calibration long enough (about a second) for the tests to interrupt it
accuracy_samples = 4
"""


def mnist_with_a_layer_named(directory: Path, name: str) -> Path:
    """The real 10.16 inspector JSON with its first layer (and that layer's ONNX node) renamed to
    `name`: a model-supplied string the renderers must escape. Everything else is TensorRT's own."""
    data = json.loads((TRT_DATA / "trt10.16_detailed_mnist_myelin.layers.json").read_text())
    data["Layers"][0]["Name"] = name
    data["Layers"][0]["Metadata"] = f"[ONNX Layer: {name}]"
    path = directory / "renamed.layers.json"
    path.write_text(json.dumps(data))
    return path


def pytest_unconfigure(config):
    """The test command ends with pytest's summary: tests that import ModelOpt in-process (it imports lief)
    get lief's exit-time leak report switched off as the CLI's stages do (quant.silence_lief_leak_report)."""
    from quant import silence_lief_leak_report

    silence_lief_leak_report()
