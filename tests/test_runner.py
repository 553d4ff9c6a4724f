"""Stage runner and manifest: caching by fingerprint, --force, failures and skips recorded, --strict."""

import json

import pytest
from rich.console import Console

from pipeline.errors import CapabilityMissing, InputError, StageFailed
from pipeline.manifest import Manifest
from pipeline.profiles import load_profile
from pipeline.runner import Context, Runner, Stage, StageResult


class CountingStage:
    """A stage that writes one file from a setting and counts its runs."""

    def __init__(self, name="export"):
        self.name, self.runs, self.setting = name, 0, "a"

    def stage(self) -> Stage:
        return Stage(self.name, lambda ctx: {"setting": self.setting}, self._run, key_metric=lambda m: f"runs={m['runs']}")

    def _run(self, ctx, status):
        self.runs += 1
        out = ctx.out / f"{self.name}.txt"
        out.write_text(self.setting)
        return StageResult({"out": out}, {"runs": self.runs})


def make_runner(tmp_path, **flags) -> Runner:
    manifest = Manifest.load_or_new(tmp_path / "manifest.json", "bert-tiny")
    ctx = Context(load_profile("bert-tiny"), tmp_path, manifest)
    return Runner(ctx, Console(file=open(tmp_path / "console.txt", "a"), width=200), **flags)


def test_unchanged_stage_is_cached_changed_or_forced_reruns(tmp_path):
    counting = CountingStage()
    assert make_runner(tmp_path).run([counting.stage()])[0].status == "done"
    assert make_runner(tmp_path).run([counting.stage()])[0].status == "cached"
    assert counting.runs == 1
    assert make_runner(tmp_path, force=True).run([counting.stage()])[0].status == "done"
    counting.setting = "b"
    assert make_runner(tmp_path).run([counting.stage()])[0].status == "done"
    (tmp_path / "export.txt").unlink()
    assert make_runner(tmp_path).run([counting.stage()])[0].status == "done"
    assert counting.runs == 4
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data["profile"] == "bert-tiny"
    (record,) = data["stages"]
    assert set(record) >= {"name", "status", "seconds", "reason", "outputs", "metrics"}
    assert record["outputs"] == {"out": "export.txt"} and record["metrics"] == {"runs": 4}


def test_until_stops_after_the_named_stage(tmp_path):
    first, second = CountingStage("export"), CountingStage("optimize")
    records = make_runner(tmp_path).run([first.stage(), second.stage()], until="export")
    assert [r.name for r in records] == ["export"] and second.runs == 0


def test_failed_stage_is_recorded_and_raised(tmp_path):
    def fail(ctx, status):
        raise StageFailed("export: max_abs_diff=1 > tolerance 1e-4")

    with pytest.raises(StageFailed):
        make_runner(tmp_path).run([Stage("export", lambda ctx: {}, fail)])
    (record,) = json.loads((tmp_path / "manifest.json").read_text())["stages"]
    assert record["status"] == "failed" and "max_abs_diff=1" in record["reason"]


def capability_stage() -> Stage:
    def run(ctx, status):
        return StageResult({}, skipped=True, reason="tensorrt is not importable", capability_missing=True)

    return Stage("build", lambda ctx: {}, run)


def test_missing_capability_is_skipped_or_fails_with_strict(tmp_path):
    (record,) = make_runner(tmp_path).run([capability_stage()])
    assert record.status == "skipped" and record.reason == "tensorrt is not importable"
    with pytest.raises(CapabilityMissing, match="--strict: tensorrt is not importable") as info:
        make_runner(tmp_path, strict=True).run([capability_stage()])
    assert info.value.exit_code == 3
    (saved,) = json.loads((tmp_path / "manifest.json").read_text())["stages"]
    assert saved["status"] == "failed"


def test_corrupt_manifest_is_a_clear_input_error(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(InputError, match="not a manifest this version wrote"):
        Manifest.load_or_new(tmp_path / "manifest.json", "x")
