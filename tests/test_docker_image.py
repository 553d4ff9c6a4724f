"""The Docker image's Python install is a coherent CUDA 12 stack, checked without Docker or a GPU.

The Dockerfile installs docker/requirements.txt and the project (its dependencies and the dev extra)
in one pip resolution on NVIDIA's TensorRT image (Python 3.12, manylinux x86_64, CUDA 12.8, R570).
This resolves the same for that platform with `pip install --dry-run --report` and checks: no CUDA 13
package, no `tensorrt` package replacing the image's TensorRT, torch the CUDA 12.8 build.

PyTorch's index (download.pytorch.org) is not reachable from every machine (not from this project's):
torch is then resolved from PyPI at the pinned version, whose Linux wheel is PyTorch's CUDA 12.8 build
too (its nvidia-*-cu12 requirements are checked to be CUDA 12.8), and the `+cu128` local version is
checked as pinned in the file only. Packages published only as source (cppimport) are built into
pure-Python wheels for the dry run.
"""

import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib
from conftest import REPO
from trt_bindings import cache_folder, skip_or_fail

REQUIREMENTS = REPO / "docker" / "requirements.txt"
PYTORCH_INDEX = "https://download.pytorch.org/whl/cu128"
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(28, 16, -1)] + ["manylinux2014_x86_64"]
NOT_CUDA_LIBRARIES = {"nvidia-modelopt", "nvidia-modelopt-core", "nvidia-ml-py"}


def requirement_file() -> tuple[list[str], list[str]]:
    """The file's index options and its requirements."""
    lines = [line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text().splitlines()]
    return [line for line in lines if line.startswith("--")], [line for line in lines if line and not line.startswith("--")]


def project_requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + project["optional-dependencies"]["dev"]


def name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def image_problems(report: dict) -> list[str]:
    """What is wrong with a resolution for the image: CUDA 13 packages, a TensorRT package, a non-CUDA-12.8 torch."""
    installed = {name(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}
    problems = []
    for package, version in sorted(installed.items()):
        major = int(re.match(r"\d+", version).group()) if re.match(r"\d+", version) else 0
        if "cu13" in package or (package in ("cuda-toolkit", "cuda-bindings", "cuda-python", "cuda-runtime") and major >= 13):
            problems.append(f"CUDA 13 package {package} {version}")
        elif package.startswith("nvidia-") and package not in NOT_CUDA_LIBRARIES and not package.endswith("-cu12"):
            problems.append(f"{package} {version}: a CUDA library without the -cu12 suffix (CUDA 13 naming)")
        if package == "tensorrt" or package.startswith("tensorrt-"):
            problems.append(f"{package} {version} would replace the image's TensorRT")
    torch = installed.get("torch", "")
    runtime = installed.get("nvidia-cuda-runtime-cu12", "")
    if not (torch.endswith("+cu128") or runtime.startswith("12.8.")):
        problems.append(f"torch {torch or 'missing'} is not the CUDA 12.8 build (CUDA runtime {runtime or 'missing'})")
    return problems


def resolve(arguments: list[str], workdir: Path) -> tuple[dict | None, str]:
    """pip's dry-run report for the image's platform, or None and pip's error output.

    A package pip finds no wheel for is built into a wheel when it is a small pure-Python source
    package (cppimport, which nvidia-modelopt[onnx] needs, is published only as source); such wheels
    are kept in the cache folder of tests/trt_bindings.py for the next run."""
    wheelhouse = cache_folder().parent / "source-only-wheels"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    for _ in range(4):
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--disable-pip-version-check",
                   "--target", str(workdir / "target"), "--report", str(workdir / "report.json"), "--python-version", "3.12",
                   "--only-binary=:all:", "--find-links", str(wheelhouse), "--retries", "1", "--timeout", "30",
                   *[f"--platform={platform}" for platform in PLATFORMS], *arguments]
        run = subprocess.run(command, capture_output=True, text=True, timeout=1200)
        if run.returncode == 0:
            return json.loads((workdir / "report.json").read_text()), ""
        missing = re.search(r"No matching distribution found for ([A-Za-z0-9_.-]+)", run.stderr)
        if not missing or not _pure_wheel(missing.group(1), wheelhouse):
            return None, run.stderr
    return None, "too many source-only packages"


def _pure_wheel(package: str, wheelhouse: Path) -> bool:
    sources = wheelhouse / "sources"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    fetched = subprocess.run([*pip, "download", "--no-deps", "--no-binary", ":all:", "-d", str(sources), package], capture_output=True, timeout=600)
    archives = [path for path in sources.glob("*") if name(path.name).startswith(name(package))] if fetched.returncode == 0 else []
    if not archives or archives[0].stat().st_size > 5 << 20:
        return False
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheelhouse), str(archives[0])], capture_output=True, timeout=600)
    return any(name(wheel.name).startswith(name(package)) and wheel.name.endswith("-none-any.whl") for wheel in wheelhouse.glob("*.whl"))


