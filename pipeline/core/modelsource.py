"""Where a profile's model comes from: its factory module found from the profile's folder, that module's
file, a Hugging Face model's local folder, and what of these decides the model a build exports (the
`model` setting's cache key, pipeline/settings.py). Nothing here imports torch or transformers."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pipeline.core.errors import ProfileError, first_line
from pipeline.core.fileio import sha256_file
from pipeline.core.profiles import Profile


@contextlib.contextmanager
def importable_from(folder: Path) -> Iterator[None]:
    """The profile's folder first on the import path while its factory module is found and imported."""
    entry = str(folder)
    sys.path.insert(0, entry)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(entry)


def find_spec(module_name: str, profile: Profile):
    """The factory module's spec (None when there is no such module); a module that fails to be found is one line."""
    try:
        return importlib.util.find_spec(module_name)
    except SyntaxError as err:
        raise ProfileError(f"{profile.source}: model.factory: {err.filename}:{err.lineno}: syntax error ({err.msg}); fix the module") from err
    except Exception as err:  # a parent package's __init__ runs here and may fail in any way
        raise ProfileError(f"{profile.source}: model.factory: cannot import {module_name!r}: {type(err).__name__}: {first_line(err)}") from err


def factory_file(profile: Profile) -> Path | None:
    """The file of the profile's factory module (found as the export stage finds it), or None."""
    if profile.model.factory is None:
        return None
    with importable_from(profile.folder):
        spec = find_spec(profile.model.factory.split(":")[0], profile)
    return Path(spec.origin) if spec and spec.origin else None


def local_folder(profile: Profile) -> Path | None:
    """The `hf` folder when it names one (relative to the profile's folder), else None (a model id).
    A value written as a path (starting with ".", "/" or "~") must be an existing folder."""
    hf = profile.model.hf
    candidate = profile.folder / Path(hf).expanduser()
    if candidate.is_dir():
        return candidate.resolve()
    if hf.startswith((".", "/", "~")):
        raise ProfileError(f"{profile.source}: model.hf: no folder {candidate}; give a folder written by save_pretrained (relative to the profile) or a model id")
    return None


def model_source(profile: Profile) -> dict[str, Any]:
    """What builds the model: the factory, its module's source and arguments; or the Hugging Face model (the id
    or a local folder's files, the config, the head) and transformers' version."""
    section = profile.model
    if not section.is_hf:
        path = factory_file(profile)
        return {"factory": section.factory, "factory_source": sha256_file(path) if path else None, "kwargs": section.kwargs}
    folder = local_folder(profile) if section.hf is not None else None
    files = {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()} if folder else None
    return {"hf": section.hf, "hf_config": section.hf_config, "task": section.task, "files": files, "transformers": package_version("transformers")}


def package_version(name: str) -> str | None:
    """The installed version of a distribution (None: not installed)."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None
