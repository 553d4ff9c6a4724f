"""Stage runner and manifest: caching by fingerprint, --force, failures and skips recorded, --strict."""

import json

import pytest
from rich.console import Console

from pipeline.core.errors import CapabilityMissing, InputError, StageFailed
from pipeline.core.manifest import Manifest
from pipeline.core.profiles import load_profile
from pipeline.runner import Runner
from pipeline.stage import Context, Stage, StageResult

SETTING_OF = {"export": "bench_iterations", "optimize": "bench_warmup", "fp16": "profile_iterations", "int8": "profile_warmup"}
READS_FROM = {"export": (), "optimize": ("export.out",), "fp16": ("optimize.out",), "int8": ("optimize.out",)}  # the stage graph


class CountingStage:
    """A stage that reads one setting of its own (a [build] field), writes it to a file and counts its runs."""

    def __init__(self, name="export"):
        self.name, self.runs, self.setting = name, 0, 1

    def stage(self) -> Stage:
        return Stage(self.name, self._run, reads=(f"build.{SETTING_OF[self.name]}",), inputs=READS_FROM[self.name],
                     key_metric=lambda m: f"runs={m['runs']}")

    def _run(self, job):
        self.runs += 1
        out = job.out / f"{self.name}.txt"
        out.write_text(str(getattr(job.settings.profile.build, SETTING_OF[self.name])))
        return StageResult({"out": out}, {"runs": self.runs})


def make_runner(tmp_path, *counting: CountingStage, **flags) -> Runner:
    """A runner on bert-tiny with each counting stage's setting in the profile; the counting stages are the catalogue."""
    manifest = Manifest.load_or_new(tmp_path / "manifest.json", "bert-tiny")
    profile = load_profile("bert-tiny")
    build = profile.build.model_copy(update={SETTING_OF[c.name]: c.setting for c in counting})
    ctx = Context(profile.model_copy(update={"build": build}), tmp_path, manifest)
    return Runner(ctx, Console(file=open(tmp_path / "console.txt", "a"), width=200), catalogue=[c.stage() for c in counting], **flags)


def test_unchanged_stage_is_cached_changed_or_forced_reruns(tmp_path):
    counting = CountingStage()
    assert make_runner(tmp_path, counting).run([counting.stage()])[0].status == "done"
    assert make_runner(tmp_path, counting).run([counting.stage()])[0].status == "cached"
    assert counting.runs == 1
    assert make_runner(tmp_path, counting, force=True).run([counting.stage()])[0].status == "done"
    counting.setting = 2
    assert make_runner(tmp_path, counting).run([counting.stage()])[0].status == "done"
    (tmp_path / "export.txt").unlink()
    assert make_runner(tmp_path, counting).run([counting.stage()])[0].status == "done"
    assert counting.runs == 4
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data["profile"] == "bert-tiny"
    (record,) = data["stages"]
    assert set(record) >= {"name", "status", "seconds", "reason", "outputs", "metrics"}
    assert record["outputs"] == {"out": "export.txt"} and record["metrics"] == {"runs": 4}


def test_until_stops_after_the_named_stage(tmp_path):
    first, second = CountingStage("export"), CountingStage("optimize")
    records = make_runner(tmp_path, first, second).run([first.stage(), second.stage()], until="export")
    assert [r.name for r in records] == ["export"] and second.runs == 0


def test_failed_stage_is_recorded_and_raised(tmp_path):
    def fail(job):
        raise StageFailed("export: max_abs_diff=1 > tolerance 1e-4")

    with pytest.raises(StageFailed):
        make_runner(tmp_path).run([Stage("export", fail)])
    (record,) = json.loads((tmp_path / "manifest.json").read_text())["stages"]
    assert record["status"] == "failed" and "max_abs_diff=1" in record["reason"]


def capability_stage() -> Stage:
    def run(job):
        return StageResult({}, skipped=True, reason="tensorrt is not importable", capability_missing=True)

    return Stage("build", run)


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


def test_an_edited_or_truncated_output_is_not_cached(tmp_path):
    counting = CountingStage()
    make_runner(tmp_path, counting).run([counting.stage()])
    (tmp_path / "export.txt").write_text("edited by hand")
    assert make_runner(tmp_path, counting).run([counting.stage()])[0].status == "done"
    (tmp_path / "export.txt").write_text("")  # truncated, as a kill during a rewrite leaves it
    assert make_runner(tmp_path, counting).run([counting.stage()])[0].status == "done"
    assert make_runner(tmp_path, counting).run([counting.stage()])[0].status == "cached"
    assert counting.runs == 3


