"""Build profiles, TOML files validated with pydantic: the model, its inputs (dtype, shape with named dims, how to fill
valid values), the dims' min/opt/max and each stage's settings. `load_profile("bert-tiny")` finds profiles/bert-tiny.toml.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.core import DEFAULT_PROFILE
from pipeline.core.errors import ProfileError
from pipeline.core.tomlfile import describe_validation_error, read_toml

REPO_PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def packaged_profiles() -> Path:
    """The profiles shipped with the project: profiles/ of a source checkout, else those installed as pipeline.profiles."""
    if REPO_PROFILES.is_dir():
        return REPO_PROFILES
    from importlib.resources import files

    return Path(str(files("pipeline.profiles")))

Dtype = Literal["float32", "float16", "int32", "int64", "bool"]
HfTask = Literal["base", "sequence-classification", "token-classification", "masked-lm", "causal-lm", "image-classification",
                 "seq2seq-lm", "speech2seq-lm"]
ENCODER_DECODER_TASKS = ("seq2seq-lm", "speech2seq-lm")  # an encoder and a decoder: two models, one build (pipeline/parts.py)
Part = Literal["encoder", "decoder"]  # the sub-models of an encoder-decoder, in the order a build makes them
PARTS: tuple[str, ...] = get_args(Part)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DimRange(_Section):
    """A dynamic dimension: the range the engine accepts and the size it is tuned for."""

    min: int = Field(ge=0, description="0 only for past_seq: an empty KV cache at prefill")
    opt: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> DimRange:
        if not self.min <= self.opt <= self.max:
            raise ValueError(f"needs min <= opt <= max, got {self.min}, {self.opt}, {self.max}")
        return self


EMPTY_ALLOWED = "past_seq"  # the one dim that may be 0: a decoder's KV cache before the first token


def dim_terms(size: str) -> list[str]:
    """The dim names a shape entry adds up: "seq" -> [seq]; "past_seq+seq" -> [past_seq, seq] (a decoder's attention mask)."""
    return [term.strip() for term in size.split("+")]


def dim_size(size: int | str, sizes: dict[str, int]) -> int:
    """A shape entry's size: an int as is, a dim name (or a sum of them) from `sizes`."""
    return size if isinstance(size, int) else sum(sizes[term] for term in dim_terms(size))


class InputSpec(_Section):
    """One model input. `shape` holds sizes, names of dims declared under [dims], or a sum of them ("past_seq+seq")."""

    name: str = Field(min_length=1)
    dtype: Dtype
    shape: list[int | str] = Field(min_length=1)
    fill: Literal["random", "positions", "mask"] = "random"
    range: tuple[float, float] | None = Field(
        default=None, description="[low, high): integers drawn from it for ids, floats uniform"
    )

    @field_validator("shape")
    @classmethod
    def _sizes_positive(cls, shape: list[int | str]) -> list[int | str]:
        for size in shape:
            if isinstance(size, int) and size < 1:
                raise ValueError(f"sizes must be >= 1 or a dim name, got {size}")
        return shape

    @model_validator(mode="after")
    def _fill_fits_dtype(self) -> InputSpec:
        if self.range is not None and not self.range[0] < self.range[1]:
            raise ValueError(f"range needs low < high, got {list(self.range)}")
        if self.fill == "mask" and self.dtype not in ("bool", "int32", "int64"):
            raise ValueError(f"fill 'mask' needs dtype bool, int32 or int64, got {self.dtype}")
        if self.fill == "positions" and self.dtype not in ("int32", "int64"):
            raise ValueError(f"fill 'positions' needs an integer dtype, got {self.dtype}")
        if self.fill == "random" and self.dtype in ("int32", "int64") and self.range is None:
            raise ValueError("integer inputs filled at random need range = [low, high) (e.g. the vocabulary)")
        return self


class ModelSection(_Section):
    """Where the model comes from (exactly one): a PyTorch factory, an ONNX file, or a Hugging Face
    model (`hf`: id or save_pretrained folder; `hf_config`: a config, random weights) with its `task` head."""

    factory: str | None = Field(default=None, description="'package.module:function'")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    seed: int = Field(default=0, ge=0, lt=2**63, description="torch.manual_seed before the factory is called")
    onnx: Path | None = None
    hf: str | None = Field(default=None, min_length=1, description="model id or folder saved with save_pretrained (relative to this file)")
    hf_config: dict[str, Any] | None = Field(default=None, description="config fields with model_type: random weights, nothing downloaded")
    task: HfTask | None = Field(default=None, description="which head to load with hf / hf_config [default: base]")

    @field_validator("factory")
    @classmethod
    def _factory_form(cls, factory: str | None) -> str | None:
        if factory is not None and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", factory):
            raise ValueError(f"must look like 'package.module:function', got {factory!r}")
        return factory

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        sources = [self.factory, self.onnx, self.hf, self.hf_config]
        if sum(s is not None for s in sources) != 1:
            raise ValueError("set exactly one of factory = 'package.module:function', onnx = 'path.onnx', hf = 'model id or folder' "
                             "or hf_config = { model_type = '...', ... }")
        if self.kwargs and self.factory is None:
            raise ValueError("kwargs go to a factory; with hf_config put the settings in hf_config itself")
        if self.task is not None and self.hf is None and self.hf_config is None:
            raise ValueError("task chooses the head of a Hugging Face model: it needs hf or hf_config")
        if self.hf_config is not None and not isinstance(self.hf_config.get("model_type"), str):
            raise ValueError("hf_config needs model_type, e.g. hf_config = { model_type = 'bert', hidden_size = 64 }")
        return self

    @property
    def is_hf(self) -> bool:
        return self.hf is not None or self.hf_config is not None

    @property
    def from_pytorch(self) -> bool:
        """Exported from PyTorch (a factory or a Hugging Face model), not read from an ONNX file."""
        return self.onnx is None

    def summary(self) -> str:
        """One phrase naming the model source, e.g. "hf_config bert (sequence-classification)"."""
        if self.hf_config is not None:
            return f"hf_config {self.hf_config['model_type']} ({self.task or 'base'})"
        if self.hf is not None:
            return f"hf {self.hf} ({self.task or 'base'})"
        return f"factory {self.factory}" if self.factory else f"onnx {self.onnx}"


class ExportSection(_Section):
    exporter: Literal["dynamo", "torchscript"] = "dynamo"
    opset: int = Field(default=20, ge=17, le=22)
    tolerance: float = Field(default=1e-4, gt=0, description="max |torch - onnxruntime| allowed, times the output's largest magnitude where above 1")
    cache: Literal["with-past", "none"] | None = Field(
        default=None, description="a decoder's KV cache: with-past (inputs past_key_values.*, outputs present.*) or none "
                                  "(use_cache=False) [default: with-past for a model that returns a cache]")
    new_tokens: int = Field(default=16, ge=1, le=1024, description="greedy tokens the generation check decodes (decoders)")
    part: Part | None = Field(
        default=None, description="of an encoder-decoder (task seq2seq-lm, speech2seq-lm), the sub-model this build makes "
                                  "[default: both, each in a folder of its own]")


class OptimizeSection(_Section):
    """Settings of the optimize stage (rule names: `python -m pipeline optimize --help`)."""

    rules: list[str] | None = Field(default=None, description="only these rules (default: all)")
    skip_rules: list[str] = Field(default_factory=list)
    tolerance: float = Field(default=1e-5, gt=0, description="max |input - optimized| on onnxruntime CPU, times the output's largest magnitude where above 1")


GATES = ("min_cosine", "min_token_agreement")  # accuracy gates a profile sets per precision


class QuantSection(_Section):
    """Settings of the fp16, int8, fp8, int4 and bf16 stages."""

    preset: Literal["auto", "trt-fusion", "modelopt", "gemm-only", "cnn", "decoder"] = Field(
        default="auto", description="Q/DQ placement of the int8 and fp8 stages (quant/presets.py); auto: the model family's preset"
    )
    samples: int = Field(default=16, ge=1, le=4096, description="synthetic calibration samples (no --calib)")
    calibration_method: Literal["entropy", "max"] = "entropy"
    int8_float_dtype: Literal["fp32", "fp16"] = Field(
        default="fp32", description="dtype of the INT8 model's non-quantized parts (ModelOpt high_precision_dtype)"
    )
    accuracy_samples: int = Field(default=16, ge=1, le=4096, description="held-out samples for the accuracy check")
    min_cosine: dict[str, float] = Field(default_factory=dict, description="accuracy gate vs FP32 (cosine_centered) by precision, "
                                         "written min_cosine_<precision> [default: the precision's, pipeline/precisions.py]")
    int4_method: Literal["awq_clip", "rtn_dq"] = Field(default="awq_clip", description="AWQ (calibrated) or round to nearest (no data)")
    min_token_agreement: dict[str, float] = Field(default_factory=dict, description="a decoder's gate by precision: share of steps where, fed torch's "
                                                  "greedy tokens, it picks torch's next one, written min_token_agreement_<precision>")
    fp16_exclude_op_types: list[str] = Field(default_factory=list)
    fp16_exclude_nodes: list[str] = Field(default_factory=list, description="regular expressions")
    int8_exclude_nodes: list[str] = Field(default_factory=list, description="nodes the int8 stage leaves unquantized: regular expressions")
    fp8_exclude_nodes: list[str] = Field(default_factory=list, description="nodes the fp8 stage leaves unquantized: regular expressions")

    @field_validator("fp16_exclude_nodes", "int8_exclude_nodes", "fp8_exclude_nodes")
    @classmethod
    def _regular_expressions(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as err:  # else ModelOpt's re.match fails mid-stage, an internal error
                raise ValueError(f"{pattern!r} is not a regular expression ({err}); escape ( ) [ ] . * + ? with a backslash") from err
        return patterns

    @model_validator(mode="before")
    @classmethod
    def _gates_by_precision(cls, data: Any) -> Any:
        """`min_cosine_int8 = 0.99`, as a profile writes it, is min_cosine["int8"]. Which precisions have a
        gate is the pipeline's to say (pipeline/precisions.py): the settings check the names."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for gate in GATES:
            for key in [k for k in data if k.startswith(gate + "_")]:
                data[gate] = {**data.get(gate, {}), key.removeprefix(gate + "_"): data.pop(key)}
        return data

    @field_validator(*GATES)
    @classmethod
    def _fractions(cls, gates: dict[str, float], info) -> dict[str, float]:
        for precision, value in gates.items():
            if not 0 <= value <= 1:
                raise ValueError(f"{info.field_name}_{precision} = {value}: a gate is a share, within 0..1")
        return gates


class BuildSection(_Section):
    """Settings of the TensorRT build, profile and bench stages."""

    verbosity: Literal["none", "layer_names_only", "detailed"] = "detailed"
    workspace_mib: int = Field(default=4096, ge=16)
    optimization_level: int = Field(default=3, ge=0, le=5)
    log_severity: Literal["error", "warning", "info", "verbose"] = "info"
    builder: Literal["python", "polygraphy", "trtexec"] = Field(
        default="python", description="TensorRT's Python API, Polygraphy's loaders, or the trtexec command"
    )
    profile_warmup: int = Field(default=5, ge=0, description="unprofiled runs before the per-layer profile")
    profile_iterations: int = Field(default=20, ge=1)
    bench_warmup: int = Field(default=20, ge=0)
    bench_iterations: int = Field(default=200, ge=1)


class Profile(_Section):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    model: ModelSection
    inputs: list[InputSpec] = Field(min_length=1)
    dims: dict[str, DimRange] = Field(default_factory=dict)
    export: ExportSection = ExportSection()
    optimize: OptimizeSection = OptimizeSection()
    quant: QuantSection = QuantSection()
    build: BuildSection = BuildSection()
    source: Path | None = Field(default=None, exclude=True, description="the TOML file it came from")

    @model_validator(mode="after")
    def _dims_declared(self) -> Profile:
        names = [spec.name for spec in self.inputs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"input names must be unique, repeated: {', '.join(duplicates)}")
        used = {term for spec in self.inputs for size in spec.shape if isinstance(size, str) for term in dim_terms(size)}
        undeclared = sorted(used - self.dims.keys())
        if undeclared:
            raise ValueError(f"dims {undeclared} are used in input shapes but not declared: add [dims.{undeclared[0]}] with min, opt, max")
        unused = sorted(self.dims.keys() - used - {EMPTY_ALLOWED})  # past_seq alone: the cache a with-past export derives its inputs for
        if unused:
            raise ValueError(f"dims {unused} are declared but no input shape uses them")
        empty = sorted(name for name, d in self.dims.items() if d.min == 0 and name != EMPTY_ALLOWED)
        if empty:
            raise ValueError(f"dims.{empty[0]}.min: 0 is allowed only for {EMPTY_ALLOWED} (an empty KV cache); set it to 1 or more")
        return self

    @model_validator(mode="after")
    def _part_of_encoder_decoder(self) -> Profile:
        if self.export.part is not None and not self.encoder_decoder:
            raise ValueError(f"export.part = {self.export.part!r} picks a sub-model of an encoder-decoder; model.task "
                             f"{self.model.task or 'base'!r} is one model: set task to one of {', '.join(ENCODER_DECODER_TASKS)}, or drop part")
        return self

    @property
    def encoder_decoder(self) -> bool:
        """An encoder-decoder (decided by the task alone, no model built): a build makes its encoder and its decoder,
        each a model of its own (pipeline/parts.py), unless [export] part picks one."""
        return self.model.task in ENCODER_DECODER_TASKS

    @property
    def parts(self) -> tuple[str, ...]:
        """The models a build of this profile makes, each in a build folder of its own: an encoder-decoder's encoder
        and decoder, unless [export] part picks one; () for one model, built in the build folder itself."""
        return PARTS if self.encoder_decoder and self.export.part is None else ()

    def shape(self, spec: InputSpec, which: Literal["min", "opt", "max"] = "opt") -> tuple[int, ...]:
        """The concrete shape of an input with each named dim at its min, opt or max."""
        return tuple(dim_size(size, {name: getattr(d, which) for name, d in self.dims.items()}) for size in spec.shape)

    @property
    def dynamic(self) -> bool:
        return any(d.min != d.max for d in self.dims.values())

    @property
    def packaged(self) -> bool:
        """A profile shipped with the project (or the built-in defaults), not a user's file."""
        return self.source is None or Path(self.source).resolve().parent == packaged_profiles().resolve()

    @property
    def folder(self) -> Path:
        """The profile file's folder (relative paths and factory modules are taken from here)."""
        return self.source.parent.resolve() if self.source else Path.cwd()

    def onnx_path(self) -> Path | None:
        """The profile's ONNX file, relative paths taken from the profile's folder."""
        return (self.folder / self.model.onnx).resolve() if self.model.onnx is not None else None


def available_profiles() -> list[str]:
    """Profile names in the search folders; `matrix-*.toml` there are benchmark matrices (`jobs`), not profiles."""
    return sorted({p.stem for d in _search_dirs() for p in d.glob("*.toml") if not p.stem.startswith("matrix-")})


def describe_profiles() -> list[dict[str, str]]:
    """Each profile `--profile NAME` finds: name, model source, inputs, description (or why it does not load)."""
    rows = []
    for name in available_profiles():
        try:
            p = load_profile(name)
        except ProfileError as err:
            rows.append({"name": name, "model": "(invalid)", "inputs": "-", "description": str(err)})
            continue
        inputs = ", ".join(f"{s.name} {s.dtype}[{', '.join(map(str, s.shape))}]" for s in p.inputs)
        rows.append({"name": name, "model": p.model.summary(), "inputs": inputs, "description": p.description})
    return rows


def _search_dirs() -> list[Path]:
    """The packaged profiles first, then ./profiles: a local file never shadows a packaged name."""
    dirs = [packaged_profiles(), Path.cwd() / "profiles"]
    return [d for i, d in enumerate(dirs) if d.is_dir() and d.resolve() not in [x.resolve() for x in dirs[:i]]]


def resolve_profile_path(name_or_path: str) -> Path:
    """`NAME` -> profiles/NAME.toml (the packaged one first, then ./profiles); a path ending in .toml as given."""
    if name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path:
        path = Path(name_or_path)
        if path.is_dir():
            raise ProfileError(f"profile {path} is a directory; pass a .toml file or a name from: {', '.join(available_profiles())}")
        if not path.is_file():
            raise ProfileError(f"profile file {path} does not exist; pass a .toml path or a name from: {', '.join(available_profiles())}")
        return path
    for directory in _search_dirs():
        candidate = directory / f"{name_or_path}.toml"
        if candidate.is_file():
            return candidate
    beside = Path(f"{name_or_path}.toml")
    if beside.is_file():
        raise ProfileError(f"profile {name_or_path!r} is not a packaged profile; ./{beside} is here: pass --profile {beside} (a file's path ends in .toml)")
    raise ProfileError(
        f"profile {name_or_path!r} not found in {', '.join(str(d) for d in _search_dirs()) or 'profiles/'}; "
        f"available: {', '.join(available_profiles()) or 'none'}"
    )


def shadowed_profile(name_or_path: str) -> Path | None:
    """A ./profiles/NAME.toml that is not used because a packaged profile has that name."""
    local = Path.cwd() / "profiles" / f"{name_or_path}.toml"
    used = resolve_profile_path(name_or_path)
    return local if local.is_file() and local.resolve() != used.resolve() else None


def load_profile(name_or_path: str = DEFAULT_PROFILE) -> Profile:
    path = resolve_profile_path(name_or_path)
    data = read_toml(path, ProfileError, "profile")
    try:
        return Profile.model_validate({**data, "source": path})
    except ValidationError as err:
        raise ProfileError(f"{path}: {describe_validation_error(err, Profile, 'profile')}") from err
