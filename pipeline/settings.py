"""The settings a stage reads, resolved once from the profile and the command line. A stage declares the names it reads
(`dims`, `quant.preset`, `calib`, ...); its `Settings` holds exactly those, the runner keys its cache on exactly those, and
reading anything else raises `UndeclaredSetting`, so no stage depends on a setting its cache key leaves out. An option
overrides the profile field it stands for (`--preset` -> `quant.preset`); a file setting is keyed by its sha256 too.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel

from pipeline import precisions
from pipeline.core.errors import ProfileError
from pipeline.core.fileio import sha256_file
from pipeline.core.profiles import GATES, Profile


@dataclass(frozen=True)
class Options:
    """What the command line chose: overrides of profile fields and the settings of their own."""

    precisions: frozenset[str] = frozenset()  # the optional precisions asked for (--fp16, --int8, ...)
    onnx: Path | None = None
    calib: Path | None = None
    preset: str | None = None
    min_cosine: float | None = None  # every precision's accuracy gate
    min_token_agreement: float | None = None  # every precision's generation gate
    verbosity: str | None = None
    weak_fp16: bool = False
    exporter: str | None = None
    repair: bool = True  # a failed FP16/BF16/INT8 gate searches for the nodes to keep in higher precision (--no-repair: off)


class UndeclaredSetting(Exception):
    """A stage read a setting it did not declare: a bug in the stage (its cache key would miss it)."""


def _model_key(profile: Profile, options: Options) -> Any:
    """The model section and, for a PyTorch model, the factory's source (or the Hugging Face model) it builds."""
    if not profile.model.from_pytorch:
        return profile.model.model_dump(mode="json")
    from pipeline.core.modelsource import model_source

    return {"section": profile.model.model_dump(mode="json"), "source": model_source(profile)}


@dataclass(frozen=True)
class Setting:
    """One setting: where its value comes from, and (when it differs from the value) what keys it."""

    name: str
    resolve: Callable[[Profile, Options], Any]
    key: Callable[[Profile, Options], Any] | None = None
    file: bool = False  # the value is a path: key it by the file's content too


def _field(section: str, name: str, option: str | None = None) -> Setting:
    """A profile field `section.name`, overridden by the command-line option `option` when given."""

    def resolve(profile: Profile, options: Options) -> Any:
        given = getattr(options, option) if option else None
        return given if given is not None else getattr(getattr(profile, section), name)

    return Setting(f"{section}.{name}", resolve)


def _gate(gate: str, precision: precisions.Precision) -> Setting:
    """`quant.<gate>_<precision>`: the profile's value, else the precision's default; the option `<gate>` overrides every precision's."""

    def resolve(profile: Profile, options: Options) -> float:
        given = getattr(options, gate)
        return given if given is not None else getattr(profile.quant, gate).get(precision.name, getattr(precision, gate))

    return Setting(f"quant.{gate}_{precision.name}", resolve)


def check_gates(profile: Profile) -> None:
    """A gate the profile sets for a precision that has none (a typo: `min_cosine_fp61`) is one line."""
    for gate in GATES:
        known = [p.name for p in precisions.gated(gate)]
        for name in getattr(profile.quant, gate):
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"did you mean {gate}_{close[0]}?" if close else f"the precisions with this gate: {', '.join(known)}"
                raise ProfileError(f"{profile.source or profile.name}: quant.{gate}_{name}: no precision {name!r} has this gate; {hint}")