def test_records_of_stages_not_in_this_run_are_kept_and_made_stale_only_by_a_change(tmp_path):
    export, optimize, fp16 = CountingStage("export"), CountingStage("optimize"), CountingStage("fp16")
    make_runner(tmp_path, export, optimize, fp16).run([export.stage(), optimize.stage(), fp16.stage()])
    make_runner(tmp_path, export, optimize, fp16).run([export.stage(), optimize.stage()])  # both cached: fp16 stays valid
    statuses = {s["name"]: s["status"] for s in json.loads((tmp_path / "manifest.json").read_text())["stages"]}
    assert statuses == {"export": "cached", "optimize": "cached", "fp16": "done"}
    optimize.setting = 2  # optimize writes another model: fp16, built from the old one, is out of date
    make_runner(tmp_path, export, optimize, fp16).run([export.stage(), optimize.stage()])
    fp16_record = next(s for s in json.loads((tmp_path / "manifest.json").read_text())["stages"] if s["name"] == "fp16")
    assert fp16_record["status"] == "stale" and "stage optimize ran again" in fp16_record["reason"]


def test_a_failure_makes_earlier_downstream_records_stale(tmp_path):
    export, optimize, int8 = CountingStage("export"), CountingStage("optimize"), CountingStage("int8")
    make_runner(tmp_path, export, optimize, int8).run([export.stage(), optimize.stage(), int8.stage()])

    def fail(job):
        raise StageFailed("optimize: the optimized model differs from its input")

    with pytest.raises(StageFailed):
        make_runner(tmp_path, export, int8).run([export.stage(), Stage("optimize", fail), int8.stage()])
    statuses = {s["name"]: s["status"] for s in json.loads((tmp_path / "manifest.json").read_text())["stages"]}
    assert statuses == {"export": "cached", "optimize": "failed", "int8": "stale"}
    stale = [line for line in (tmp_path / "console.txt").read_text().splitlines() if line.startswith("int8      stale")][-1]
    assert stale.endswith("s  stage optimize ran again (failed) (earlier run)")  # its cause, not four 250-character lines (issue 36)


def test_a_failed_check_stops_only_the_stages_that_read_it(tmp_path):
    """An INT4 failure kept BF16 from running: a stage failing its check (exit 1) lets the stages that do not read it
    run, the ones that do are not run, and the run still fails with the first failure."""
    export, optimize, fp16, int8 = (CountingStage(name) for name in ("export", "optimize", "fp16", "int8"))

    def fail(job):
        raise StageFailed("optimize: the optimized model differs from its input")

    runner = make_runner(tmp_path, export, optimize, fp16, int8)
    with pytest.raises(StageFailed, match="optimize: the optimized model differs"):
        runner.run([export.stage(), Stage("optimize", fail, inputs=("export.out",)), fp16.stage(), int8.stage()])
    assert (export.runs, fp16.runs, int8.runs) == (1, 0, 0)
    console = (tmp_path / "console.txt").read_text()
    assert "fp16      not run" in console and "it reads stage optimize, which failed" in console

    def fail_fp16(job):
        raise StageFailed("fp16: accuracy below the gate")

    with pytest.raises(StageFailed, match="fp16: accuracy below the gate"):
        make_runner(tmp_path, export, optimize, fp16, int8).run([export.stage(), optimize.stage(), Stage("fp16", fail_fp16), int8.stage()])
    assert int8.runs == 1  # int8 does not read fp16: it ran


def test_interrupt_and_bug_are_recorded(tmp_path):
    def interrupted(job):
        raise KeyboardInterrupt

    def bug(job):
        return {}["missing"]

    with pytest.raises(KeyboardInterrupt):
        make_runner(tmp_path).run([Stage("export", interrupted)])
    (record,) = json.loads((tmp_path / "manifest.json").read_text())["stages"]
    assert record["status"] == "interrupted"
    with pytest.raises(KeyError):
        make_runner(tmp_path).run([Stage("export", bug)])
    (record,) = json.loads((tmp_path / "manifest.json").read_text())["stages"]
    assert record["status"] == "failed" and record["reason"].startswith("internal error: KeyError")


