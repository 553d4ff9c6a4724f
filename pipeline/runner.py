"""The stage runner: runs stages in order, caches unchanged ones, records each in the manifest. A stage's fingerprint is made
from exactly what it declares (pipeline/stage.py); it is cached when that matches its last success and its outputs are
still the files it wrote, else it reruns and says which part changed. Whatever ends a stage is recorded; records of
stages this run did not run are kept, those downstream of a stage that ran again marked `stale`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from pipeline import interrupts
from pipeline.codekeys import code_key
from pipeline.core import rss
from pipeline.core.errors import CapabilityMissing, PipelineError, StageFailed
from pipeline.core.fileio import external_data_file, sha256_file, sha256_json
from pipeline.core.manifest import USABLE, StageRecord
from pipeline.core.modelsource import package_version
from pipeline.core.text import printable
from pipeline.models.decoder import apply_derived
from pipeline.settings import Settings
from pipeline.stage import Context, Job, Stage, StageResult
from pipeline.summary import split_next_step


def downstream(stages: Sequence[Stage], stage: str) -> set[str]:
    """Every stage of `stages` that reads, directly or not, what `stage` writes (the graph of their inputs)."""
    found: set[str] = set()
    frontier = {stage}
    while frontier:
        frontier = {s.name for s in stages if frontier & s.upstream()} - found
        found |= frontier
    return found


class Runner:
    """Runs a plan of stages. `catalogue`: every stage there is (default: the plan's), in the manifest's order, whose graph
    earlier records go stale along; `part`: the sub-model this run builds (pipeline/parts.py), which begins each line."""

    def __init__(self, ctx: Context, console: Console, force: bool = False, strict: bool = False, catalogue: Sequence[Stage] = (),
                 part: str = ""):
        self.ctx, self.console, self.catalogue, self.force, self.strict = ctx, console, tuple(catalogue), force, strict
        self.label = f"{part:<8}" if part else ""
        self.stages: dict[str, Stage] = {}
        self.changed: list[StageRecord] = []  # stages whose outputs this run replaced or lost
        self.run_id = datetime.now(timezone.utc).isoformat(timespec="milliseconds")

    def run(self, stages: list[Stage], until: str | None = None) -> list[StageRecord]:
        self.stages = {s.name: s for s in stages}
        self.catalogue = self.catalogue or tuple(stages)
        self.ctx.manifest.order = tuple(s.name for s in self.catalogue)
        if until is not None and until not in self.stages:
            raise PipelineError(f"--until {until!r}: not a stage of this run; use one of {', '.join(self.stages)}")
        records: list[StageRecord] = []
        try:
            with Progress(
                SpinnerColumn(), TextColumn("[bold]{task.fields[stage]:<9}[/] {task.description}"), TimeElapsedColumn(),
                console=self.console, transient=True, disable=not self.console.is_terminal,
            ) as progress:
                failures = self._run_all(stages, until, progress, records)
        finally:
            self._mark_stale()
            self.print_summary()
        if failures:
            raise failures[0]
        return records

    def _run_all(self, stages: list[Stage], until: str | None, progress: Progress, records: list[StageRecord]) -> list[StageFailed]:
        """Run the stages in order; a failed check (StageFailed) stops only the stages that read it, directly or not (an INT4
        failure does not keep BF16 from running). Anything else stops the run at once."""
        failures: list[StageFailed] = []
        blocked: dict[str, str] = {}  # stage -> the failed stage it reads
        for stage in stages:
            if stage.name in blocked:
                self._print_line(stage, StageRecord(stage.name, "not run", 0.0, f"it reads stage {blocked[stage.name]}, which failed", run=self.run_id))
            else:
                try:
                    records.append(self._run_one(stage, progress))
                except StageFailed as err:
                    failures.append(err)
                    blocked.update(dict.fromkeys(downstream(self.catalogue, stage.name) - blocked.keys(), stage.name))
            if stage.name == until:
                break
        return failures

    def _run_one(self, stage: Stage, progress: Progress) -> StageRecord:
        task = progress.add_task("checking inputs", stage=stage.name)
        started = time.perf_counter()
        rss.release_freed_memory()
        rss.reset_peak()
        previous = self.ctx.manifest.get(stage.name)
        try:
            settings = Settings(stage.name, self.ctx.profile, self.ctx.options, stage.reads)
            key = self._key(stage, settings)
            fingerprint = sha256_json(key)
            if stage.cached and not self.force and self._reusable(previous, fingerprint):
                record = replace(previous, status="cached", seconds=_seconds(started), fingerprint=fingerprint, run=self.run_id,
                                 reason=f"inputs and settings unchanged since run {previous.run or 'before'}")
            else:
                job = Job(stage, settings, self.ctx, lambda text: progress.update(task, description=text))
                result = stage.run(job)
                record = self._record(stage, result, fingerprint if stage.cached else None, started, key)
                if record.status == "done" and stage.cached and not result.reason:
                    record.reason = self._why_rerun(previous, key)
        except PipelineError as err:
            if err.exit_code == 2 and not interrupts.interrupted():  # the user's input, refused: the stage made nothing, so
                self._print_line(stage, StageRecord(stage.name, "refused", _seconds(started), str(err), run=self.run_id))  # its record
                raise  # and files stay as they were; the line is printed, not recorded
            self._record_failure(stage, previous, err, started)
            raise
        except BaseException as err:
            self._record_failure(stage, previous, err, started)
            raise
        finally:
            progress.remove_task(task)
        record.peak_rss_mb = rss.peak_rss_mb()
        if previous is None or record.status == "failed" or record.output_sha256 != previous.output_sha256:
            self.changed.append(record)
        self.ctx.manifest.put(record)
        self.ctx.profile = apply_derived(self.ctx.profile, record.metrics.get("derived_inputs"))  # a decoder's cache inputs, from export
        self._print_line(stage, record)
        if record.status == "failed":
            raise CapabilityMissing(record.reason)
        return record

    def _record_failure(self, stage: Stage, previous: StageRecord | None, err: BaseException, started: float) -> None:
        """A stage that failed or was interrupted: recorded so, the files of its earlier success taken away."""
        status, reason = self._failure(err)
        failed = StageRecord(stage.name, status, _seconds(started), reason, run=self.run_id, peak_rss_mb=rss.peak_rss_mb())
        self._remove_outputs(previous)
        self.changed.append(failed)
        self.ctx.manifest.put(failed)
        self._print_line(stage, failed)

    def _key(self, stage: Stage, settings: Settings) -> dict[str, Any]:
        """The stage's declaration, resolved: settings, input files' sha256, its code's sha256, package versions."""
        return {
            "settings": settings.keys(),
            "inputs": {name: self._input_key(name) for name in stage.input_names(settings)},
            "code": code_key(stage.run.__module__),
            "packages": {name: package_version(name) for name in stage.packages},
        }

    def _input_key(self, name: str) -> Any:
        """An earlier stage's output as the fingerprint sees it: its sha256 (None when it is not there)."""
        stage, label = name.split(".", 1)
        record = self.ctx.manifest.get(stage)
        if record is None or record.status not in USABLE:
            return None
        labels = sorted(record.outputs) if label == "*" else [label]
        base = self.ctx.manifest.path.parent
        digests = {}
        for each in labels:
            path = base / record.outputs[each] if each in record.outputs else None
            if path is None or not path.is_file():
                digests[each] = None
            elif record.run == self.run_id and each in record.output_sha256:
                digests[each] = record.output_sha256[each]  # written or checked by this run
            else:
                digests[each] = sha256_file(path)
        return digests if label == "*" else digests[label]

    def _why_rerun(self, previous: StageRecord | None, key: dict[str, Any]) -> str:
        """Which part of the declaration changed since the stage's last run ("" for its first run)."""
        if previous is None:
            return ""
        changed = []
        for part, what in (("settings", "setting"), ("inputs", "input"), ("code", "code of"), ("packages", "package")):
            before, now = previous.key.get(part, {}), key.get(part, {})
            names = [name for name in sorted(before.keys() | now.keys()) if before.get(name) != now.get(name)]
            if part == "code" and names:  # one entry: an upgrade changes many modules at once
                changed.append(f"{what} {', '.join(names[:3])}" + (f" and {len(names) - 3} more modules" if len(names) > 3 else ""))
                continue
            changed += [f"{what} {describe_change(name, before.get(name), now.get(name)) if part in ('settings', 'packages') else name}"
                        for name in names]
        if changed and previous.key:
            return "rerun: " + "; ".join(changed) + " changed"
        if previous.status not in ("done", "cached"):
            return f"rerun: its last run was {previous.status}"
        if self.force:
            return "rerun: --force"
        return "rerun: its outputs were changed or removed since its last run" if previous.key else ""

    @staticmethod
    def _failure(err: BaseException) -> tuple[str, str]:
        if interrupts.interrupted() or isinstance(err, KeyboardInterrupt):
            return "interrupted", "interrupted (Ctrl-C) while the stage ran; run the build again to finish it"
        if isinstance(err, PipelineError):
            return "failed", str(err)
        return "failed", f"internal error: {type(err).__name__}: {err}"

    def _record(self, stage: Stage, result: StageResult, fingerprint: str | None, started: float, key: dict[str, Any]) -> StageRecord:
        base = self.ctx.manifest.path.parent
        outputs = {label: _relative(path, base) for label, path in result.outputs.items()}
        digests = {label: sha256_file(path) for label, path in result.outputs.items() if Path(path).is_file()}
        if not result.skipped:
            return StageRecord(stage.name, "done", _seconds(started), result.reason, outputs, result.metrics, fingerprint, self.run_id, digests,
                               key)
        if result.capability_missing and self.strict:
            return StageRecord(stage.name, "failed", _seconds(started), f"--strict: {result.reason}", outputs, result.metrics, run=self.run_id)
        # a skip is never cached: the missing capability may be there next time
        return StageRecord(stage.name, "skipped", _seconds(started), result.reason, outputs, result.metrics, run=self.run_id, output_sha256=digests)

    def _reusable(self, previous: StageRecord | None, fingerprint: str) -> bool:
        """The last record is a success with this fingerprint, and its outputs are the files it wrote."""
        if previous is None or previous.status not in ("done", "cached") or previous.fingerprint != fingerprint:
            return False
        base = self.ctx.manifest.path.parent
        if set(previous.output_sha256) != set(previous.outputs):
            return False  # written by a version that did not record them: redo once
        return all((base / relative).is_file() and sha256_file(base / relative) == previous.output_sha256[label]
                   for label, relative in previous.outputs.items())

    def _remove_outputs(self, previous: StageRecord | None) -> None:
        """A stage that fails or is interrupted takes away the files its earlier success wrote into the folder, unchanged since
        (a file edited by hand is the user's): the folder holds no model the manifest does not vouch for."""
        if previous is None or previous.status not in ("done", "cached"):
            return
        base = self.ctx.manifest.path.parent.resolve()
        for label, relative in previous.outputs.items():
            path = (base / relative).resolve()
            if path.is_relative_to(base) and path.is_file() and sha256_file(path) == previous.output_sha256.get(label):
                path.unlink()
                external_data_file(path).unlink(missing_ok=True)  # a model's weights go with it

    def _mark_stale(self) -> None:
        """Earlier runs' records downstream of a stage whose outputs this run changed (or lost) are out of date."""
        manifest = self.ctx.manifest
        for record in list(manifest.stages):
            if record.run == self.run_id or record.status == "stale":
                continue
            causes = [r for r in self.changed if record.name in downstream(self.catalogue, r.name)]
            if causes:
                cause = causes[0]
                manifest.put(replace(record, status="stale", reason=(
                    f"stage {cause.name} ran again ({cause.status}); this {record.status} result of run {record.run or 'before'} is out of "
                    f"date since run {self.run_id}: run build again with the flags that produce it")))

    def _print_line(self, stage: Stage | None, record: StageRecord) -> None:
        colour = {"done": "green", "cached": "cyan", "skipped": "yellow", "failed": "red", "interrupted": "red", "stale": "yellow", "refused": "red", "not run": "yellow"}[record.status]
        status = f"[{colour}]{record.status}[/]{' ' * (len('interrupted') - len(record.status))}"  # padded as seen, not as marked up
        if record.status in ("done", "cached"):  # its figures; a stage outside this run's plan has no key metric to read them
            detail = stage.key_metric(record.metrics) if stage else ""
        else:
            detail = record.reason.split(";")[0] if record.status == "stale" else split_next_step(record.reason)[0]  # a stale line: its cause
        earlier = record.run != self.run_id
        text = " ".join(part for part in (escape(printable(detail)), "(earlier run)" if earlier else "") if part)
        self.console.print(f"{self.label}{record.name:<9} {status} {record.seconds:7.2f}s  {text}", highlight=False, soft_wrap=True)
        if record.status == "done" and record.reason.startswith("rerun: ") and not earlier:
            self.console.print(f"{self.label}{'':<9} {printable(record.reason)}", highlight=False, markup=False, soft_wrap=True)

    def print_summary(self) -> None:
        """Under the lines of the stages this run ran: the manifest's records from earlier runs."""
        for record in self.ctx.manifest.stages:
            if record.run != self.run_id:
                self._print_line(self.stages.get(record.name), record)


def describe_change(name: str, before: Any, now: Any) -> str:
    """`name (A -> B)`, down to the keys that changed in a table (`dims.seq.max (64 -> 32)`); the
    values only where they fit in a short line, at most three keys named."""
    if isinstance(before, dict) and isinstance(now, dict):
        keys = [key for key in sorted(before.keys() | now.keys()) if before.get(key) != now.get(key)]
        parts = [describe_change(f"{name}.{key}", before.get(key), now.get(key)) for key in keys[:3]]
        return ", ".join(parts) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
    values = f" ({json.dumps(before)} -> {json.dumps(now)})"
    return name + (values if len(values) <= 80 else "")


def _seconds(started: float) -> float:
    return round(time.perf_counter() - started, 3)


def _relative(path: Path, base: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(base.resolve()))
    except ValueError:
        return str(Path(path).resolve())
