"""A build of several models: an encoder-decoder's encoder and decoder (`Profile.parts`), each built into a complete build
folder OUT/<part>/ whose profile.toml is the user's with `[export] part`, then checked together. OUT/manifest.json lists
the parts and records, for every precision both parts have, their greedy generation together against torch's; it holds
no stages (a command given OUT where one model's folder is needed says which to pass).
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import precisions
from pipeline.core.errors import InputError, PipelineError, ProfileError, StageFailed
from pipeline.core.manifest import PARTS_KEY, StageRecord
from pipeline.core.profiles import Profile

if TYPE_CHECKING:
    from pipeline.folderbuild import FolderBuild

PART_PROFILE = "profile.toml"  # in each part's folder: the profile its stages ran with
CHECK = "e2e"  # the label of the end-to-end lines


def build_parts(profile: Profile, out_dir: Path, folder: FolderBuild) -> tuple[Path, list[StageRecord]]:
    """Build each part of `profile` into out_dir/<part>, then check their generation together; the top manifest's path and
    the records of the stages run. A part failing a check does not stop the other (the first failure is raised at the end)."""
    from pipeline.core.fileio import write_json

    profiles = {part: part_profile(profile, part, out_dir / part) for part in profile.parts}  # refused before anything is written
    _check_folder(out_dir, profile)
    manifest = out_dir / "manifest.json"
    records: list[StageRecord] = []
    failures: list[StageFailed] = []
    with folder.guarded(out_dir):
        top = {"profile": profile.name, "profile_source": str(Path(profile.source).resolve()),
               PARTS_KEY: {part: part for part in profiles}, "generation": []}
        write_json(manifest, top)
        for part, (part_loaded, text) in profiles.items():
            try:
                records += folder.run(part_loaded, out_dir / part, part=part, files={PART_PROFILE: text})
            except StageFailed as err:
                failures.append(err)
            except PipelineError as err:  # a refusal names the part's copy of the profile, which the refusal leaves unwritten: name the user's
                err.args = (str(err).replace(str(out_dir / part / PART_PROFILE), f"{profile.source} ({part})"),)
                raise
        if folder.until is None or _reaches_optimize(folder):
            top["generation"] = generation_checks(profile, out_dir, folder)
            write_json(manifest, top)
            failures += [StageFailed(check["reason"]) for check in top["generation"] if check["status"] == "failed"]
    if failures:
        raise failures[0]
    return manifest, records


def part_profile(profile: Profile, part: str, folder: Path) -> tuple[Profile, str]:
    """The profile of one part, as it will be read from folder/profile.toml, and that file's text: the user's
    file as written (comments kept) with `[export] part`, and a local model.hf folder pointed at from there."""
    import tomlkit

    from pipeline.core.modelsource import local_folder
    from pipeline.core.tomlfile import describe_validation_error

    source = Path(profile.source)
    document = tomlkit.parse(source.read_text(encoding="utf-8"))
    if "export" not in document:
        document.add("export", tomlkit.table())
    document["export"]["part"] = part
    if profile.model.hf is not None and (local := local_folder(profile)) is not None:
        document["model"]["hf"] = Path(os.path.relpath(local, folder.resolve())).as_posix()
    target = folder / PART_PROFILE
    try:
        loaded = Profile.model_validate({**document.unwrap(), "source": target})
    except ValueError as err:  # pydantic's ValidationError
        raise ProfileError(f"{source} (its {part}): {describe_validation_error(err, Profile, 'profile')}") from err
    return loaded, tomlkit.dumps(document)


def _check_folder(out_dir: Path, profile: Profile) -> None:
    """OUT and its part folders are this profile's build, or new: never a single model's build, nor another profile's."""
    import json

    top = out_dir / "manifest.json"
    if top.is_file():
        try:
            recorded = json.loads(top.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise InputError(f"{top}: not a manifest this version wrote ({type(err).__name__}: {err}); delete it or pass another --out") from err
        if not isinstance(recorded, dict) or PARTS_KEY not in recorded:
            raise InputError(f"{out_dir} holds the build of one model; {profile.name} is an encoder-decoder, built as two models in folders "
                             f"of their own ({', '.join(profile.parts)}): pass another --out")
        if recorded.get("profile") != profile.name:
            raise InputError(f"{top} records a build of profile {recorded.get('profile')!r}, not {profile.name!r}; pass --out for this build "
                             f"(default artifacts/{profile.name})")


def _reaches_optimize(folder: FolderBuild) -> bool:
    names = [stage.name for stage in folder.plan]
    return names.index(folder.until) >= names.index("optimize")


def generation_checks(profile: Profile, out_dir: Path, folder: FolderBuild) -> list[dict[str, Any]]:
    """Every precision both parts have a model of (FP32: the optimized ones) checked end to end, printed and returned as records."""
    from pipeline.artifacts import generation_reference, read_build

    builds = {part: read_build(out_dir / part)[1] for part in profile.parts}
    reference = generation_reference(out_dir / "decoder")
    run = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    checks = []
    for precision in precisions.PRECISIONS:
        models = {part: built[precision.name].onnx if precision.name in built else None for part, built in builds.items()}
        if None in models.values():
            continue
        check = {"precision": precision.name, **_check(profile, folder, precision, models, reference), "run": run,
                 "models": {part: str(path.relative_to(out_dir)) for part, path in models.items()}}
        _print_check(folder.console, check)
        checks.append(check)
    return checks


def _check(profile: Profile, folder: FolderBuild, precision: precisions.Precision, models: dict[str, Path], reference: Path | None) -> dict[str, Any]:
    """One precision's check: FP32 generates exactly torch's tokens, the others pass their token agreement gate."""
    from pipeline.core.generation import gate, require_exact

    if reference is None:
        return {"status": "skipped", "seconds": 0.0, "reason": "the decoder's export recorded no generation reference (model.generation.npz)",
                "metrics": {}}
    from pipeline.models.seq2seq import end_to_end_generation

    started, figures, status, reason = time.perf_counter(), {}, "done", ""
    what = f"{CHECK} {precision.name}"
    try:
        figures = end_to_end_generation(models["encoder"], models["decoder"], reference, profile)
        if precision.name == precisions.REFERENCE:
            require_exact(figures, what, "torch's generation")
        elif (minimum := _gate(profile, folder, precision)) is not None:
            figures["min_token_agreement"] = minimum
            gate(figures, what, minimum)
    except StageFailed as err:
        status, reason = "failed", str(err)
    return {"status": status, "seconds": round(time.perf_counter() - started, 3), "reason": reason, "metrics": figures}


def _gate(profile: Profile, folder: FolderBuild, precision: precisions.Precision) -> float | None:
    """The precision's token agreement gate as its stage reads it (--min-token-agreement, the profile's, the default)."""
    from pipeline.settings import settings_registry

    if precision.min_token_agreement is None:
        return None
    return settings_registry()[f"quant.min_token_agreement_{precision.name}"].resolve(profile, folder.options)


def _print_check(console: Any, check: dict[str, Any]) -> None:
    """`e2e     int8      done        2.10s  next tokens 93.8% as torch's (64 tokens)`, as a stage line."""
    from rich.markup import escape

    from pipeline.core.text import printable

    colour = {"done": "green", "failed": "red", "skipped": "yellow"}[check["status"]]
    status = f"[{colour}]{check['status']}[/]{' ' * (len('interrupted') - len(check['status']))}"
    figures = check["metrics"]
    detail = (f"next tokens {figures['token_agreement']:.1%} as torch's ({figures['tokens']} tokens)" if check["status"] == "done"
              else check["reason"].split(";")[0])
    console.print(f"{CHECK:<8}{check['precision']:<9} {status} {check['seconds']:7.2f}s  {escape(printable(detail))}", highlight=False, soft_wrap=True)
