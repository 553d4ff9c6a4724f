"""FP16 stage: ModelOpt AutoCast turns an FP32 ONNX into a mixed FP16 model (inputs/outputs kept FP32).

TensorRT 11 takes precision only from the ONNX (strongly typed networks), so the FP16 engine
is built from this file. AutoCast keeps in FP32 the nodes whose values would overflow FP16
and those the profile excludes.

The result is checked to run on onnxruntime at the input shapes given (the stage passes the
profile's min and opt shapes and each dynamic dim at its max, `samples.range_sizes`) before it
is written: a file that cannot run is never left behind.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.errors import CapabilityMissing, InputError, StageFailed, first_line
from pipeline.core.onnxfile import atomic_onnx, save_onnx

if TYPE_CHECKING:
    from pipeline.core.verify import OnnxSession

AUTOCAST_PLACEHOLDER_DIM = "unk"
# Conversions rerun with the nodes onnxruntime has no low-precision kernel for kept in FP32, at most (its CPU provider's
# ScatterND with reduction="add" in FP16: a mixture of experts' token scatter, JetMoE)
MAX_KERNEL_RERUNS = 4
NO_KERNEL = re.compile(r"(?:node '|node with name ')([^']+)'.*(?:is not supported|Could not find an implementation|NOT_IMPLEMENTED)|"
                       r"(?:Could not find an implementation|NOT_IMPLEMENTED).*node with name '([^']+)'")


@dataclass(frozen=True)
class AutocastResult:
    providers: list[str]
    nodes: int
    fp32_nodes_kept: int
    dims_repaired: int
    checked_shapes: list[dict[str, list[int]]]
    session: OnnxSession | None  # the session that ran the checks (run further feeds through it, not a second one); None: unchecked
    unchecked: str | None = None  # why the file was written without running it
    kept_without_kernel: tuple[str, ...] = ()  # nodes kept in FP32: onnxruntime has no kernel for them in the low precision


class NoKernel(StageFailed):
    """onnxruntime has no kernel for `node` of the converted model in its precision."""

    def __init__(self, message: str, node: str):
        super().__init__(message)
        self.node = node


def convert_fp16(
    source: Path, target: Path, op_types_to_exclude: list[str], nodes_to_exclude: list[str], feed_sets: list[dict[str, np.ndarray]],
    reference_feeds: dict[str, np.ndarray] | None = None,
) -> AutocastResult:
    """Convert `source` to mixed FP16 and write `target` only if it runs on every feed set. `reference_feeds`:
    the inputs AutoCast's FP32 reference run uses instead of its random ones (a decoder's attention
    mask must be past_seq + seq long, which random shapes never are)."""
    return _convert(source, target, "fp16", op_types_to_exclude, nodes_to_exclude, feed_sets, reference_feeds, check_on="CPUExecutionProvider")


def convert_bf16(
    source: Path, target: Path, op_types_to_exclude: list[str], nodes_to_exclude: list[str], feed_sets: list[dict[str, np.ndarray]],
) -> AutocastResult:
    """Convert `source` to mixed BF16 (AutoCast `low_precision_type="bf16"`) and write `target`.

    onnxruntime's CPU provider has no BF16 kernels for Conv, MatMul, Expand and most compute ops
    (1.24: "Could not find an implementation for Conv(22)"), so it is checked like FP16 on onnxruntime's
    CUDA provider, and where there is none (no GPU, or an onnxruntime without CUDA) the file is written
    unchecked and `unchecked` says why."""
    from pipeline.core.devices import onnxruntime_cuda_missing

    missing = onnxruntime_cuda_missing()
    return _convert(source, target, "bf16", op_types_to_exclude, nodes_to_exclude, feed_sets, None,
                    check_on=None if missing else "CUDAExecutionProvider", unchecked=f"onnxruntime's CPU provider has no BF16 kernels for Conv/MatMul, and {missing}")


def _convert(source: Path, target: Path, low_precision_type: str, op_types_to_exclude: list[str], nodes_to_exclude: list[str],
             feed_sets: list[dict[str, np.ndarray]], reference_feeds: dict[str, np.ndarray] | None, check_on: str | None,
             unchecked: str = "") -> AutocastResult:
    """AutoCast's mixed-precision model of `source` written to `target`, run on every feed set first on onnxruntime's
    `check_on` provider (None: written unchecked for the reason `unchecked` gives). A node onnxruntime has no kernel
    for in the low precision is kept in FP32 with those like it and the conversion rerun, at most MAX_KERNEL_RERUNS times."""
    import dataclasses

    from quant import check_room_for_modelopt

    check_room_for_modelopt(source, "autocast", low_precision_type)
    kept: list[str] = []
    for reruns in range(MAX_KERNEL_RERUNS + 1):
        try:
            result = _convert_once(source, target, low_precision_type, op_types_to_exclude, [*nodes_to_exclude, *exact_names(kept)], feed_sets,
                                   reference_feeds, check_on, unchecked)
            return dataclasses.replace(result, kept_without_kernel=tuple(kept))
        except NoKernel as err:
            if err.node in kept or reruns == MAX_KERNEL_RERUNS:
                raise
            kept += _alike(source, err.node)


def _alike(source: Path, name: str) -> list[str]:
    """The node `name` of `source` and every other of its op type and attributes: onnxruntime lacks their kernel too
    (JetMoE's six ScatterND adds, one conversion instead of six)."""
    import onnx

    nodes = onnx.load(str(source), load_external_data=False).graph.node
    like = next((n for n in nodes if n.name == name), None)
    if like is None:
        return [name]
    return [n.name for n in nodes if n.op_type == like.op_type and n.domain == like.domain and list(n.attribute) == list(like.attribute)]


def _convert_once(source: Path, target: Path, low_precision_type: str, op_types_to_exclude: list[str], nodes_to_exclude: list[str],
                  feed_sets: list[dict[str, np.ndarray]], reference_feeds: dict[str, np.ndarray] | None, check_on: str | None,
                  unchecked: str) -> AutocastResult:
    import onnx
    from modelopt.onnx.autocast import convert_to_mixed_precision
    from polygraphy.exception import PolygraphyException

    from pipeline.core.devices import onnxruntime_cuda_missing
    from pipeline.core.verify import onnxruntime_errors
    from quant import before_modelopt

    before_modelopt()
    providers = ["cpu"] if onnxruntime_cuda_missing() else ["cuda", "cpu"]  # AutoCast's FP32 reference run
    logging.getLogger("modelopt").setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), _npz(reference_feeds) as calibration_data, _autocast_input(source, target) as tensor_constants:
            model = convert_to_mixed_precision(
                onnx_path=str(tensor_constants), low_precision_type=low_precision_type, keep_io_types=True, providers=providers,
                op_types_to_exclude=op_types_to_exclude or None, nodes_to_exclude=nodes_to_exclude or None,
                calibration_data=calibration_data,
            )
    except (ValueError, KeyError) as err:
        raise StageFailed(f"{low_precision_type}: ModelOpt AutoCast cannot convert {source}: {err}") from err
    except (*onnxruntime_errors(), PolygraphyException) as err:  # AutoCast's FP32 reference run failed (none is a RuntimeError)
        hint = ("it ran the model on random inputs: a model whose inputs must agree (a decoder's attention mask with its cache) "
                "needs the profile's, pass --profile" if reference_feeds is None else "report it with the model")
        raise StageFailed(f"{low_precision_type}: ModelOpt AutoCast's FP32 reference run of {source} failed ({type(err).__name__}: "
                          f"{first_line(err)}); {hint}") from err
    repaired = repair_placeholder_dims(model, onnx.load(str(source), load_external_data=False))
    session, checked, why_unchecked = None, [], None
    with atomic_onnx(target) as tmp:
        save_onnx(model, tmp)
        try:
            if check_on is None:
                raise CapabilityMissing(unchecked)
            session, checked = check_runs(tmp, feed_sets, low_precision_type, check_on)
        except CapabilityMissing as err:  # no provider here runs this precision: the file is written, unchecked
            why_unchecked = f"not run: {err}"
    return AutocastResult(providers, len(model.graph.node), _fp32_compute_nodes(model), repaired, checked, session, why_unchecked)


