"""The stage runner: runs stages in order, caches unchanged ones, records each in the manifest.

A stage is cached when its fingerprint (settings + hashes of its input files) equals the
one recorded by its last successful run and its outputs still exist; `force` reruns it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline.errors import CapabilityMissing, PipelineError
from pipeline.fileio import sha256_json
from pipeline.manifest import Manifest, StageRecord
from pipeline.profiles import Profile

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

    def input(self, stage: str, label: str) -> Path:
        path = self.manifest.output_path(stage, label)
        if path is None or not path.exists():
            raise PipelineError(f"stage {stage!r} has no {label!r} output in {self.manifest.path}; run it first")
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

    def run(self, stages: list[Stage], until: str | None = None) -> list[StageRecord]:
        self.stages = {s.name: s for s in stages}
        if until is not None and until not in self.stages:
            raise PipelineError(f"--until {until!r}: not a stage of this run; use one of {', '.join(self.stages)}")
        records = []
        with Progress(
            SpinnerColumn(), TextColumn("[bold]{task.fields[stage]:<9}[/] {task.description}"), TimeElapsedColumn(),
            console=self.console, transient=True,
        ) as progress:
            for stage in stages:
                records.append(self._run_one(stage, progress))
                if stage.name == until:
                    break
        self.print_summary(records)
        return records

    def _run_one(self, stage: Stage, progress: Progress) -> StageRecord:
        task = progress.add_task("checking inputs", stage=stage.name)
        started = time.perf_counter()
        try:
            fingerprint = sha256_json(stage.fingerprint(self.ctx))
            previous = self.ctx.manifest.get(stage.name)
            if not self.force and self._reusable(previous, fingerprint):
                record = StageRecord(stage.name, "cached", _seconds(started), previous.reason, previous.outputs, previous.metrics, fingerprint)
            else:
                result = stage.run(self.ctx, lambda text: progress.update(task, description=text))
                record = self._record(stage, result, fingerprint, started)
        except PipelineError as err:
            self.ctx.manifest.put(StageRecord(stage.name, "failed", _seconds(started), str(err)))
            raise
        finally:
            progress.remove_task(task)
        self.ctx.manifest.put(record)
        self._print_line(stage, record)
        if record.status == "failed":
            raise CapabilityMissing(record.reason)
        return record

    def _record(self, stage: Stage, result: StageResult, fingerprint: str, started: float) -> StageRecord:
        outputs = {label: _relative(path, self.ctx.manifest.path.parent) for label, path in result.outputs.items()}
        if not result.skipped:
            return StageRecord(stage.name, "done", _seconds(started), result.reason, outputs, result.metrics, fingerprint)
        if result.capability_missing and self.strict:
            return StageRecord(stage.name, "failed", _seconds(started), f"--strict: {result.reason}", outputs, result.metrics)
        # a skip is never cached: the missing capability may be there next time
        return StageRecord(stage.name, "skipped", _seconds(started), result.reason, outputs, result.metrics)

    def _reusable(self, previous: StageRecord | None, fingerprint: str) -> bool:
        if previous is None or previous.status not in ("done", "cached") or previous.fingerprint != fingerprint:
            return False
        return all((self.ctx.manifest.path.parent / p).exists() for p in previous.outputs.values())

    def _print_line(self, stage: Stage, record: StageRecord) -> None:
        mark = {"done": "[green]done[/]", "cached": "[cyan]cached[/]", "skipped": "[yellow]skipped[/]", "failed": "[red]failed[/]"}
        detail = stage.key_metric(record.metrics) if record.status in ("done", "cached") else record.reason
        self.console.print(f"{stage.name:<9} {mark[record.status]:<20} {record.seconds:7.2f}s  {detail}", highlight=False)

    def print_summary(self, records: list[StageRecord]) -> None:
        table = Table(title=f"{self.ctx.profile.name} -> {self.ctx.manifest.path}", title_justify="left")
        for column in ("stage", "status", "seconds", "key metric", "output"):
            table.add_column(column, justify="right" if column == "seconds" else "left")
        for record in records:
            stage = self.stages.get(record.name)
            metric = stage.key_metric(record.metrics) if stage and record.status in ("done", "cached") else record.reason
            output = ", ".join(str(self.ctx.manifest.path.parent / p) for p in record.outputs.values())
            table.add_row(record.name, record.status, f"{record.seconds:.2f}", metric, output)
        self.console.print(table)


def _seconds(started: float) -> float:
    return round(time.perf_counter() - started, 3)


def _relative(path: Path, base: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(base.resolve()))
    except ValueError:
        return str(Path(path).resolve())
