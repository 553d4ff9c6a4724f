"""Random but valid model inputs generated from a profile (ids in range, masks, positions)."""

from __future__ import annotations

from typing import Literal

import numpy as np

from pipeline.profiles import InputSpec, Profile


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
        shape = tuple(s if isinstance(s, int) else sizes[s] for s in spec.shape)
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


def check_sizes(profile: Profile) -> list[dict[str, int]]:
    """Named-dim sizes to verify a model at: opt, and when dims are dynamic a second set
    (1 -> 2, else opt // 2, kept within [min, max]), e.g. 1x128 and 2x64 for bert-base."""
    opt = {name: d.opt for name, d in profile.dims.items()}
    if not profile.dynamic:
        return [opt]
    alternate = {name: min(d.max, max(d.min, 2 if d.opt == 1 else d.opt // 2)) for name, d in profile.dims.items()}
    return [opt, alternate] if alternate != opt else [opt]


def range_sizes(profile: Profile) -> list[dict[str, int]]:
    """Named-dim sizes covering what the profile allows: min, opt, max, and with two or more
    dynamic dims the two mixed corners (first dim at max and the rest at min, and the reverse)."""
    sets = [{name: getattr(d, which) for name, d in profile.dims.items()} for which in ("min", "opt", "max")]
    dynamic = [name for name, d in profile.dims.items() if d.min != d.max]
    if len(dynamic) >= 2:
        first = dynamic[0]
        for high in (True, False):
            sets.append({name: (d.max if (name == first) == high else d.min) if name in dynamic else d.opt for name, d in profile.dims.items()})
    return [s for i, s in enumerate(sets) if s not in sets[:i]]


def model_feeds(inputs: dict[str, tuple[str, list]], dynamic_sizes: tuple[int, ...] = (1, 3)) -> list[dict[str, np.ndarray]]:
    """Zero feeds for an ONNX model's inputs ({name: (dtype, dims with None where dynamic)}), one set
    per size in `dynamic_sizes` given to every dynamic dim: for checks without a profile (zeros are
    valid token ids and masks)."""
    dynamic = any(d is None for _, dims in inputs.values() for d in dims)
    return [{name: np.zeros([d if d is not None else size for d in dims], dtype) for name, (dtype, dims) in inputs.items()}
            for size in (dynamic_sizes if dynamic else dynamic_sizes[:1])]
