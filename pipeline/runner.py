"""The stage runner: runs stages in order, caches unchanged ones, records each in the manifest.

A stage is cached when its fingerprint (settings + hashes of its input files) equals the
one recorded by its last successful run and its outputs are still the files it wrote (same
sha256); `force` reruns it. Whatever ends a stage is recorded: `done`, `skipped`, `failed`
(a check, bad input or a bug) or `interrupted` (Ctrl-C). Records of stages this run did not
run are kept; those downstream of a stage that ran again are marked `stale`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline import interrupts
from pipeline.core.errors import CapabilityMissing, InputError, PipelineError
from pipeline.core.fileio import sha256_file, sha256_json
from pipeline.core.manifest import USABLE, Manifest, StageRecord, downstream
from pipeline.core.profiles import Profile
from pipeline.core.text import printable
from pipeline.models.decoder import apply_derived

Status = Callable[[str], None]


@dataclass
class StageResult:
    outputs: dict[str, Path]
    metrics: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False
    reason: str = ""
    capability_missing: bool = False


@dataclass
class Context:
    """What every stage sees: the profile, the output folder, the manifest, the run's options."""

    profile: Profile
    out: Path
    manifest: Manifest
    options: dict[str, Any] = field(default_factory=dict)
    cache: dict[Any, Any] = field(default_factory=dict)  # results stages share within one build (e.g. FP32 outputs)

    def input(self, stage: str, label: str) -> Path:
        record = self.manifest.get(stage)
        path = self.manifest.output_path(stage, label)
        if record is None or record.status not in USABLE or path is None or not path.exists():
            states = {"failed": "failed", "interrupted": "was interrupted", "stale": "is out of date (stale)"}
            state = states.get(record.status, f"has no {label!r} output") if record is not None else "has not run"
            raise InputError(f"stage {stage!r} {state} in {self.manifest.path}; run it first (python -m pipeline build ... --until {stage})")
        return path


@dataclass(frozen=True)
class Stage:
    name: str
    fingerprint: Callable[[Context], dict[str, Any]]
    run: Callable[[Context, Status], StageResult]
    key_metric: Callable[[dict[str, Any]], str] = lambda metrics: ""


