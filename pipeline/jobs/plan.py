"""The matrix's cells in a fixed order, each with a stable id: the first 12 hex digits of the sha256
of what defines it (model, shape, precision, backend, builder settings, GPU type, method, repeats),
so adding a model to a matrix leaves every other cell's id, and its result, as it was.

Cells are grouped by GPU type (`cpu` for ort-cpu, `local` for GPU cells of a matrix with no
[cluster]), so one Kubernetes Indexed Job's completion index N is its group's N-th cell.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.fileio import sha256_json
from pipeline.jobs.spec import GPU_BACKENDS, Matrix, profile_argument, profile_of


@dataclass(frozen=True)
class Cell:
    index: int
    model: str            # the profile's name
    profile: str          # the profile as given in the matrix (a name, or a path resolved from the matrix's folder)
    onnx: str | None
    shape: dict[str, int]
    precision: str
    backend: str
    builder: dict[str, Any]
    gpu: str
    method: dict[str, Any]
    repeats: int

    def definition(self) -> dict[str, Any]:
        """What defines the cell (everything but its position)."""
        data = asdict(self)
        del data["index"]
        return data

    @property
    def id(self) -> str:
        return sha256_json(self.definition())[:12]

    @property
    def label(self) -> str:
        shape = ",".join(f"{k}={v}" for k, v in self.shape.items()) or "static"
        settings = "".join(f" {k}={v}" for k, v in self.builder.items())
        return f"{self.model} {self.precision} {shape} {self.backend}{settings} on {self.gpu}"

    def build_key(self) -> str:
        """Cells that share this key share one build (artifacts folder): the shape and backend do not change it."""
        data = {"profile": self.profile, "onnx": self.onnx, "builder": self.builder}
        return f"{self.model}-{sha256_json(data)[:8]}"


def plan(matrix: Matrix) -> list[Cell]:
    groups: dict[str, list[dict[str, Any]]] = {}
    gpu_types = matrix.cluster.gpus if matrix.cluster else ["local"]
    settings = _builder_settings(matrix)
    method = matrix.method.model_dump()
    for entry in matrix.models:
        profile = profile_of(matrix, entry)
        shapes = entry.shapes or [{name: d.opt for name, d in profile.dims.items()}]
        for point in shapes:
            shape = {name: point.get(name, d.opt) for name, d in profile.dims.items()}
            for precision in matrix.precisions:
                for backend in matrix.backends:
                    for gpu in (gpu_types if backend in GPU_BACKENDS else ["cpu"]):
                        for builder in (settings if backend == "trt" else [{}]):
                            groups.setdefault(gpu, []).append(dict(
                                model=profile.name, profile=profile_argument(matrix, entry),
                                onnx=str((matrix.folder / entry.onnx).resolve()) if entry.onnx else None,
                                shape=shape, precision=precision, backend=backend, builder=builder, gpu=gpu,
                                method=method, repeats=matrix.repeats))
    rows = [row for gpu in sorted(groups) for row in groups[gpu]]
    return [Cell(index=i, **row) for i, row in enumerate(rows)]


def _builder_settings(matrix: Matrix) -> list[dict[str, Any]]:
    combos: list[dict[str, Any]] = [{}]
    for key, values in (("optimization_level", matrix.builder.optimization_level), ("builder", matrix.builder.builder)):
        if values:
            combos = [{**c, key: v} for c in combos for v in values]
    return combos


def select(cells: list[Cell], index: int, gpu: str | None = None) -> Cell:
    """The cell at `index` of the whole plan, or of GPU type `gpu`'s cells (a Kubernetes completion index)."""
    group = [c for c in cells if c.gpu == gpu] if gpu is not None else cells
    if gpu is not None and not group:
        raise InputError(f"--gpu {gpu}: the matrix has no cells for it; its GPU types: {', '.join(sorted({c.gpu for c in cells}))}")
    if not 0 <= index < len(group):
        where = f"GPU type {gpu}'s {len(group)}" if gpu is not None else f"the matrix's {len(group)}"
        raise InputError(f"--index {index} is out of range: {where} cells are numbered 0..{len(group) - 1} (see `jobs plan`)")
    return group[index]
