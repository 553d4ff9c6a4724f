"""The real Python bindings of TensorRT 10.8, 10.13 and 11.4, importable on a CPU machine, for the
conformance tests (tests/conformance, tests/test_trt_conformance.py).

Each version's bindings wheel (`tensorrt-cu12-bindings` for 10.x, `tensorrt-cu13-bindings` for
11.x, about 1.2 MB) is downloaded once with pip into a cache folder ($TRT_PIPELINE_CACHE, default
~/.cache/trt-pipeline) and unpacked. Its tensorrt.so needs nine C symbols from libnvinfer.so.N,
libnvonnxparser.so.N and libnvinfer_plugin.so.N; stub libraries compiled there with `cc` provide
them and return NULL/0, so a real Builder, Runtime or parser can never be made (the scenarios replace
those factories). Without pip's index or a C compiler the tests skip with the reason; under CI
(CI=true) they fail instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
VERSIONS = {"10.8.0.43": "tensorrt-cu12-bindings", "10.13.0.35": "tensorrt-cu12-bindings", "11.4.0.106": "tensorrt-cu13-bindings"}
LIBRARIES = ("libnvinfer", "libnvonnxparser", "libnvinfer_plugin")
LAYER_INFORMATION = TESTS / "data" / "trt" / "trt10.16_detailed_mnist_myelin.layers.json"
STUBS = """\
#include <stddef.h>
void *createInferBuilder_INTERNAL(void *logger, int version) { return NULL; }
void *createInferRuntime_INTERNAL(void *logger, int version) { return NULL; }
void *createInferRefitter_INTERNAL(void *engine, void *logger, int version) { return NULL; }
void *createNvOnnxParser_INTERNAL(void *network, void *logger, int version) { return NULL; }
void *createNvOnnxParserRefitter_INTERNAL(void *refitter, void *logger, int version) { return NULL; }
void *getPluginRegistry(void) { return NULL; }
void *getBuilderPluginRegistry(int capability) { return NULL; }
int getNvOnnxParserVersion(void) { return 0; }
int initLibNvInferPlugins(void *logger, const char *library_namespace) { return 0; }
"""


class Unavailable(Exception):
    """Why the bindings cannot be prepared on this machine."""


@dataclass(frozen=True)
class Bindings:
    version: str
    site: Path  # holds the `tensorrt_bindings` package
    libraries: Path  # holds the stub libnvinfer.so.N, libnvonnxparser.so.N, libnvinfer_plugin.so.N


def cache_folder() -> Path:
    return Path(os.environ.get("TRT_PIPELINE_CACHE") or Path.home() / ".cache" / "trt-pipeline") / "bindings"


def prepare(version: str) -> Bindings:
    """The bindings of `version` for this Python, from the cache or downloaded and stubbed now."""
    target = cache_folder() / f"{version}-cp{sys.version_info.major}{sys.version_info.minor}"
    if not (target / "READY").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".{target.name}.lock", "w") as lock:  # test workers in parallel prepare a version once
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (target / "READY").is_file():
                _prepare(version, target)
    return Bindings(version, target / "site", target / "lib")


def _prepare(version: str, target: Path) -> None:
    compiler = shutil.which("cc")
    if compiler is None:
        raise Unavailable("no C compiler (cc) to build the stub TensorRT libraries")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        package = f"{VERSIONS[version]}=={version}"
        download = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
                                   "-d", str(work / "wheel"), package], capture_output=True, text=True, timeout=600)
        if download.returncode != 0:
            reason = (download.stderr.strip().splitlines() or ["no message"])[-1]
            raise Unavailable(f"pip could not download {package}: {reason}")
        wheel = next((work / "wheel").glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(work / "site")
        (work / "lib").mkdir()
        (work / "stubs.c").write_text(STUBS)
        for library in LIBRARIES:
            output = work / "lib" / f"{library}.so.{version.split('.')[0]}"
            built = subprocess.run([compiler, "-shared", "-fPIC", "-o", str(output), str(work / "stubs.c")], capture_output=True, text=True)
            if built.returncode != 0:
                raise Unavailable(f"cc could not build {output.name}: {built.stderr.strip()[-300:]}")
        (work / "READY").write_text(wheel.name + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_scenarios(bindings: Bindings, scenarios: list[str], workdir: Path) -> dict[str, Any]:
    """Run `scenarios` in one subprocess that imports this version's bindings as `tensorrt`."""
    results = workdir / "results.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(bindings.site), str(TESTS), str(REPO)]),
           "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(bindings.libraries), os.environ.get("LD_LIBRARY_PATH")]))}
    command = [sys.executable, "-m", "conformance.runner", str(results), str(workdir), str(LAYER_INFORMATION), *scenarios]
    run = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        raise RuntimeError(f"the conformance runner failed for TensorRT {bindings.version} (exit {run.returncode}):\n{run.stderr[-4000:]}")
    return json.loads(results.read_text())


class Conformance:
    """`conformance(version)`: every scenario's result for that version, run once per session."""

    def __init__(self, workdir: Path):
        self.workdir, self.results = workdir, {}

    def __call__(self, version: str) -> dict[str, Any]:
        if version not in self.results:
            from conformance.scenarios import SCENARIOS

            try:
                bindings = prepare(version)
            except Unavailable as err:
                self.results[version] = err
            else:
                folder = self.workdir / version
                folder.mkdir()
                self.results[version] = run_scenarios(bindings, list(SCENARIOS), folder)
        found = self.results[version]
        if isinstance(found, Unavailable):
            skip_or_fail(f"TensorRT {version} bindings unavailable: {found}")
        return found


def skip_or_fail(reason: str) -> None:
    """Skip a test this machine cannot run, with the reason; under CI (CI=true) fail instead: CI must run it."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (CI must run this test)")
    pytest.skip(reason)
