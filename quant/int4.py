"""INT4 stage: weight-only, blocked INT4 for MatMul/Gemm weights by ModelOpt PTQ
(`quantize_mode="int4"`), checked against FP32. Activations stay in float: only DequantizeLinear
nodes of INT4 initializers are added (opset 21, the first with INT4 tensors).

Methods: `awq_clip` (ModelOpt's default AWQ, activation-aware: runs the model on our calibration
samples with onnxruntime's CPU provider) and `rtn_dq` (round to nearest, no data). ModelOpt 0.47's
AWQ writes a Gemm with transB=1 (a classifier head) with its block scales on the wrong axis, which
onnxruntime refuses ("x_scale must be ceil(Di/block_size) on the quantize axis"): under AWQ those
Gemms are left in float and named in the notes; RTN quantizes them correctly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from pipeline.core.errors import InputError
from quant.ptq import PtqResult, check_calibration, opset_of, qdq_counts, run_modelopt, write_checked

METHODS = ("awq_clip", "rtn_dq")
DEFAULT_METHOD = "awq_clip"
DEFAULT_BLOCK_SIZE = 128


def eligible_gemms(model) -> list[str]:
    """MatMul/Gemm nodes whose weight is a 2-D constant initializer (what ModelOpt's INT4 quantizes)."""
    initializers = {i.name: list(i.dims) for i in model.graph.initializer}
    return [n.name for n in model.graph.node
            if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and len(initializers.get(n.input[1], [])) == 2]


def quantize_int4(
    source: Path,
    target: Path,
    calibration: dict[str, np.ndarray],
    batch: int,
    held_out: list[dict[str, np.ndarray]],
    reference=None,
    method: str = DEFAULT_METHOD,
    block_size: int = DEFAULT_BLOCK_SIZE,
    *,
    min_cosine: float,
    on_step: Callable[[int, int], None] = lambda done, total: None,
) -> PtqResult:
    """Quantize the MatMul/Gemm weights of `source` to INT4 and write `target` only if it runs;
    `reference` as in quant.fp8.quantize_fp8."""
    from pipeline.core.onnxfile import load_onnx
    from pipeline.core.samples import batch_axes, split
    from quant.calibration import calibration_reader
    from quant.fp16 import exact_names
    from quant.lint import lint_model

    if method not in METHODS:
        raise InputError(f"int4: method {method!r}: use one of {', '.join(METHODS)}")
    source_model = load_onnx(source)
    eligible = eligible_gemms(source_model)
    if not eligible:
        raise InputError(f"int4: {source} has no MatMul/Gemm with a constant 2-D weight, and INT4 is "
                         "weight-only for those: use --int8 or --fp8 for this model")
    notes = [f"{len(eligible)} MatMul/Gemm weight(s) eligible"]
    excluded: list[str] = []
    if method == "awq_clip":
        excluded = [n.name for n in source_model.graph.node if n.op_type == "Gemm" and n.name in eligible
                    and any(a.name == "transB" and a.i == 1 for a in n.attribute)]
        if excluded:
            notes.append(f"AWQ leaves Gemm(transB=1) in float (ModelOpt 0.47 writes their scales on the wrong axis): {', '.join(excluded)}")
        if len(excluded) == len(eligible):
            raise InputError(f"int4: every eligible weight of {source} is a Gemm with transB=1, which ModelOpt's AWQ cannot quantize; use round to nearest: [quant] int4_method = \"rtn_dq\"")
        samples = check_calibration(calibration, batch, 1, "int4", "AWQ")
        reader = calibration_reader(split(calibration, batch, batch_axes(source)), on_step)
    else:
        samples, reader = 0, None
    del source_model
    model = run_modelopt(source, target, "int4", quantize_mode="int4", calibration_method=method, calibration_data_reader=reader,
                         block_size=block_size, nodes_to_exclude=exact_names(excluded) or None)
    figures = write_checked(model, target, source, reference, held_out)
    counts = qdq_counts(model)
    notes.append(f"block size {block_size}; {counts['dequantize']} INT4 weight DequantizeLinear node(s)")
    return PtqResult("int4", method, samples, opset_of(model), counts, figures, min_cosine,
                     figures["cosine_centered"] >= min_cosine, notes, lint_model(model))
