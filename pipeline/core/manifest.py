"""artifacts/<profile>/manifest.json: the record of each stage, the only channel between stages. Output paths are relative
to its folder (which can be moved or mounted); each record keeps the run that wrote it and its outputs' sha256, so a later
run tells a cached output from an edited one. Records a run did not touch are kept, or marked `stale` when their inputs changed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from pipeline.core.errors import InputError
from pipeline.core.fileio import describe_os_error, write_json

PARTS_KEY = "parts"  # a top-level manifest (pipeline/parts.py): {part: its build folder}, no stages of its own
Status = Literal["done", "cached", "skipped", "failed", "interrupted", "stale"]
USABLE = ("done", "cached", "skipped")


@dataclass
class StageRecord:
    name: str
    status: Status
    seconds: float
    reason: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    fingerprint: str | None = None
    run: str = ""  # when the run that wrote this record started (UTC, ISO 8601)
    output_sha256: dict[str, str] = field(default_factory=dict)
    key: dict[str, Any] = field(default_factory=dict)  # what the fingerprint was made of (settings, inputs, code), to say what changed
    peak_rss_mb: float | None = None  # the process's peak resident memory while the stage ran (pipeline/core/rss.py)


@dataclass
class Manifest:
    path: Path
    profile: str
    stages: list[StageRecord] = field(default_factory=list)
    profile_source: str | None = None  # the profile's file, for the commands that read the folder (None: a packaged profile)
    order: tuple[str, ...] = ()  # the stages in pipeline order (the runner's); records are kept in it

    @classmethod
    def load_or_new(cls, path: Path, profile: str, profile_source: str | None = None) -> Manifest:
        if not path.exists():
            return cls(path, profile, profile_source=profile_source)
        found, stages, recorded = _read(path, profile)
        return cls(path, found, stages, profile_source or recorded)

    @property
    def profile_argument(self) -> str:
        """What `--profile` takes to name this build's profile: its file, or a packaged profile's name."""
        return self.profile_source or self.profile

    def get(self, name: str) -> StageRecord | None:
        return next((s for s in self.stages if s.name == name), None)

    def put(self, record: StageRecord) -> None:
        """Replace the stage's record (in pipeline order) and write the file atomically, keeping records others wrote since."""
        if self.path.exists():
            _, self.stages, _ = _read(self.path, self.profile)
        self.stages = [s for s in self.stages if s.name != record.name] + [record]
        order = {name: i for i, name in enumerate(self.order)}
        self.stages.sort(key=lambda s: order.get(s.name, len(order)))
        self.save()

    def output_path(self, stage: str, label: str) -> Path | None:
        record = self.get(stage)
        if record is None or label not in record.outputs:
            return None
        return self.path.parent / record.outputs[label]

    def save(self) -> None:
        write_json(self.path, {"profile": self.profile, "profile_source": self.profile_source, "stages": [asdict(s) for s in self.stages]})


def _read(path: Path, profile: str) -> tuple[str, list[StageRecord], str | None]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and PARTS_KEY in data:
            raise InputError(parts_folder_message(path.parent, data[PARTS_KEY]))
        known = {f.name for f in fields(StageRecord)}
        stages = [StageRecord(**{k: v for k, v in s.items() if k in known}) for s in data["stages"]]
        return data.get("profile", profile), stages, data.get("profile_source")
    except OSError as err:
        raise InputError(describe_os_error(err, path, writing=False)) from err
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as err:
        raise InputError(f"{path}: not a manifest this version wrote ({type(err).__name__}: {err}); delete it or pass another --out") from err


def parts_folder_message(folder: Path, parts: dict[str, str]) -> str:
    """The line for a command given the top folder of a build of several models, where one model's folder is needed."""
    named = ", ".join(f"{part} {folder / relative}" for part, relative in parts.items())
    return f"{folder} holds a build of several models, each in a build folder of its own ({named}); pass one of those folders (to build, another --out)"
