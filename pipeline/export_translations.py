"""ONNX translations of torch operators that the dynamo exporter gets wrong, passed as its `custom_translation_table`.

- `aten.bucketize.Tensor`: torch has no ONNX translation for it and decomposes it into an unrolled binary search whose
  GatherND reads one past the boundaries unless there are 2^k - 1 of them, so onnxruntime fails at every shape
  ("GatherND: invalid index found"): SmolVLM's and Idefics3's vision position ids (13 boundaries).
- `aten.arange.start_step` of Python numbers: torch counts its elements in double, the exporter's float32 Range in
  float32: `arange(1/7, 1.0, 1/7)` has 7 elements in torch, 6 in ONNX, and the graph's declared shapes then disagree
  with its values (SmolVLM's vision embeddings again: onnxruntime's "Shape mismatch attempting to re-use buffer").
"""

from __future__ import annotations

from typing import Any

import numpy as np


def bucketize(values: Any, boundaries: Any, out_int32: bool = False, right: bool = False) -> Any:
    """torch.bucketize as a count: the bucket of a value is the number of (sorted) boundaries below it, at or below it
    with `right`. Exact, and no index is ever read."""
    from onnxscript import ir
    from onnxscript import opset18 as op

    column = op.Unsqueeze(values, [-1])
    below = op.LessOrEqual(boundaries, column) if right else op.Less(boundaries, column)
    count = op.ReduceSum(op.Cast(below, to=ir.DataType.INT64), [-1], keepdims=0)
    return op.Cast(count, to=ir.DataType.INT32) if out_int32 else count


def arange_start_step(start: Any, end: Any, step: Any = 1, dtype: int = -1, layout: str = "", device: str = "", pin_memory: bool = False) -> Any:
    """torch.arange of Python numbers as the constant torch computes; of tensors as torch's exporter translates it."""
    import torch
    from onnxscript import ir
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops.core import aten_arange_start_step

    if not all(isinstance(v, int | float) for v in (start, end, step)):
        return aten_arange_start_step(start, end, step, dtype, layout, device, pin_memory)
    chosen = {} if dtype == -1 else {"dtype": torch.from_numpy(np.empty(0, ir.DataType(dtype).numpy())).dtype}
    return op.Constant(value=ir.tensor(torch.arange(start, end, step, **chosen).numpy()))


def custom_translations() -> dict[Any, Any]:
    import torch

    return {torch.ops.aten.bucketize.Tensor: bucketize, torch.ops.aten.arange.start_step: arange_start_step}
