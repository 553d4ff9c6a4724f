"""What `build` prints after its stage lines: the Docker command a skip for want of TensorRT records, once (the stage lines
show the reason without it); and, where the default profile's engine stages were skipped, the report of a real TensorRT
10.10 engine of this very model (tests/data/trt), so a first run on a CPU still shows what they would tell.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rich.console import Console

from pipeline.core import DEFAULT_PROFILE
from pipeline.core.manifest import StageRecord
from pipeline.core.profiles import REPO_PROFILES, Profile
from trt.capability import RUN_IN_IMAGE

_DOCKER = re.compile(re.escape(RUN_IN_IMAGE) + r"(?P<command>docker build .+)$")
REAL_LOG = REPO_PROFILES.parent / "tests" / "data" / "trt" / "bert-fp16-trt10.10.detailed.log"


def split_next_step(reason: str) -> tuple[str, str]:
    """A skip reason without the Docker command it ends with, and that command ('' when there is none)."""
    match = _DOCKER.search(reason)
    return (reason[: match.start()], match["command"]) if match else (reason, "")


def print_next_steps(console: Console, profile: Profile, manifest: Path, records: list[StageRecord]) -> None:
    console.print(f"\nrecorded in {manifest}", highlight=False, markup=False)
    commands = list(dict.fromkeys(command for r in records if r.status == "skipped" and (command := split_next_step(r.reason)[1])))
    for command in commands:
        console.print("\nThe engine stages need TensorRT and an NVIDIA GPU. On a machine with both, from this folder:", highlight=False, markup=False)
        console.print(f"  {command}", highlight=False, markup=False, soft_wrap=True)
    built = {r.name: r.status for r in records}
    if built.get("build") == "skipped" and _is_default(profile) and REAL_LOG.is_file():
        from trt.report import report_from_files

        verdict = report_from_files(REAL_LOG).verdict
        console.print(f"\nWhat the report says about this model's engine, from a real TensorRT 10.10 build log (FP16, A100):\n"
                      f"  python -m pipeline report {shown_path(REAL_LOG)}\n  {verdict}", highlight=False, markup=False, soft_wrap=True)


def _is_default(profile: Profile) -> bool:
    return profile.name == DEFAULT_PROFILE and profile.source is not None and Path(profile.source).resolve().parent == REPO_PROFILES.resolve()


def shown_path(path: Path) -> str:
    """`path` relative to the current folder when it is under it (as a user would type it), else as given."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)
