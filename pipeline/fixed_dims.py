"""Dims the dynamo exporter fixed although the profile declares them dynamic: where the model's code specializes a dim,
torch.onnx.export retries at the example's size, and the file takes that one size only. The exported inputs are checked
against the profile's dims, a fixed one refused in one line (`DimFixed`) naming the guard's source line from torch's log.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from typing import Any

from pipeline.core.errors import InputError, StageFailed
from pipeline.core.profiles import Profile, dim_terms
from pipeline.core.samples import check_sizes, make_inputs
from pipeline.core.verify import OnnxSession, run_failure

SHAPES_LOGGER = "torch.fx.experimental.symbolic_shapes"
_SYMBOL = re.compile(r"create_symbol (?P<symbol>s\d+) = \d+ for L\['\w+'\](?:\[(?P<input>\d+)\])?\.size\(\)\[(?P<axis>\d+)\]")
_GUARD = re.compile(r"Eq\((?P<symbol>s\d+), (?P<size>\d+)\) \[guard added\] \((?P<where>[^)]*)\)")


class DimFixed(InputError):
    """The exported graph takes one size of a dim the profile declares dynamic: the model's code fixed it."""

    def __init__(self, message: str, dim: str, size: int):
        super().__init__(message)
        self.dim, self.size = dim, size


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def shape_guards() -> Iterator[list[str]]:
    """The symbolic-shapes log messages of the block (torch logs each guard with its source line at INFO)."""
    logger, handler = logging.getLogger(SHAPES_LOGGER), _Messages()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def check_dims(profile: Profile, graph_inputs: list[Any], guards: list[str], model: str) -> None:
    """Refuse (DimFixed) an input axis the profile gives a dynamic dim that the exported graph (`graph_inputs`: onnx_ir
    values, in the profile's order) has as a number; `guards`: the log `shape_guards` read, for where the code fixed it."""
    dynamic = {name for name, d in profile.dims.items() if d.min != d.max}
    for spec, value in zip(profile.inputs, graph_inputs):
        for axis, size in enumerate(spec.shape):
            if not (isinstance(size, str) and set(dim_terms(size)) & dynamic) or value.shape is None:
                continue
            exported = value.shape[axis]
            if isinstance(exported, int):
                where = _guard_site(guards, _axes_of(profile, size))
                declared = profile.dims.get(size)
                span = f" although [dims.{size}] is {declared.min}..{declared.max}" if declared else ""
                static = f"set [dims.{size}] min = opt = max to the size you deploy" if declared else f"make the dims of {size} static"
                raise DimFixed(
                    f"export: {model}'s code fixed dim {size!r} at {exported}{f' ({where})' if where else ''}{span}: the dynamo exporter "
                    f"can export it at that one size only (input {spec.name!r} axis {axis}); {static} (one engine per size), "
                    "or change the model's code there", size, exported)


def _axes_of(profile: Profile, size: str) -> set[tuple[int, int]]:
    """(input position, axis) of every input axis of size `size`: torch gives them one symbol, any one of theirs."""
    return {(position, axis) for position, spec in enumerate(profile.inputs) for axis, s in enumerate(spec.shape) if s == size}


def _guard_site(guards: list[str], axes: set[tuple[int, int]]) -> str:
    """The source line of the guard that fixed the symbol of one of `axes` (input position, axis), "" when the log does not say."""
    symbols = {m["symbol"] for m in map(_SYMBOL.search, guards) if m and (int(m["input"] or 0), int(m["axis"])) in axes}
    sites = [m["where"] for m in map(_GUARD.search, guards) if m and m["symbol"] in symbols]
    return sites[0] if sites else ""


def fixed_at_run(profile: Profile, session: OnnxSession, model: str) -> DimFixed | None:
    """The dim the graph runs at its opt size only (`dim_the_graph_fixed`), where it runs at the opt sizes and not at one
    of the export check's others; None otherwise (where it does not run at all, the build's check says why)."""
    if not set(session.inputs) <= {spec.name for spec in profile.inputs}:
        return None  # inputs the profile does not list: the build's check names them
    opt, *others = check_sizes(profile)
    if not _runs(session, profile, opt):
        return None
    failing = next((sizes for sizes in others if not _runs(session, profile, sizes)), None)
    return None if failing is None else dim_the_graph_fixed(profile, session, failing, model)


def _runs(session: OnnxSession, profile: Profile, sizes: dict[str, int]) -> bool:
    try:
        session.run(make_inputs(profile, seed=0, dims=sizes))
    except StageFailed:
        return False
    return True


def dim_the_graph_fixed(profile: Profile, session: OnnxSession, failing: dict[str, int], model: str) -> DimFixed | None:
    """Which dim the exported graph takes at its opt size only, where it ran at the opt sizes and failed at `failing`: each
    dim that differs is set alone to its failing size (xLSTM's graph computes an index from the batch the exporter saw, and
    onnxruntime's Gather fails at any other); None when no single dim fails alone."""
    opt = {name: d.opt for name, d in profile.dims.items()}
    for name, size in failing.items():
        if name not in opt or size == opt[name]:
            continue
        try:
            session.run(make_inputs(profile, seed=0, dims={**opt, name: size}))
        except StageFailed as failed:
            declared = profile.dims[name]
            return DimFixed(f"export: {model}'s exported graph runs at {name} = {opt[name]} but not at {name} = {size} although "
                            f"[dims.{name}] is {declared.min}..{declared.max} (onnxruntime: {run_failure(failed.__cause__)}): the model's code "
                            f"computes a size from it that the exporter kept as a number; set [dims.{name}] min = opt = max to the size you "
                            "deploy (one engine per size), or try the other exporter (--exporter)", name, opt[name])
    return None