def test_a_stage_that_fails_takes_away_the_files_of_its_earlier_success(tmp_path):
    """Issue 36: a failed INT8 stage left the previous model.int8.onnx beside a manifest saying failed."""
    counting = CountingStage()
    make_runner(tmp_path, counting).run([counting.stage()])
    kept = tmp_path / "kept.txt"
    kept.write_text("not a stage's output")

    def fail(job):
        raise StageFailed("export: accuracy below the gate")

    with pytest.raises(StageFailed):
        make_runner(tmp_path, counting).run([Stage("export", fail)])
    assert not (tmp_path / "export.txt").exists() and kept.exists()
    (record,) = json.loads((tmp_path / "manifest.json").read_text())["stages"]
    assert record["status"] == "failed" and record["outputs"] == {}


def test_a_failed_stage_leaves_a_file_edited_since_and_a_skipped_stages_input(tmp_path):
    """Only the files the stage wrote, unchanged since, go: a hand-edited output, or the user's ONNX file a skipped
    export recorded as its output, stay."""
    counting = CountingStage()
    make_runner(tmp_path, counting).run([counting.stage()])
    (tmp_path / "export.txt").write_text("edited by hand")
    users = tmp_path / "users.onnx"
    users.write_text("the user's model")

    def skip(job):
        return StageResult({"onnx": users}, skipped=True, reason=f"starting from {users}")

    def fail(job):
        raise StageFailed("boom")

    with pytest.raises(StageFailed):
        make_runner(tmp_path, counting).run([Stage("export", fail)])
    assert (tmp_path / "export.txt").read_text() == "edited by hand"
    make_runner(tmp_path).run([Stage("export", skip)])
    with pytest.raises(StageFailed):
        make_runner(tmp_path).run([Stage("export", fail)])
    assert users.read_text() == "the user's model"


def test_the_users_input_refused_by_a_stage_leaves_its_record_and_files_as_they_were(tmp_path):
    """A new user's typo in a profile (bad input, exit 2) took away the previous good export and made every later
    stage stale: nothing ran, so nothing of the earlier build changes."""
    export, optimize = CountingStage("export"), CountingStage("optimize")
    make_runner(tmp_path, export, optimize).run([export.stage(), optimize.stage()])
    before = (tmp_path / "manifest.json").read_text()

    def refuse(job):
        raise InputError("model.factory 'mynets:make_cnnn': mynets has no function 'make_cnnn'")

    with pytest.raises(InputError):
        make_runner(tmp_path, export, optimize).run([Stage("export", refuse), optimize.stage()])
    assert (tmp_path / "manifest.json").read_text() == before and (tmp_path / "export.txt").exists()


def test_a_stage_cannot_read_a_failed_or_stale_stage(tmp_path):
    def fail(job):
        raise StageFailed("bad")

    with pytest.raises(StageFailed):
        make_runner(tmp_path).run([Stage("export", fail)])
    runner = make_runner(tmp_path)
    with pytest.raises(InputError, match="stage 'export' failed in"):
        runner.ctx.input("export", "onnx")


def test_manifest_writes_merge_records_written_meanwhile(tmp_path):
    from pipeline.core.manifest import StageRecord

    first = Manifest.load_or_new(tmp_path / "manifest.json", "p")
    second = Manifest.load_or_new(tmp_path / "manifest.json", "p")
    first.put(StageRecord("fp16", "done", 1.0))
    second.put(StageRecord("int8", "done", 1.0))
    names = [s["name"] for s in json.loads((tmp_path / "manifest.json").read_text())["stages"]]
    assert names == ["fp16", "int8"]


def test_a_stage_that_runs_again_says_why(tmp_path):
    counting = CountingStage()
    assert make_runner(tmp_path, counting).run([counting.stage()])[0].reason == ""
    assert make_runner(tmp_path, counting, force=True).run([counting.stage()])[0].reason == "rerun: --force"
    counting.setting = 2
    assert make_runner(tmp_path, counting).run([counting.stage()])[0].reason == "rerun: setting build.bench_iterations (1 -> 2) changed"
    (tmp_path / "export.txt").write_text("edited")
    assert make_runner(tmp_path, counting).run([counting.stage()])[0].reason == "rerun: its outputs were changed or removed since its last run"
    assert "          rerun: setting build.bench_iterations (1 -> 2) changed" in (tmp_path / "console.txt").read_text()
    record = json.loads((tmp_path / "manifest.json").read_text())["stages"][0]
    assert record["key"]["settings"] == {"build.bench_iterations": 2} and set(record["key"]) == {"settings", "inputs", "code", "packages"}


