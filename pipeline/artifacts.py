"""A build's output folder, read through its manifest: each precision's model, engine, layer information and profile. Only
a usable stage gives its files, and only those still as it wrote them (a failed INT8 stage's old model is not this
build's). `bench`, `diff` and the jobs cells find the files here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline import precisions
from pipeline.core.errors import InputError
from pipeline.core.fileio import sha256_file
from pipeline.core.manifest import USABLE, Manifest
from pipeline.core.profiles import Profile


@dataclass(frozen=True)
class Built:
    """One precision of a build: what exists of it (None: not made, or not usable)."""

    precision: precisions.Precision
    onnx: Path | None
    engine: Path | None
    layers: Path | None
    profile: Path | None  # the per-layer timing of the engine


def read_build(folder: Path) -> tuple[str, dict[str, Built]]:
    """The profile a build folder records (as --profile takes it) and its precisions that have a model, by name (registry order)."""
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        raise InputError(f"{folder}: no manifest.json, so not a build's output folder; run `python -m pipeline build --out {folder}` first")
    manifest = Manifest.load_or_new(path, "")

    def output(stage: str, label: str) -> Path | None:
        """The file, when its stage is usable and it is still what the stage wrote (sha256 as recorded)."""
        record = manifest.get(stage)
        found = manifest.output_path(stage, label) if record is not None and record.status in USABLE else None
        if found is None or not found.is_file():
            return None
        recorded = record.output_sha256.get(label)
        return found if recorded is None or recorded == sha256_file(found) else None

    built = {}
    for p in precisions.PRECISIONS:
        engine_files = {label: output("build", f"{p.name}_{label}") for label in ("engine", "layers", "profile")}
        if (onnx := output(p.stage, "onnx")) is not None or any(engine_files.values()):
            built[p.name] = Built(p, onnx, **engine_files)
    return manifest.profile_argument, built


def recorded_profile(path: Path) -> str | None:
    """The profile the build of `path` (a build folder, or a file in one) records, as --profile takes it; None when it is not in a build folder."""
    manifest = (path if path.is_dir() else path.parent) / "manifest.json"
    return Manifest.load_or_new(manifest, "").profile_argument if manifest.is_file() else None


def as_built(profile: Profile, path: Path) -> Profile:
    """`profile` as the stages of the build holding `path` (a build folder, or a file in one) saw it: with the inputs
    its export derived (a decoder's cache, an encoder-decoder's decoder inputs), when that build is of this profile."""
    from pipeline.models.decoder import apply_derived

    manifest_path = (path if path.is_dir() else path.parent) / "manifest.json"
    if not manifest_path.is_file():
        return profile
    manifest = Manifest.load_or_new(manifest_path, "")
    export = manifest.get("export")
    if manifest.profile != profile.name or export is None or export.status not in USABLE:
        return profile
    return apply_derived(profile, export.metrics.get("derived_inputs"))


def fixed_feeds_beside(path: Path) -> dict | None:
    """The encoder outputs (cross-attention caches, mask) an encoder-decoder's decoder part was checked and calibrated
    on, from the generation reference of the build holding `path`; None elsewhere."""
    from pipeline.core.generation import load_feeds

    reference = generation_reference(path.parent)
    return (load_feeds(reference)["fixed"] or None) if reference is not None else None


def generation_reference(folder: Path) -> Path | None:
    """The export's torch generation (model.generation.npz) of the build in `folder`, when its export is usable."""
    manifest = Manifest.load_or_new(folder / "manifest.json", "")
    record, path = manifest.get("export"), manifest.output_path("export", "generation")
    return path if record is not None and record.status in USABLE and path is not None and path.is_file() else None