@contextlib.contextmanager
def _autocast_input(source: Path, beside: Path):
    """`source` as AutoCast is given it: its weights in a data file, and each Constant holding its value as an attribute
    as a tensor `value` (a copy in a work folder beside `beside` where either was not so).

    Weights in a data file: AutoCast loads them only after its graph sanitizer and type inference, which copy the
    whole proto several times (ModelOpt 0.47, `autocast/convert.py`); a 0.47 GB decoder's AutoCast peaked at 7.1 GB
    given the inline file, 6.4 GB given its weights in a data file. Constants: AutoCast (`onnx/utils.py:
    _convert_constant_values`) removes the Cast to FP16 it inserted after a Constant and converts the Constant's tensor
    value, but leaves a value_float (the dynamo exporter's scalars, e.g. ReLU6's bounds 0 and 6) as it is: MobileNetV2's
    Clip then took an FP16 input and FP32 bounds, which onnxruntime refuses to load ("Type parameter (T) of Optype
    (Clip) bound to different types")."""
    import onnx

    from pipeline.core.fileio import external_data_file
    from pipeline.core.onnxfile import SMALLEST_EXTERNAL_TENSOR, constants_as_tensors, external_tensors, private_copy

    model = onnx.load(str(source), load_external_data=False)
    rewritten, external = constants_as_tensors(model), external_tensors(model)
    if external and not rewritten:
        yield source
        return
    with private_copy(source, external, beside) as (_, copy):
        if external:
            onnx.save(model, str(copy))
        else:
            onnx.save(model, str(copy), save_as_external_data=True, location=external_data_file(copy).name, size_threshold=SMALLEST_EXTERNAL_TENSOR)
        del model
        yield copy