class Runner:
    def __init__(self, ctx: Context, console: Console, force: bool = False, strict: bool = False):
        self.ctx, self.console, self.force, self.strict = ctx, console, force, strict
        self.stages: dict[str, Stage] = {}
        self.changed: list[StageRecord] = []  # stages whose outputs this run replaced or lost
        self.run_id = datetime.now(timezone.utc).isoformat(timespec="milliseconds")

    def run(self, stages: list[Stage], until: str | None = None) -> list[StageRecord]:
        self.stages = {s.name: s for s in stages}
        if until is not None and until not in self.stages:
            raise PipelineError(f"--until {until!r}: not a stage of this run; use one of {', '.join(self.stages)}")
        records: list[StageRecord] = []
        try:
            with Progress(
                SpinnerColumn(), TextColumn("[bold]{task.fields[stage]:<9}[/] {task.description}"), TimeElapsedColumn(),
                console=self.console, transient=True,
            ) as progress:
                for stage in stages:
                    records.append(self._run_one(stage, progress))
                    if stage.name == until:
                        break
        finally:
            self._mark_stale()
            self.print_summary(records)
        return records

    def _run_one(self, stage: Stage, progress: Progress) -> StageRecord:
        task = progress.add_task("checking inputs", stage=stage.name)
        started = time.perf_counter()
        try:
            fingerprint = sha256_json(stage.fingerprint(self.ctx))
            previous = self.ctx.manifest.get(stage.name)
            if not self.force and self._reusable(previous, fingerprint):
                record = replace(previous, status="cached", seconds=_seconds(started), fingerprint=fingerprint, run=self.run_id,
                                 reason=f"inputs and settings unchanged since run {previous.run or 'before'}")
            else:
                result = stage.run(self.ctx, lambda text: progress.update(task, description=text))
                record = self._record(stage, result, fingerprint, started)
        except BaseException as err:
            status, reason = self._failure(err)
            failed = StageRecord(stage.name, status, _seconds(started), reason, run=self.run_id)
            self.changed.append(failed)
            self.ctx.manifest.put(failed)
            self._print_line(stage, failed)
            raise
        finally:
            progress.remove_task(task)
        if previous is None or record.status == "failed" or record.output_sha256 != previous.output_sha256:
            self.changed.append(record)
        self.ctx.manifest.put(record)
        self.ctx.profile = apply_derived(self.ctx.profile, record.metrics.get("derived_inputs"))  # a decoder's cache inputs, from export
        self._print_line(stage, record)
        if record.status == "failed":
            raise CapabilityMissing(record.reason)
        return record

    @staticmethod
    def _failure(err: BaseException) -> tuple[str, str]:
        if interrupts.interrupted() or isinstance(err, KeyboardInterrupt):
            return "interrupted", "interrupted (Ctrl-C) while the stage ran; run the build again to finish it"
        if isinstance(err, PipelineError):
            return "failed", str(err)
        return "failed", f"internal error: {type(err).__name__}: {err}"

    def _record(self, stage: Stage, result: StageResult, fingerprint: str, started: float) -> StageRecord:
        base = self.ctx.manifest.path.parent
        outputs = {label: _relative(path, base) for label, path in result.outputs.items()}
        digests = {label: sha256_file(path) for label, path in result.outputs.items() if Path(path).is_file()}
        if not result.skipped:
            return StageRecord(stage.name, "done", _seconds(started), result.reason, outputs, result.metrics, fingerprint, self.run_id, digests)
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

    def _mark_stale(self) -> None:
        """Earlier runs' records downstream of a stage whose outputs this run changed (or lost) are out of date."""
        manifest = self.ctx.manifest
        for record in list(manifest.stages):
            if record.run == self.run_id or record.status == "stale":
                continue
            causes = [r for r in self.changed if record.name in downstream(r.name)]
            if causes:
                cause = causes[0]
                manifest.put(replace(record, status="stale", reason=(
                    f"from run {record.run or 'before'}; stage {cause.name} ran again in run {self.run_id} ({cause.status}), "
                    f"so this {record.status} result is out of date: run build again with the flags that produce it")))

    def _print_line(self, stage: Stage, record: StageRecord) -> None:
        mark = {"done": "[green]done[/]", "cached": "[cyan]cached[/]", "skipped": "[yellow]skipped[/]", "failed": "[red]failed[/]",
                "interrupted": "[red]interrupted[/]", "stale": "[yellow]stale[/]"}
        detail = stage.key_metric(record.metrics) if record.status in ("done", "cached") else record.reason
        self.console.print(f"{stage.name:<9} {mark[record.status]:<20} {record.seconds:7.2f}s  {printable(detail)}", highlight=False)

    def print_summary(self, records: list[StageRecord]) -> None:
        table = Table(title=f"{self.ctx.profile.name} -> {self.ctx.manifest.path}", title_justify="left")
        for column in ("stage", "status", "seconds", "key metric", "output"):
            table.add_column(column, justify="right" if column == "seconds" else "left")
        shown = {r.name for r in records}
        others = [r for r in self.ctx.manifest.stages if r.name not in shown]
        for record in [*records, *others]:
            stage = self.stages.get(record.name)
            metric = stage.key_metric(record.metrics) if stage and record.status in ("done", "cached") else record.reason
            output = ", ".join(str(self.ctx.manifest.path.parent / p) for p in record.outputs.values())
            status = record.status if record.name in shown else f"{record.status} (earlier run)"
            table.add_row(record.name, status, f"{record.seconds:.2f}", printable(metric), printable(output))
        self.console.print(table)


def _seconds(started: float) -> float:
    return round(time.perf_counter() - started, 3)


def _relative(path: Path, base: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(base.resolve()))
    except ValueError:
        return str(Path(path).resolve())
