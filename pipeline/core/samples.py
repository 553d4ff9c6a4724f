"""Random but valid model inputs generated from a profile (ids in range, masks, positions)."""

from __future__ import annotations

from typing import Literal

import numpy as np

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


def check_sizes(profile: Profile) -> list[dict[str, int]]:
    """Named-dim sizes to verify a model at: opt, and when dims are dynamic a second set
    (1 -> 2, else opt // 2, kept within [min, max]), e.g. 1x128 and 2x64 for bert-base."""
    opt = {name: d.opt for name, d in profile.dims.items()}
    if not profile.dynamic:
        return [opt]
    alternate = {name: min(d.max, max(d.min, 2 if d.opt == 1 else d.opt // 2)) for name, d in profile.dims.items()}
    return [opt, alternate] if alternate != opt else [opt]


def stack_batches(profile: Profile, feed_sets: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The feed sets concatenated along the batch axis, as many per run as the profile's dynamic
    batch dim allows (one run instead of one per sample); unchanged when the inputs have no
    common dynamic first dim."""
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
    """Named-dim sizes that reach every end of what the profile allows: min, opt, and each dynamic
    dim at its max with the others at their min (so every dim takes its extremes and the dims take
    unequal values, which is what a model with wrong symbolic shapes fails on). The all-max corner
    is left out: on a CPU it can cost more than the rest of the build (bert-base: 32 x 512)."""
    low = {name: d.min for name, d in profile.dims.items()}
    sets = [low, {name: d.opt for name, d in profile.dims.items()}]
    sets += [low | {name: d.max} for name, d in profile.dims.items() if d.min != d.max]
    return [s for i, s in enumerate(sets) if s not in sets[:i]]


def model_feeds(inputs: dict[str, tuple[str, list]], dynamic_sizes: tuple[int, ...] = (1, 3)) -> list[dict[str, np.ndarray]]:
    """Zero feeds for an ONNX model's inputs ({name: (dtype, dims with None where dynamic)}), one set
    per size in `dynamic_sizes` given to every dynamic dim: for checks without a profile (zeros are
    valid token ids and masks)."""
    dynamic = any(d is None for _, dims in inputs.values() for d in dims)
    return [{name: np.zeros([d if d is not None else size for d in dims], dtype) for name, (dtype, dims) in inputs.items()}
            for size in (dynamic_sizes if dynamic else dynamic_sizes[:1])]
