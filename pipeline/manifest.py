"""artifacts/<profile>/manifest.json: the record of each stage, the only channel between stages.

Output paths are stored relative to the manifest's folder, so an artifacts folder can be
moved or mounted (Docker) and stay valid.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.errors import InputError
from pipeline.fileio import write_json

Status = Literal["done", "cached", "skipped", "failed"]
STAGES = ("export", "optimize", "fp16", "int8", "build", "report", "diff", "bench")


@dataclass
class StageRecord:
    name: str
    status: Status
    seconds: float
    reason: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    fingerprint: str | None = None


@dataclass
class Manifest:
    path: Path
    profile: str
    stages: list[StageRecord] = field(default_factory=list)

    @classmethod
    def load_or_new(cls, path: Path, profile: str) -> Manifest:
        if not path.exists():
            return cls(path, profile)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            stages = [StageRecord(**s) for s in data["stages"]]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise InputError(f"{path}: not a manifest this version wrote ({err}); delete it or pass another --out") from err
        return cls(path, data.get("profile", profile), stages)

    def get(self, name: str) -> StageRecord | None:
        return next((s for s in self.stages if s.name == name), None)

    def put(self, record: StageRecord) -> None:
        """Replace the stage's record (keeping pipeline order) and write the file atomically."""
        self.stages = [s for s in self.stages if s.name != record.name] + [record]
        order = {name: i for i, name in enumerate(STAGES)}
        self.stages.sort(key=lambda s: order.get(s.name, len(order)))
        self.save()

    def output_path(self, stage: str, label: str) -> Path | None:
        record = self.get(stage)
        if record is None or label not in record.outputs:
            return None
        return self.path.parent / record.outputs[label]

    def save(self) -> None:
        write_json(self.path, {"profile": self.profile, "stages": [asdict(s) for s in self.stages]})
