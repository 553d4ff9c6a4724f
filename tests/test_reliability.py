"""Interrupted, killed and concurrent builds, and hostile files around the artifacts folder.

A build killed with SIGKILL at any moment, then run again plainly, gives the same models as a
build that was never interrupted; Ctrl-C is exit 130 with the stage recorded as interrupted; two
builds into one folder never interleave; the manifest stays complete and honest.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, SMALL_MLP_PROFILE, TESTS, run_cli

MODELS = ("model.onnx", "model.opt.onnx", "model.fp16.onnx", "model.int8.onnx")
BUILD = ("build", "--profile", "small.toml", "--fp16", "--int8")


def _start(args: tuple[str, ...], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)]), "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _when(process: subprocess.Popen, condition: Callable[[], bool], timeout: float = 300) -> None:
    """Wait until `condition()` holds while `process` runs; fail if the process ends first."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the build ended before the moment to interrupt it: {process.communicate()}"
        assert time.monotonic() < deadline, "timed out waiting for the moment to interrupt the build"
        time.sleep(0.005)


def _stages(out: Path) -> dict[str, dict]:
    path = out / "manifest.json"
    return {s["name"]: s for s in json.loads(path.read_text())["stages"]} if path.exists() else {}


def _digests(out: Path) -> dict[str, str]:
    return {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in MODELS}


def _temp_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp"))


def _holds_lock(out: Path, process: subprocess.Popen) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return json.loads((out / ".lock").read_text())["pid"] == process.pid
        except (OSError, ValueError, KeyError):
            return False

    return check


def _exists(out: Path, pattern: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return out.is_dir() and any(out.glob(pattern))
        except OSError:  # a work folder removed while globbing: look again
            return False

    return check


def _stage_done(out: Path, name: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return _stages(out).get(name, {}).get("status") == "done"
        except ValueError:  # read while being replaced: try again
            return False

    return check


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("reliability")
    (root / "small.toml").write_text(SMALL_MLP_PROFILE)
    return root


@pytest.fixture(scope="module")
def reference(project) -> dict[str, str]:
    """The models of a build nobody interrupted."""
    result = run_cli(*BUILD, "--out", "ref", cwd=project)
    assert result.returncode == 0, result.stderr
    assert _stages(project / "ref")["int8"]["metrics"]["qdq_pairs"] > 0, "the test model must really be quantized"
    return _digests(project / "ref")


KILL_POINTS = {
    "as it starts": lambda out, p: _holds_lock(out, p),
    "while exporting": lambda out, p: _exists(out, ".model.*.tmp"),
    "after export, optimizing": lambda out, p: _stage_done(out, "export"),
    "inside fp16 (AutoCast)": lambda out, p: _exists(out, ".fp16.log.*.tmp"),
    "inside int8 (ModelOpt calibrating its private copy)": lambda out, p: _exists(out, "**/.model.int8*.work.*.tmp"),
}


@pytest.mark.parametrize("moment", list(KILL_POINTS))
def test_kill_9_then_a_plain_rerun_gives_the_same_models(moment, project, reference):
    out = project / f"killed-{list(KILL_POINTS).index(moment)}"
    process = _start((*BUILD, "--out", out.name), project)
    _when(process, KILL_POINTS[moment](out, process))
    process.kill()
    process.wait()
    rerun = run_cli(*BUILD, "--out", out.name, cwd=project)
    assert rerun.returncode == 0, rerun.stderr
    assert _digests(out) == reference
    assert _temp_files(out) == []
    statuses = {name: s["status"] for name, s in _stages(out).items()}
    assert all(statuses[name] in ("done", "cached") for name in ("export", "optimize", "fp16", "int8")), statuses


INTERRUPT_POINTS = {
    "export": lambda out, p: _exists(out, ".model.*.tmp"),
    "int8": lambda out, p: _exists(out, "**/.model.int8*.work.*.tmp"),
}


@pytest.mark.parametrize("stage", list(INTERRUPT_POINTS))
def test_ctrl_c_is_exit_130_and_the_stage_is_recorded_interrupted(stage, project):
    out = project / f"interrupted-{stage}"
    process = _start((*BUILD, "--out", out.name), project)
    _when(process, INTERRUPT_POINTS[stage](out, process))
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert [line for line in stderr.splitlines() if line.strip()] == ["error: interrupted"]
    assert _stages(out)[stage]["status"] == "interrupted"


def test_a_second_build_into_the_same_folder_exits_2_naming_the_first_or_waits(project):
    out = project / "concurrent"
    first = _start((*BUILD, "--out", out.name), project)
    _when(first, _holds_lock(out, first))
    second = run_cli(*BUILD, "--out", out.name, cwd=project)
    assert second.returncode == 2
    (line,) = [line for line in second.stderr.splitlines() if line.strip()]
    assert f"another build is writing here (pid {first.pid}" in line and "--wait" in line
    waiting = run_cli("build", "--profile", "small.toml", "--fp16", "--out", out.name, "--wait", cwd=project)
    assert first.wait(timeout=300) == 0
    assert waiting.returncode == 0, waiting.stderr
    statuses = {name: s["status"] for name, s in _stages(out).items()}
    assert statuses["export"] == statuses["optimize"] == statuses["fp16"] == "cached"
    assert statuses["int8"] == "done", "the waiting build keeps the first build's int8 record"


def test_changing_flags_keeps_other_records_marked_as_earlier_runs(project, reference):
    result = run_cli("build", "--profile", "small.toml", "--int8", "--out", "ref", cwd=project)
    assert result.returncode == 0, result.stderr
    stages = _stages(project / "ref")
    assert stages["fp16"]["status"] in ("done", "cached") and stages["fp16"]["run"] != stages["int8"]["run"]
    assert "(earlier run)" in result.stdout


def test_a_manifest_of_another_profile_is_not_overwritten(project, reference):
    other = project / "other.toml"
    other.write_text(SMALL_MLP_PROFILE.replace('name = "small-mlp"', 'name = "other"'))
    before = (project / "ref" / "manifest.json").read_bytes()
    result = run_cli("build", "--profile", str(other), "--out", "ref", cwd=project)
    assert result.returncode == 2 and "records a build of profile 'small-mlp', not 'other'" in result.stderr
    assert (project / "ref" / "manifest.json").read_bytes() == before


def test_logs_replace_a_planted_symlink_instead_of_writing_through_it(project, reference, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = project / "symlinked"
    out.mkdir()
    (out / "fp16.log").symlink_to(victim)
    result = run_cli("build", "--profile", "small.toml", "--fp16", "--out", out.name, "--until", "fp16", cwd=project)
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "precious\n"
    assert not (out / "fp16.log").is_symlink()


def test_a_local_profile_does_not_shadow_the_packaged_one(tmp_path):
    (tmp_path / "profiles").mkdir()
    planted = tmp_path / "profiles" / "bert-tiny.toml"
    planted.write_text('name = "bert-tiny"\n[model]\nfactory = "evil:run"\n[[inputs]]\nname = "x"\ndtype = "float32"\nshape = [1]\n')
    result = run_cli("build", "--until", "export", "--out", "o", cwd=tmp_path)
    assert result.returncode == 0, result.stderr  # the packaged bert-tiny ran, not evil:run
    assert f"note: {planted} is not used" in result.stdout and f"profile bert-tiny from {REPO / 'profiles' / 'bert-tiny.toml'}" in result.stdout
    assert _stages(tmp_path / "o")["export"]["status"] == "done"
