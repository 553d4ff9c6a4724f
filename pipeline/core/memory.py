"""What a run of an ONNX model costs in memory at given input shapes, before it runs: the peak of the
tensors alive at once, walking the nodes in order (onnxruntime's order on CPU) with the shapes onnxruntime's
symbolic shape inference gives at those input shapes; and how to split a feed set whose run would not fit
into runs of fewer rows along the batch axis."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.onnxfile import constants_as_tensors

# a run's peak resident growth measured 0.68-1.13x the estimate with onnxruntime's CPU arena (ResNet-50 at 224 batch
# 8 and 16, a 2-layer EfficientNet at 300 batch 4 and 8, at 600 batch 2: 0.94x); the check sessions now run without
# it (pipeline/core/verify.py), and the factor is the margin
ARENA_FACTOR = 1.5
SHARE_OF_AVAILABLE = 0.5  # a check may take half the memory available now: the FP32 reference and the stage's own data share it


def peak_activation_bytes(path: Path, shapes: dict[str, list[int]]) -> int:
    """The largest sum of intermediate tensors alive at once when the model at `path` runs on inputs
    of `shapes`, weights not counted; 0 where the shapes cannot be inferred (nothing known, nothing refused)."""
    import onnx
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from pipeline.core.symbolic_shapes import without_stray_files

    without_stray_files()
    sized = onnx.load(str(path), load_external_data=False)
    del sized.graph.value_info[:]  # the exporter's shapes keep their symbolic dims: inferred again at these sizes
    for output in sized.graph.output:
        output.type.tensor_type.ClearField("shape")
    for value in sized.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            for dim, size in zip(dims, shapes[value.name], strict=False):
                dim.Clear()
                dim.dim_value = size
    constants_as_tensors(sized)
    sizes: dict[str, int] = {}
    # onnxruntime's inference folds the shape arithmetic exporters write (a Pad's computed pads, a ReduceMean's axes)
    # where ONNX's own stops; where both know a size, ONNX's wins
    for infer in (lambda m: SymbolicShapeInference.infer_shapes(m, auto_merge=True), lambda m: onnx.shape_inference.infer_shapes(m, data_prop=True)):
        try:
            inferred = infer(sized)
        except Exception:  # an operator it cannot infer
            continue
        sizes |= {v.name: _bytes(v) for v in (*inferred.graph.value_info, *inferred.graph.output) if _bytes(v)}
    nodes = sized.graph.node
    for node in nodes:  # a reshape keeps its input's size whatever shape was inferred (onnxruntime's reads Shape's start/end wrong)
        if node.op_type in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity") and node.input[0] in sizes:
            sizes[node.output[0]] = sizes[node.input[0]]
    last_use = {name: i for i, node in enumerate(nodes) for name in (*node.input, *node.output)}
    produced = {name for node in nodes for name in node.output} - {o.name for o in sized.graph.output}
    alive, peak = 0, 0
    for i, node in enumerate(nodes):  # a node's outputs are allocated while its inputs are alive; each is freed after its last use
        alive += sum(sizes.get(name, 0) for name in node.output)
        peak = max(peak, alive)
        alive -= sum(sizes.get(name, 0) for name in {*node.input, *node.output} if name in produced and last_use[name] == i)
    return peak


def runs_that_fit(path: Path, feeds: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """`feeds` (a batch along axis 0 of every input) as one run, or as runs of fewer rows each when the
    estimated peak of the whole batch would not fit in its share of the memory available now."""
    rows = len(next(iter(feeds.values())))
    if rows <= 1 or len({a.shape[0] if a.ndim else 0 for a in feeds.values()}) != 1:
        return [feeds]
    peak = ARENA_FACTOR * _estimate(str(path), Path(path).stat().st_mtime_ns, tuple((name, a.shape) for name, a in feeds.items()))
    budget = SHARE_OF_AVAILABLE * available_bytes()
    if peak <= budget:
        return [feeds]
    step = max(1, int(rows * budget // peak))
    return [{name: array[start : start + step] for name, array in feeds.items()} for start in range(0, rows, step)]


@functools.lru_cache(maxsize=64)
def _estimate(path: str, version: int, shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> int:
    """peak_activation_bytes once per file version and shapes: every accuracy run asks (`version`: its mtime)."""
    return peak_activation_bytes(Path(path), {name: list(shape) for name, shape in shapes})


def available_bytes() -> int:
    """Bytes this machine can give now (MemAvailable on Linux, else free physical pages)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def gib(size: float) -> str:
    """A size in bytes as the memory lines say it."""
    return f"{size / 2**30:.1f} GiB"


def _bytes(value: Any) -> int:
    import onnx

    tensor = value.type.tensor_type
    if not tensor.HasField("shape") or not tensor.elem_type:
        return 0
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tensor.shape.dim]
    if any(d <= 0 for d in dims):
        return 0
    return int(np.prod(dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
