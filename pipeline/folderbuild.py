"""One model's build into one folder: the plan of stages run under the folder's lock, recorded in its manifest.
The build command runs one; pipeline/parts.py one per part of an encoder-decoder."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from pipeline.core.errors import PipelineError
from pipeline.core.text import printable

if TYPE_CHECKING:
    from rich.console import Console

    from pipeline.settings import Options


@dataclass(frozen=True)
class FolderBuild:
    """The stages of one model into one build folder, as the command line asked (pipeline/parts.py runs one per part)."""

    options: Options
    plan: list
    until: Optional[str]
    strict: bool
    force: bool
    wait: bool
    console: Console  # the stage lines
    messages: Console  # waiting for another build's lock
    rerun_hint: Callable[[], str]

    def run(self, profile, out_dir: Path, part: str = "", files: Optional[dict[str, str]] = None) -> list:
        """Run the plan for `profile` into `out_dir` (first writing `files` there, name: text); the records of the
        stages run. `part`: the model of several (pipeline/parts.py) this folder holds, named on each line."""
        from pipeline.core.fileio import write_text
        from pipeline.core.manifest import Manifest
        from pipeline.runner import Runner
        from pipeline.stage import Context
        from pipeline.stages import catalogue

        with self.guarded(out_dir, ["manifest.json", *(files or {})]):
            for name, text in (files or {}).items():
                write_text(out_dir / name, text)
            manifest = Manifest.load_or_new(out_dir / "manifest.json", profile.name, _profile_source(profile))
            if manifest.profile != profile.name:
                raise PipelineError(f"{manifest.path} records a build of profile {manifest.profile!r}, not {profile.name!r}; pass --out for this build (default artifacts/{profile.name})")
            ctx = Context(profile, out_dir, manifest, self.options, rerun_hint=self.rerun_hint)
            return Runner(ctx, self.console, force=self.force, strict=self.strict, catalogue=catalogue(), part=part).run(self.plan, until=self.until)

    @contextlib.contextmanager
    def guarded(self, out_dir: Path, files: Sequence[str] = ("manifest.json",)) -> Iterator[None]:
        """Hold `out_dir`'s lock (temporary files a killed run left there removed first); bad input leaves the folder
        as it was found: `files`, the names written there first, are removed when nothing else was written."""
        from pipeline.core.fileio import remove_stale_temp_files
        from pipeline.lock import folder_lock

        def on_wait(holder: str) -> None:
            self.messages.print(f"waiting for the build writing {out_dir} ({printable(holder)})", highlight=False, markup=False)

        with _leave_as_found_on_bad_input(out_dir, files), folder_lock(out_dir, self.wait, on_wait=on_wait):
            for stale in remove_stale_temp_files(out_dir):
                self.console.print(f"removed {stale.name}, left by an interrupted run", highlight=False, markup=False)
            yield


def _profile_source(profile) -> Optional[str]:
    """The profile's file as the manifest records it (None for a packaged profile, named by its name)."""
    from trt.capability import profile_argument

    argument = profile_argument(profile)
    return str(Path(argument).resolve()) if isinstance(argument, Path) else None


@contextlib.contextmanager
def _leave_as_found_on_bad_input(folder: Path, files: Sequence[str]) -> Iterator[None]:
    """A build that stops on bad input (exit 2) removes `files` (its manifest, ...) and the folders it created when nothing
    else was written there: such a manifest records only the refusal, which the error line already says."""
    created, missing = [], folder  # `folder` and those of its parents that do not exist yet, deepest first
    while not missing.exists() and missing != missing.parent:
        created.append(missing)
        missing = missing.parent
    new = [folder / name for name in files if not (folder / name).exists()]
    try:
        yield
    except PipelineError as err:
        if err.exit_code == 2:
            if new and folder.is_dir() and {p.name for p in folder.iterdir()} <= {p.name for p in new}:
                for path in new:
                    path.unlink(missing_ok=True)
            for each in created:
                with contextlib.suppress(OSError):
                    each.rmdir()  # only when empty
        raise