def test_the_requirements_pin_torch_to_pytorchs_cuda_12_8_build_and_no_tensorrt():
    options, requirements = requirement_file()
    assert f"--index-url {PYTORCH_INDEX}" in options and "--extra-index-url https://pypi.org/simple" in options
    assert [r for r in requirements if name(r).startswith("torch")] == [next(r for r in requirements if r.startswith("torch=="))]
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+\+cu128", next(r for r in requirements if r.startswith("torch==")))
    assert not [r for r in requirements + project_requirements() if name(r).startswith("tensorrt")]
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'pip install --no-cache-dir -r docker/requirements.txt -e ".[dev]"' in dockerfile, "the image installs what this test resolves"


def test_the_check_sees_a_cuda_13_stack():
    """Names and versions pip resolved for an unpinned torch (2.14.1 from PyPI) on this platform, 2026."""
    unpinned = {"install": [{"metadata": {"name": n, "version": v}} for n, v in [
        ("torch", "2.14.1"), ("nvidia-cudnn-cu13", "9.24.0.43"), ("nvidia-cuda-runtime", "13.0.96"), ("cuda-toolkit", "13.0.3.0"),
        ("nvidia-ml-py", "13.615.71"), ("nvidia-modelopt", "0.47.0"), ("tensorrt-cu13", "11.4.0.106")]]}
    problems = image_problems(unpinned)
    assert problems == ["CUDA 13 package cuda-toolkit 13.0.3.0",
                        "nvidia-cuda-runtime 13.0.96: a CUDA library without the -cu12 suffix (CUDA 13 naming)",
                        "CUDA 13 package nvidia-cudnn-cu13 9.24.0.43",
                        "CUDA 13 package tensorrt-cu13 11.4.0.106", "tensorrt-cu13 11.4.0.106 would replace the image's TensorRT",
                        "torch 2.14.1 is not the CUDA 12.8 build (CUDA runtime missing)"]


def pytorch_index_has(version: str) -> bool:
    """Whether pip reaches PyTorch's cu128 index and finds torch `version` there for the image's platform."""
    probe = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "torch", "--index-url", PYTORCH_INDEX, "--retries", "0",
                            "--timeout", "15", "--disable-pip-version-check", "--python-version", "3.12", "--only-binary=:all:",
                            f"--platform={PLATFORMS[0]}"], capture_output=True, text=True, timeout=120)
    return probe.returncode == 0 and version in probe.stdout


def image_report(workdir: Path) -> dict:
    """pip's report for the image's install: with PyTorch's index when pip reaches it, else with torch at the
    pinned version from PyPI. A resolution downloads every wheel (gigabytes: the index gives pip no separate
    metadata), so a report is reused for a day while the requirements stay the same."""
    _, requirements = requirement_file()
    pinned = next(r for r in requirements if r.startswith("torch=="))[len("torch=="):]
    if pytorch_index_has(pinned):
        arguments = ["-r", str(REQUIREMENTS), *project_requirements()]
    else:
        arguments = [r.split("+", 1)[0] if r.startswith("torch==") else r for r in requirements] + project_requirements()
    key = hashlib.sha256(json.dumps([REQUIREMENTS.read_text(), arguments, PLATFORMS]).encode()).hexdigest()[:16]
    cached = cache_folder().parent / f"image-resolution-{key}.json"
    if cached.is_file() and time.time() - cached.stat().st_mtime < 24 * 3600:
        return json.loads(cached.read_text())
    report, error = resolve(arguments, workdir)
    if report is None and re.search(r"NewConnectionError|Could not fetch URL|name resolution|Network is unreachable", error):
        skip_or_fail("pip cannot reach the package index to resolve the image's packages")
    assert report is not None, f"pip could not resolve the image's packages: {error.strip().splitlines()[-1:]}"
    cached.write_text(json.dumps(report))
    return report


@pytest.mark.slow
def test_the_image_resolves_to_a_cuda_12_stack_without_tensorrt(tmp_path):
    report = image_report(tmp_path)
    assert image_problems(report) == []
    pinned = next(r for r in requirement_file()[1] if r.startswith("torch=="))[len("torch=="):]
    torch = next(item for item in report["install"] if name(item["metadata"]["name"]) == "torch")
    from_pytorch = torch["download_info"]["url"].startswith("https://download.pytorch.org/")
    assert torch["metadata"]["version"] == (pinned if from_pytorch else pinned.split("+", 1)[0])
    assert not [item for item in report["install"] if name(item["metadata"]["name"]).startswith("tensorrt")]
