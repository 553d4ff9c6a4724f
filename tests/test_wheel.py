"""Installable as a package: a wheel built from the project carries the profiles (pipeline.profiles) and
runs the quick start's first steps from an empty folder, in a fresh venv that sees nothing of the checkout."""

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from conftest import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv (torch and the other dependencies seen from the test run's environment) with the wheel installed."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # setuptools builds in the source folder: a copy, so no build/ of an earlier layout is picked up
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, source / name)
    for name in ("pipeline", "trt", "quant", "profiles"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), "-q"],
                           capture_output=True, text=True, cwd=root)
    assert build.returncode == 0, build.stderr
    (wheel,) = (root / "dist").glob("trt_pipeline-*.whl")
    venv.create(root / "venv", with_pip=False)
    python = root / "venv" / "bin" / "python"
    # the dependencies are those of the interpreter running the tests (a venv's too, not only the base Python's):
    # plain paths in a .pth file, so that environment's own .pth files (its editable install of this checkout) stay inactive
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True)
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (Path(site.stdout.strip()) / "dependencies.pth").write_text("".join(f"{path}\n" for path in ours), encoding="utf-8")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "--ignore-installed", "-q", str(wheel)],
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    empty = root / "empty"
    empty.mkdir()
    return python, empty


def run_installed(installed, *args):
    python, empty = installed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"COLUMNS": "200"}
    return subprocess.run([str(python), "-m", "pipeline", *args], cwd=empty, env=env, capture_output=True, text=True, timeout=600)


def test_the_wheel_lists_its_profiles_and_builds_from_an_empty_folder(installed):
    python, empty = installed
    where = subprocess.run([str(python), "-c", "import pipeline, pipeline.core.profiles as p; print(pipeline.__file__); print(p.packaged_profiles())"],
                           cwd=empty, capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    module, profiles = where.stdout.split()
    assert str(python.parents[1]) in module and str(python.parents[1]) in profiles, "the installed copy, not the checkout"
    listed = run_installed(installed, "profiles")
    assert listed.returncode == 0, listed.stderr
    shipped = {p.stem for p in (REPO / "profiles").glob("*.toml") if not p.stem.startswith("matrix-")}  # matrices are jobs specs
    assert shipped <= {line.split()[0] for line in listed.stdout.splitlines() if line and not line.startswith(" ")}
    built = run_installed(installed, "build", "--until", "export")
    assert built.returncode == 0, built.stderr
    assert (empty / "artifacts" / "bert-tiny" / "model.onnx").stat().st_size > 0
    assert "export    done" in built.stdout


def test_the_wheel_holds_every_module_and_template_of_the_checkout(installed):
    """A package missing from pyproject's list (pipeline.jobs was) leaves its commands out of every non-editable install."""
    python, empty = installed
    where = subprocess.run([str(python), "-c", "import pipeline; print(pipeline.__file__)"], cwd=empty, capture_output=True, text=True, check=True,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    site = Path(where.stdout.strip()).parents[1]
    assert str(python.parents[1]) in str(site), "the installed copy, not the checkout"
    wanted = {path.relative_to(REPO) for package in ("pipeline", "quant", "trt") for path in (REPO / package).rglob("*")
              if path.is_file() and "__pycache__" not in path.parts}
    missing = sorted(str(path) for path in wanted if not (site / path).is_file())
    assert not missing, f"not in the wheel: {missing}"


def test_the_wheel_plans_the_packaged_matrix(installed):
    python, empty = installed
    matrix = Path(subprocess.run([str(python), "-c", "import pipeline, pathlib; print(pathlib.Path(pipeline.__file__).parent / 'profiles' / 'matrix-cpu.toml')"],
                                 cwd=empty, capture_output=True, text=True, check=True).stdout.strip())
    planned = run_installed(installed, "jobs", "plan", str(matrix))
    assert planned.returncode == 0, planned.stderr
    assert "cells" in planned.stdout, planned.stdout
