"""Sample inputs: random but valid feeds generated from a profile (ids in range, masks, positions),
sets of them concatenated or split into runs, and a user's .npz read and checked against an ONNX
model's inputs (calibration data, `compare --inputs`)."""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import Literal

import numpy as np

from pipeline.core.errors import InputError
from pipeline.core.fileio import require_file
from pipeline.core.graph import static_dims
from pipeline.core.profiles import InputSpec, Profile, dim_size


def make_inputs(
    profile: Profile,
    seed: int,
    which: Literal["min", "opt", "max"] = "opt",
    dims: dict[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """One feed dict; named dims take `dims[name]` if given, else their min/opt/max."""
    rng = np.random.default_rng(seed)
    sizes = {name: (dims or {}).get(name, getattr(d, which)) for name, d in profile.dims.items()}
    feeds: dict[str, np.ndarray] = {}
    mask_lengths: np.ndarray | None = None
    for spec in profile.inputs:
        shape = tuple(dim_size(s, sizes) for s in spec.shape)
        if spec.fill == "mask":
            if mask_lengths is None or mask_lengths.shape != shape[:-1]:
                mask_lengths = _valid_lengths(rng, shape)
            feeds[spec.name] = (np.arange(shape[-1]) < mask_lengths[..., None]).astype(spec.dtype)
        else:
            feeds[spec.name] = _fill(rng, spec, shape)
    return feeds


def _valid_lengths(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Real-token counts per row: at least half the sequence, the first row full."""
    seq = shape[-1]
    lengths = rng.integers(max(1, seq // 2), seq + 1, size=shape[:-1])
    lengths.reshape(-1)[:1] = seq
    return lengths


def _fill(rng: np.random.Generator, spec: InputSpec, shape: tuple[int, ...]) -> np.ndarray:
    dtype = np.dtype(spec.dtype)
    if spec.fill == "positions":
        return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        low, high = spec.range  # validated: random integer inputs have a range
        return rng.integers(int(low), int(high), size=shape, dtype=dtype)
    if spec.range is not None:
        return rng.uniform(spec.range[0], spec.range[1], size=shape).astype(dtype)
    return rng.standard_normal(size=shape).astype(dtype)


def synthetic(profile: Profile, samples: int, seed: int, axes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """`samples` random feeds at opt shapes, concatenated along each input's batch axis (`axes`, see `batch_axes`; else 0)."""
    feeds = [make_inputs(profile, seed=seed + i) for i in range(samples)]
    return {name: np.concatenate([f[name] for f in feeds], axis=(axes or {}).get(name, 0)) for name in feeds[0]}


def split(data: dict[str, np.ndarray], batch: int, axes: dict[str, int] | None = None) -> list[dict[str, np.ndarray]]:
    """Back into per-step feeds of `batch` rows each, cut along each input's batch axis (`axes`; axis 0 where not given)."""
    axes = axes or {}
    rows = len(next(iter(data.values())))
    return [{name: array[(slice(None),) * axes.get(name, 0) + (slice(i, i + batch),)] for name, array in data.items()}
            for i in range(0, rows, batch)]


def batch_axes(onnx_path: Path) -> dict[str, int]:
    """Each input's batch axis, along which samples are stacked: the axis of its shape named as the first input's
    first dim (a cache laid out [layers, batch, heads, past, head_dim] has it at 1); 0 for every input where the
    first input's first dim is not a named dynamic dim, and for an input without that dim."""
    from pipeline.core.onnxfile import load_onnx

    shapes = {i.name: [d.dim_param for d in i.type.tensor_type.shape.dim] for i in load_onnx(onnx_path).graph.input}
    batch = next((dims[0] for dims in shapes.values() if dims), "") if shapes else ""
    return {name: dims.index(batch) if batch and batch in dims else 0 for name, dims in shapes.items()}


def check_sizes(profile: Profile) -> list[dict[str, int]]:
    """Named-dim sizes to verify a model at: opt, and when dims are dynamic a second set
    (1 -> 2, else opt // 2, kept within [min, max]), e.g. 1x128 and 2x64 for bert-base."""
    opt = {name: d.opt for name, d in profile.dims.items()}
    alternate = {name: min(d.max, max(d.min, 2 if d.opt == 1 else d.opt // 2)) for name, d in profile.dims.items()}
    return [opt, alternate] if alternate != opt else [opt]


def stack_batches(profile: Profile, feed_sets: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The feed sets joined along the batch axis, as many a run as a common dynamic first dim allows; unchanged without one."""
    first = {spec.shape[0] for spec in profile.inputs}
    name = next(iter(first))
    if len(first) != 1 or not isinstance(name, str) or profile.dims[name].min == profile.dims[name].max or not feed_sets:
        return feed_sets
    limit = profile.dims[name].max
    batches: list[list[dict[str, np.ndarray]]] = [[]]
    rows = 0
    for feeds in feed_sets:
        size = next(iter(feeds.values())).shape[0]
        if batches[-1] and rows + size > limit:
            batches.append([])
            rows = 0
        batches[-1].append(feeds)
        rows += size
    return [{key: np.concatenate([f[key] for f in group]) for key in group[0]} for group in batches]


def range_sizes(profile: Profile) -> list[dict[str, int]]:
    """min, opt, and each dynamic dim at its max with the others at their min: unequal extremes, what wrong symbolic shapes fail
    on. Not the all-max corner, which on a CPU can cost more than the rest of the build (bert-base: 32 x 512)."""
    low = {name: d.min for name, d in profile.dims.items()}
    sets = [low, {name: d.opt for name, d in profile.dims.items()}]
    sets += [low | {name: d.max} for name, d in profile.dims.items() if d.min != d.max]
    return [s for i, s in enumerate(sets) if s not in sets[:i]]


def model_feeds(inputs: dict[str, tuple[str, list]], dynamic_sizes: tuple[int, ...] = (1, 3)) -> list[dict[str, np.ndarray]]:
    """Zero feeds (valid token ids and masks) for checks without a profile: one set per size in `dynamic_sizes`, given to
    every dynamic dim of `inputs` ({name: (dtype, dims with None where dynamic)})."""
    dynamic = any(d is None for _, dims in inputs.values() for d in dims)
    return [{name: np.zeros([d if d is not None else size for d in dims], dtype) for name, (dtype, dims) in inputs.items()}
            for size in (dynamic_sizes if dynamic else dynamic_sizes[:1])]


def load_npz(path: Path, model_inputs: dict[str, tuple[str, list]], axes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """A user's samples file (calibration data, compare's inputs), checked against `model_inputs` ({input: (numpy dtype name, dims, None where dynamic)}):
    samples are concatenated along axis 0, or along each input's batch axis (`axes`, see `batch_axes`)."""
    axes = axes or {}
    path = require_file(path, "calibration file", "pass an .npz with one array per model input (numpy.savez)")
    data = read_npz(path)
    missing = sorted(model_inputs.keys() - data.keys())
    if missing:
        raise InputError(f"{path}: no array for model input {missing[0]!r} (has {sorted(data)}); add one per input: {sorted(model_inputs)}")
    rows = {name: data[name].shape[axes.get(name, 0)] if data[name].ndim > axes.get(name, 0) else 0 for name in model_inputs}
    for name, (dtype, dims) in model_inputs.items():
        array, axis = data[name], axes.get(name, 0)
        if array.dtype != np.dtype(dtype):
            raise InputError(f"{path}: input {name!r} has dtype {array.dtype}, the model expects {dtype}; convert it with .astype({dtype!r})")
        if array.ndim != len(dims) or any(d is not None and d != s and a != axis for a, (d, s) in enumerate(zip(dims, array.shape, strict=False))):
            expected = ", ".join("samples" if a == axis else str(d) if d is not None else "?" for a, d in enumerate(dims))
            raise InputError(f"{path}: input {name!r} has shape {list(array.shape)}, the model expects [{expected}] (samples concatenated on axis {axis})")
        if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
            raise InputError(f"{path}: input {name!r} contains NaN or Inf at flat index {int(np.argmin(np.isfinite(array).reshape(-1)))}; calibration needs finite values")
    if len(set(rows.values())) != 1 or 0 in rows.values():
        raise InputError(f"{path}: inputs have different sample counts {rows}; every array needs the same number of samples")
    return {name: data[name] for name in model_inputs}


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz, each member's header checked before any data is read (no pickles, no
    shape that claims more bytes than the member holds, so a corrupt header cannot exhaust memory)."""
    hint = "write it again with numpy.savez (one plain numeric array per input)"
    if not zipfile.is_zipfile(path):
        raise InputError(f"{path}: not an .npz file (not a zip archive); {hint}")
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                _check_member(path, archive, info, hint)
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        raise InputError(f"{path}: not a readable .npz file ({type(err).__name__}: {err}); {hint}") from err
    except MemoryError as err:
        raise InputError(f"{path}: its arrays do not fit in memory; use fewer calibration samples") from err


def _check_member(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, hint: str) -> None:
    name = info.filename.removesuffix(".npy")
    with archive.open(info) as member:
        try:
            version = np.lib.format.read_magic(member)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(member)
        except ValueError as err:
            raise InputError(f"{path}: member {name!r} is not a .npy array ({err}); {hint}") from err
        header_bytes = member.tell()
    if dtype.hasobject:
        raise InputError(f"{path}: array {name!r} holds Python objects (pickled), which are refused (allow_pickle=False); {hint}")
    claimed = math.prod(shape) * dtype.itemsize
    held = info.file_size - header_bytes
    if claimed != held:
        raise InputError(f"{path}: array {name!r} claims shape {list(shape)} {dtype} ({claimed} bytes) but holds {held} bytes: the file is corrupt or truncated; {hint}")


def model_inputs(onnx_path: Path) -> dict[str, tuple[str, list]]:
    """Each ONNX input's numpy dtype name and dims (None where dynamic)."""
    from onnx import helper

    from pipeline.core.onnxfile import load_onnx

    model = load_onnx(onnx_path)
    return {i.name: (helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name, static_dims(i)) for i in model.graph.input}
