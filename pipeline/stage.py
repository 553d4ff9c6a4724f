"""What a stage declares (`Stage`, `Input`: what decides its result, on which the runner keys its cache) and what its run
receives (`Job`) and returns (`StageResult`). Its `inputs` are also the stage graph: a stage is out of date when one of
them ran again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.fileio import sha256_file
from pipeline.core.manifest import USABLE, Manifest
from pipeline.core.profiles import Profile
from pipeline.settings import Options, Settings, UndeclaredSetting

Status = Callable[[str], None]


@dataclass
class StageResult:
    outputs: dict[str, Path]
    metrics: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False
    reason: str = ""
    capability_missing: bool = False


@dataclass(frozen=True)
class Input:
    """An earlier stage's output: "stage.label" ("stage.*": every output of that stage), read only when
    `when` holds for the reading stage's settings (the build reads fp16.onnx only when FP16 is built)."""

    name: str
    when: Callable[[Settings], bool] | None = None

    @property
    def stage(self) -> str:
        return self.name.split(".", 1)[0]


@dataclass(frozen=True)
class Stage:
    """A stage declares what decides its result; the runner keys its cache on exactly that."""

    name: str
    run: Callable[[Job], StageResult]  # its entry: its module and what that imports of ours are the stage's code
    reads: tuple[str, ...] = ()  # the settings it reads (pipeline/settings.py); its `Settings` holds only these
    inputs: tuple[str | Input, ...] = ()  # the earlier stages' outputs it reads ("stage.label", or an `Input`)
    packages: tuple[str, ...] = ()  # distributions whose version decides its result
    cached: bool = True  # False for stages that depend on this machine or are cheap: they always run
    key_metric: Callable[[dict[str, Any]], str] = lambda metrics: ""

    def declared_inputs(self) -> tuple[Input, ...]:
        return tuple(i if isinstance(i, Input) else Input(i) for i in self.inputs)

    def input_names(self, settings: Settings) -> tuple[str, ...]:
        """The inputs it reads with these settings."""
        return tuple(i.name for i in self.declared_inputs() if i.when is None or i.when(settings))

    def upstream(self) -> set[str]:
        """The stages whose outputs it may read: its edges in the stage graph."""
        return {i.stage for i in self.declared_inputs()}


@dataclass
class Context:
    """What the runner holds for one build: the profile, the command line's options, the output folder,
    the manifest. Stages never see the profile or the options: each gets its declared `Settings`."""

    profile: Profile
    out: Path
    manifest: Manifest
    options: Options = field(default_factory=Options)
    cache: dict[Any, Any] = field(default_factory=dict)  # results stages share within one build (e.g. FP32 outputs)
    rerun_hint: Callable[[], str] | None = None  # the command that runs this build where TensorRT is (for a skipped stage's reason)

    def input(self, stage: str, label: str) -> Path:
        record = self.manifest.get(stage)
        path = self.manifest.output_path(stage, label)
        if record is None or record.status not in USABLE or path is None or not path.exists():
            states = {"failed": "failed", "interrupted": "was interrupted", "stale": "is out of date (stale)"}
            state = states.get(record.status, f"has no {label!r} output") if record is not None else "has not run"
            raise InputError(f"stage {stage!r} {state} in {self.manifest.path}; run it first (python -m pipeline build ... --until {stage})")
        return path


@dataclass(frozen=True)
class Job:
    """What a stage's run receives: its settings, the files it declared, its output folder."""

    stage: Stage
    settings: Settings
    _ctx: Context
    status: Status

    @property
    def out(self) -> Path:
        return self._ctx.out

    @property
    def cache(self) -> dict[Any, Any]:
        return self._ctx.cache

    def rerun_hint(self) -> str:
        """The command that runs this build on a machine with TensorRT (for a skipped stage's reason)."""
        return self._ctx.rerun_hint() if self._ctx.rerun_hint else "python -m pipeline build ... --strict"

    def status_of(self, stage: str) -> str | None:
        """How an earlier stage ended (done, cached, skipped, failed, ...), None when it has not run."""
        record = self._ctx.manifest.get(stage)
        return record.status if record else None

    def input(self, stage: str, label: str) -> Path:
        """An earlier stage's output this stage declared (reading one it did not declare is a bug)."""
        declared = self.stage.input_names(self.settings)
        if f"{stage}.{label}" not in declared and f"{stage}.*" not in declared:
            raise UndeclaredSetting(f"stage {self.stage.name!r} read {stage}.{label}, which it does not declare in its inputs")
        return self._ctx.input(stage, label)

    def input_sha256(self, stage: str, label: str) -> str:
        """The recorded sha256 of a declared input (what the fingerprint holds), without hashing it again."""
        path = self.input(stage, label)
        return self._ctx.manifest.get(stage).output_sha256.get(label) or sha256_file(path)

    def outputs_of(self, stage: str) -> list[str]:
        """The labels an earlier, usable stage recorded (e.g. which engines the build wrote)."""
        record = self._ctx.manifest.get(stage)
        if f"{stage}.*" not in self.stage.input_names(self.settings):
            raise UndeclaredSetting(f"stage {self.stage.name!r} read {stage}'s outputs, which it does not declare as {stage}.*")
        return list(record.outputs) if record is not None and record.status in ("done", "cached") else []