def settings_registry() -> dict[str, Setting]:
    """Every setting a stage may declare, by name (the gates follow the precisions)."""
    settings = [
        Setting("onnx", lambda p, o: Path(o.onnx).resolve() if o.onnx else p.onnx_path(), file=True),  # --onnx, else the profile's
        Setting("calib", lambda p, o: Path(o.calib).resolve() if o.calib else None, file=True),
        # the precisions built into engines: FP32 always, the others when their flag asks
        Setting("precisions", lambda p, o: tuple(x.name for x in precisions.PRECISIONS if x.module is None or x.name in o.precisions)),
        Setting("weak_fp16", lambda p, o: o.weak_fp16),
        Setting("repair", lambda p, o: o.repair),
        Setting("model", lambda p, o: p.model, key=_model_key),
        Setting("inputs", lambda p, o: p.inputs),
        Setting("dims", lambda p, o: p.dims),
        Setting("export", lambda p, o: p.export.model_copy(update={"exporter": o.exporter}) if o.exporter else p.export),
        Setting("optimize", lambda p, o: p.optimize),
        _field("quant", "preset", "preset"),
        # synthetic calibration samples: none are made when --calib gives the data
        Setting("quant.samples", lambda p, o: None if o.calib else p.quant.samples),
        _field("quant", "calibration_method"),
        _field("quant", "int8_float_dtype"),
        _field("quant", "accuracy_samples"),
        *(_gate(gate, precision) for gate in GATES for precision in precisions.gated(gate)),
        _field("quant", "int4_method"),
        _field("quant", "fp16_exclude_op_types"),
        _field("quant", "fp16_exclude_nodes"),
        _field("quant", "int8_exclude_nodes"),
        _field("quant", "fp8_exclude_nodes"),
        *(_field("build", name, "verbosity" if name == "verbosity" else None)
          for name in ("verbosity", "workspace_mib", "optimization_level", "log_severity", "builder", "profile_warmup",
                       "profile_iterations", "bench_warmup", "bench_iterations")),
    ]
    return {s.name: s for s in settings}


OPTIONS = ("onnx", "calib", "precisions", "weak_fp16", "repair")  # settings that are not a profile field
ALWAYS = ("name", "description", "source")  # the profile's identity: not settings


def jsonable(value: Any) -> Any:
    """A setting's value as JSON can hold it (the fingerprint and the manifest keep it)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


class _Undeclared:
    """Stands for a profile section (or the part of it) a stage did not declare: reading it raises."""

    def __init__(self, stage: str, section: str, declared: Mapping[str, Any] | None = None):
        self._stage, self._section, self._declared = stage, section, dict(declared or {})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._declared:
            return self._declared[name]
        raise UndeclaredSetting(f"stage {self._stage!r} read {self._section}.{name}, which it does not declare: "
                                f"add {self._section + '.' + name if self._declared else self._section!r} to its reads")

    def __repr__(self) -> str:
        return f"<{self._section}: only {sorted(self._declared)} declared by stage {self._stage!r}>"


class _ProfileView(Profile):
    """The profile as one stage may see it: a part it did not declare raises when read."""

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if isinstance(value, _Undeclared) and not value._declared:
            raise UndeclaredSetting(f"stage {value._stage!r} read the profile's {name}, which it does not declare: add {name!r} to its reads")
        return value


class Settings:
    """The settings one stage declared, resolved once; frozen. `settings.profile` is the profile as the
    stage may see it (undeclared parts raise), `settings.calib` etc. the options it declared."""

    __slots__ = ("stage", "names", "profile", "_values", "_keys")

    def __init__(self, stage: str, profile: Profile, options: Options, names: Iterable[str]):
        names, registry = tuple(names), settings_registry()
        unknown = [n for n in names if n not in registry]
        if unknown:
            raise UndeclaredSetting(f"stage {stage!r} declares unknown settings {unknown}; known: {', '.join(registry)}")
        check_gates(profile)
        values = {n: registry[n].resolve(profile, options) for n in names}
        keys = {n: _key(registry[n], profile, options, values[n]) for n in names}
        view: dict[str, Any] = {f: getattr(profile, f) for f in ALWAYS}
        for field in Profile.model_fields:
            if field in ALWAYS:
                continue
            if field in names:
                view[field] = values[field]
            else:
                parts = {n.split(".", 1)[1]: values[n] for n in names if n.startswith(field + ".")}
                view[field] = _Undeclared(stage, field, parts)
        for slot, value in (("stage", stage), ("names", names), ("profile", _ProfileView.model_construct(**view)),
                            ("_values", MappingProxyType(values)), ("_keys", MappingProxyType(keys))):
            object.__setattr__(self, slot, value)

    def __getattr__(self, name: str) -> Any:
        if name in OPTIONS:
            if name in self._values:
                return self._values[name]
            raise UndeclaredSetting(f"stage {self.stage!r} read the setting {name!r}, which it does not declare: add it to its reads")
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"settings are frozen: {name} cannot be set")

    def keys(self) -> dict[str, Any]:
        """What the fingerprint holds for each declared setting (values; files with their sha256)."""
        return dict(self._keys)


def _key(setting: Setting, profile: Profile, options: Options, value: Any) -> Any:
    if setting.key is not None:
        return setting.key(profile, options)
    if setting.file and value is not None:
        path = Path(value)
        return {"path": str(path), "sha256": sha256_file(path) if path.is_file() else None}
    return jsonable(value)
