"""The benchmark matrix: a TOML file validated with pydantic, one line per error (like profiles).
docs/jobs.md lists its fields; profiles/matrix-cpu.toml is one."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline import precisions as registry
from pipeline.core import seeds
from pipeline.core.errors import InputError, ProfileError
from pipeline.core.profiles import Profile, load_profile
from pipeline.core.tomlfile import describe_validation_error, read_toml

Backend = Literal["trt", "ort-cuda", "ort-cpu"]
GPU_BACKENDS = ("trt", "ort-cuda")

# Values of the GPU Feature Discovery node label `nvidia.com/gpu.product` (the product name with
# spaces as dashes); `kubectl get nodes -L nvidia.com/gpu.product` lists a cluster's.
GPU_PRODUCTS = (
    "NVIDIA-H200", "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL", "NVIDIA-GH200-480GB",
    "NVIDIA-B200", "NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB", "NVIDIA-A100-80GB-PCIe",
    "NVIDIA-A10G", "NVIDIA-A10", "NVIDIA-L4", "NVIDIA-L40S", "NVIDIA-L40", "Tesla-T4", "Tesla-V100-SXM2-16GB",
    "NVIDIA-RTX-A6000", "NVIDIA-GeForce-RTX-4090",
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelEntry(_Section):
    """One model: a profile (name or path), optionally an ONNX file to start from, its shape points."""

    profile: str = Field(min_length=1)
    onnx: Path | None = Field(default=None, description="start from this ONNX file (the profile gives its inputs)")
    shapes: list[dict[str, int]] = Field(default_factory=list, description="dim values; [default: the profile's opt point]")

    @field_validator("shapes")
    @classmethod
    def _positive(cls, shapes: list[dict[str, int]]) -> list[dict[str, int]]:
        for point in shapes:
            for dim, size in point.items():
                if size < 1:
                    raise ValueError(f"dim {dim} = {size}: sizes must be >= 1")
        return shapes


class BuilderSweep(_Section):
    """TensorRT builder settings; each combination is its own trt cell [default: the profile's]."""

    optimization_level: list[int] = Field(default_factory=list)
    builder: list[Literal["python", "polygraphy", "trtexec"]] = Field(default_factory=list)

    @field_validator("optimization_level")
    @classmethod
    def _levels(cls, levels: list[int]) -> list[int]:
        bad = [level for level in levels if not 0 <= level <= 5]
        if bad:
            raise ValueError(f"optimization levels are 0..5, got {bad[0]}")
        return levels


class Method(_Section):
    """How each cell times: warm-up by time, then timed runs until both minimums are met, `repeats` times.
    trtexec 11's defaults are 200 ms warm-up, 3 s duration, at least 10 iterations."""

    warmup_ms: float = Field(default=200, ge=0)
    min_duration_ms: float = Field(default=3000, gt=0)
    min_iterations: int = Field(default=10, ge=1)
    cuda_graphs: bool = Field(default=False, description="recorded; trt/bench.py times without CUDA graphs")
    seed: int = Field(default=seeds.BENCH, ge=0, description="seed of the profile's random inputs")


class Cluster(_Section):
    """Kubernetes: one Indexed Job per GPU type, results on a PersistentVolumeClaim or an object store."""

    gpus: list[str] = Field(min_length=1, description="values of the node label nvidia.com/gpu.product")
    image: str = Field(min_length=1)
    parallelism: int = Field(default=1, ge=1)
    backoff_limit_per_index: int = Field(default=1, ge=0)
    namespace: str = "default"
    results_pvc: str | None = Field(default=None, description="PersistentVolumeClaim mounted at /results")
    results_uri: str | None = Field(default=None, description="s3://... or gs://...: each pod copies its cells there")
    queue: str | None = Field(default=None, description="Kueue LocalQueue: label kueue.x-k8s.io/queue-name")

    @field_validator("gpus")
    @classmethod
    def _known(cls, gpus: list[str]) -> list[str]:
        for gpu in gpus:
            if gpu not in GPU_PRODUCTS:
                raise ValueError(f"unknown GPU type {gpu!r}: use a value of the node label nvidia.com/gpu.product "
                                 f"(kubectl get nodes -L nvidia.com/gpu.product), one of {', '.join(GPU_PRODUCTS)}")
        return gpus

    @model_validator(mode="after")
    def _one_store(self) -> Cluster:
        if (self.results_pvc is None) == (self.results_uri is None):
            raise ValueError("set exactly one of results_pvc = 'claim-name' or results_uri = 's3://bucket/prefix'")
        if self.results_uri is not None and not self.results_uri.startswith(("s3://", "gs://")):
            raise ValueError(f"results_uri {self.results_uri!r}: use s3://bucket/prefix or gs://bucket/prefix")
        return self


def _known_precision(name: str) -> str:
    if name not in registry.names():
        raise ValueError(f"{name!r} is not known: use one of {', '.join(registry.names())}")
    return name


class Matrix(_Section):
    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$", description="lowercase, digits, dashes (a Kubernetes name)")
    description: str = ""
    models: list[ModelEntry] = Field(min_length=1)
    precisions: list[Annotated[str, AfterValidator(_known_precision)]] = Field(min_length=1)
    backends: list[Backend] = Field(min_length=1)
    repeats: int = Field(default=3, ge=1, le=100)
    builder: BuilderSweep = BuilderSweep()
    method: Method = Method()
    cluster: Cluster | None = None
    source: Path = Field(exclude=True)

    @property
    def folder(self) -> Path:
        return self.source.parent.resolve()


def profile_argument(matrix: Matrix, entry: ModelEntry) -> str:
    if entry.profile.endswith(".toml") or "/" in entry.profile:
        path = Path(entry.profile)
        return str(path if path.is_absolute() else (matrix.folder / path).resolve())
    return entry.profile


_load = lru_cache(maxsize=64)(load_profile)


def profile_of(matrix: Matrix, entry: ModelEntry) -> Profile:
    return _load(profile_argument(matrix, entry))


def load_matrix(path: Path) -> Matrix:
    """Read and validate MATRIX.toml; every profile it names must load and every shape fit its dims."""
    if not Path(path).exists():
        raise InputError(f"matrix {path} does not exist; pass a matrix .toml (e.g. profiles/matrix-cpu.toml)")
    data = read_toml(path, InputError, "matrix")
    try:
        matrix = Matrix.model_validate({**data, "source": Path(path)})
    except ValidationError as err:
        raise InputError(f"{path}: {describe_validation_error(err, Matrix, 'matrix')}") from err
    for number, entry in enumerate(matrix.models):
        where = f"{path}: models[{number}]"
        try:
            profile = profile_of(matrix, entry)
        except ProfileError as err:
            raise InputError(f"{where}: {err}") from err
        for point in entry.shapes:
            for dim, size in point.items():
                if dim not in profile.dims:
                    raise InputError(f"{where}.shapes: profile {profile.name} has no dim {dim!r}; its dims: {', '.join(profile.dims) or 'none'}")
                r = profile.dims[dim]
                if not r.min <= size <= r.max:
                    raise InputError(f"{where}.shapes: {dim} = {size} is outside profile {profile.name}'s range {r.min}..{r.max}")
        if entry.onnx is not None and not (matrix.folder / entry.onnx).is_file():
            raise InputError(f"{where}.onnx: {matrix.folder / entry.onnx} does not exist")
    return matrix