@contextlib.contextmanager
def _npz(feeds: dict[str, np.ndarray] | None):
    """`feeds` in a temporary .npz file (its path), or None."""
    if feeds is None:
        yield None
        return
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "reference.npz"
        np.savez(path, **feeds)
        yield str(path)


def exact_names(nodes: tuple[str, ...] | list[str]) -> list[str]:
    """AutoCast's and ModelOpt's node exclusions are regular expressions matched at the start: these names, and no others."""
    return [re.escape(name) + "$" for name in nodes]


def repair_placeholder_dims(model, source) -> int:
    """Undo AutoCast's shape placeholders in `model` (in place); return how many dims were changed.

    AutoCast (ModelOpt 0.47, `autocast/utils.py: clear_types_and_shapes_recursive`) renames every
    static dim of the intermediate value_info to the one symbol "unk" before re-running ONNX shape
    inference; the dims inference cannot derive (after an Expand or Reshape by a computed shape)
    keep it. onnxruntime takes one symbol for one size across the graph: HF BERT's attention mask
    [batch, 1, 1, 128] and its broadcast [batch, 1, 128, 128] both read [batch, unk, unk, 128], the
    memory planner gives them one buffer and the run fails ("Shape mismatch attempting to re-use
    buffer. {2,1,1,128} != {2,1,128,128}"). The fix: a tensor the source has takes the source's
    dims (AutoCast changes types, not shapes), a Cast AutoCast inserted takes its input's, and a
    placeholder left over becomes an unknown dim (no value, no symbol).
    """
    known = {v.name: v.type.tensor_type.shape for v in [*source.graph.value_info, *source.graph.input, *source.graph.output]}
    cast_input = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Cast"}
    repaired = 0
    for value in [*model.graph.value_info, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if not any(d.dim_param == AUTOCAST_PLACEHOLDER_DIM for d in dims):
            continue
        name = value.name
        while name not in known and name in cast_input:
            name = cast_input[name]
        truth = known.get(name)
        for i, dim in enumerate(dims):
            if dim.dim_param != AUTOCAST_PLACEHOLDER_DIM:
                continue
            repaired += 1
            if truth is not None and len(truth.dim) == len(dims):
                dim.CopyFrom(truth.dim[i])
            else:
                dim.Clear()
            if dim.dim_param == AUTOCAST_PLACEHOLDER_DIM:  # the source itself named a dim "unk": forget it too
                dim.Clear()
    return repaired


def check_runs(path: Path, feed_sets: list[dict[str, np.ndarray]], stage: str,
               provider: str = "CPUExecutionProvider") -> tuple[OnnxSession, list[dict[str, list[int]]]]:
    """Run the model at each feed set (one session; a batch whose estimated peak would not fit in memory in
    runs of fewer rows, pipeline/core/memory.py); a failure is one line naming the shapes and the node.
    Returns the session (it holds the model in onnxruntime: loading it again costs a second) and the shapes run."""
    from pipeline.core.memory import runs_that_fit
    from pipeline.core.verify import OnnxSession

    try:
        session = OnnxSession(path, provider=provider)
    except InputError as err:  # the file is ours (AutoCast's output), not the user's input: a failed stage
        reason = str(err).removeprefix(f"{path}: onnxruntime cannot load it: ").replace(str(path), "the converted model").rstrip(".")
        raise _failure(f"{stage}: ModelOpt AutoCast wrote a model onnxruntime cannot load ({reason}); keep the node named there "
                       "in FP32 ([quant] fp16_exclude_nodes or fp16_exclude_op_types) or report it with the model", reason) from err
    checked = []
    for feeds in (run for feed_set in feed_sets for run in runs_that_fit(path, feed_set)):  # a batch too large for memory: in parts
        shapes = {name: list(a.shape) for name, a in feeds.items()}
        try:
            session.run(feeds)
        except StageFailed as err:
            raise _failure(f"{stage}: the converted model does not run at input shapes {shapes}: {err}; "
                           f"exclude the node named there ([quant] fp16_exclude_nodes) or report it with the model", str(err)) from err
        checked.append(shapes)
    return session, checked


def _failure(message: str, reason: str) -> StageFailed:
    """NoKernel where onnxruntime's `reason` names a node it has no kernel for, else StageFailed."""
    found = NO_KERNEL.search(reason)
    return NoKernel(message, found.group(1) or found.group(2)) if found else StageFailed(message)


def _fp32_compute_nodes(model) -> int:
    """Compute nodes AutoCast left in FP32: those fed by a Cast to FP32 inside the graph."""
    import onnx

    to_fp32 = {n.output[0] for n in model.graph.node if n.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in n.attribute)}
    return sum(1 for n in model.graph.node if n.op_type != "Cast" and any(i in to_fp32 for i in n.input))