def test_a_new_version_of_a_declared_package_reruns_the_stage(tmp_path, monkeypatch):
    """The TensorRT version is part of the build's key: a new TensorRT rebuilds the engines."""
    import pipeline.runner
    from pipeline.stages.build import STAGE as BUILD

    assert "tensorrt" in BUILD.packages
    runs = []

    def run(job):
        runs.append(1)
        (tmp_path / "engine").write_text("plan")
        return StageResult({"engine": tmp_path / "engine"})

    stage = Stage("build", run, packages=("tensorrt",))
    monkeypatch.setattr(pipeline.runner, "package_version", lambda name: "10.8.0.43")
    make_runner(tmp_path).run([stage])
    assert make_runner(tmp_path).run([stage])[0].status == "cached"
    monkeypatch.setattr(pipeline.runner, "package_version", lambda name: "10.13.0.35")
    (record,) = make_runner(tmp_path).run([stage])
    assert record.status == "done" and record.reason == 'rerun: package tensorrt ("10.8.0.43" -> "10.13.0.35") changed' and len(runs) == 2


def test_a_changed_table_setting_names_the_keys_that_changed():
    from pipeline.runner import describe_change

    dims = {"batch": {"min": 1, "opt": 4, "max": 8}, "seq": {"min": 1, "opt": 32, "max": 64}}
    assert describe_change("dims", dims, {**dims, "seq": {"min": 1, "opt": 32, "max": 32}}) == "dims.seq.max (64 -> 32)"
    assert describe_change("export", {"opset": 17}, {"opset": 18, "exporter": "dynamo"}) == 'export.exporter (null -> "dynamo"), export.opset (17 -> 18)'
    many = {f"k{i}": i for i in range(5)}
    assert describe_change("t", many, {key: -1 for key in many}) == "t.k0 (0 -> -1), t.k1 (1 -> -1), t.k2 (2 -> -1) and 2 more"
    assert describe_change("quant.preset", "trt-fusion", "x" * 90) == "quant.preset"


def test_an_earlier_runs_stage_outside_this_plan_shows_no_reason_as_its_figures(tmp_path):
    """A done record from an earlier run, of a stage this run does not plan: its line says done and
    (earlier run), never its old rerun reason in place of figures nobody can read here."""
    export, fp16 = CountingStage("export"), CountingStage("fp16")
    make_runner(tmp_path, export, fp16).run([export.stage(), fp16.stage()])
    fp16.setting = 2
    make_runner(tmp_path, export, fp16).run([export.stage(), fp16.stage()])
    (tmp_path / "console.txt").write_text("")
    make_runner(tmp_path, export, fp16).run([export.stage()])
    lines = [line for line in (tmp_path / "console.txt").read_text().splitlines() if line]
    assert lines[0].startswith("export    cached") and "runs=1" in lines[0]
    assert lines[1].startswith("fp16      done") and lines[1].endswith("s  (earlier run)") and len(lines) == 2, lines


class AllocatingStage(CountingStage):
    """A counting stage that holds `megabytes` of memory while it runs."""

    def __init__(self, name, megabytes):
        super().__init__(name)
        self.megabytes = megabytes

    def _run(self, job):
        import numpy as np

        held = np.ones(self.megabytes * 1_000_000 // 8)
        result = super()._run(job)
        del held
        return result


def test_each_stage_records_its_own_peak_memory(tmp_path):
    """Issue 33: peak resident memory per stage, in the manifest beside its seconds; on Linux each stage's peak is its
    own (a small stage after a 400 MB one is not charged the 400 MB)."""
    from pipeline.core import rss

    big, small = AllocatingStage("export", 400), AllocatingStage("optimize", 1)
    make_runner(tmp_path, big, small).run([big.stage(), small.stage()])
    records = {s["name"]: s for s in json.loads((tmp_path / "manifest.json").read_text())["stages"]}
    assert records["export"]["peak_rss_mb"] >= 400
    if rss.reset_peak():
        assert records["optimize"]["peak_rss_mb"] < records["export"]["peak_rss_mb"] - 300
