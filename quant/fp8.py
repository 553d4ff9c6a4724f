"""FP8 stage: explicit FP8 (E4M3) Q/DQ placed by ModelOpt PTQ (`quantize_mode="fp8"`, max
calibration on our samples, CPU provider), shaped by a placement preset, checked against FP32.

The result is written at opset >= 21: ModelOpt moves FP8 Q/DQ of attention through Transpose
(Q -> Transpose -> DQ), and ONNX allows float8 tensors in Transpose/Reshape only from opset 21;
below it onnxruntime refuses the file ("Type 'tensor(float8e4m3fn)' of input parameter ... of
operator (Transpose) is invalid"). TensorRT builds FP8 only on GPUs of compute capability 8.9+
(Ada, Hopper, Blackwell); the file itself runs anywhere onnxruntime does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from pipeline.core.errors import InputError
from quant.ptq import MODELOPT_ARGUMENTS, PtqResult, check_calibration, opset_of, qdq_counts, write_checked

FP8_MIN_OPSET = 21


def quantize_fp8(
    source: Path,
    target: Path,
    calibration: dict[str, np.ndarray],
    batch: int,
    held_out: list[dict[str, np.ndarray]],
    reference=None,
    preset_name: str = "auto",
    high_precision_dtype: str = "fp16",
    max_sequence: int | None = None,
    opset: int | None = None,
    *,
    min_cosine: float,
    on_step: Callable[[int, int], None] = lambda done, total: None,
    nodes_to_exclude: list[str] = (),
) -> PtqResult:
    """Quantize `source` to FP8 Q/DQ and write `target` only if it runs; `reference` is the FP32 outputs
    on `held_out` (array or BackgroundOutputs), or None to compute them from `source`. `nodes_to_exclude`:
    regular expressions of nodes left unquantized, beside those the preset leaves."""
    from pipeline.core.samples import batch_axes, split
    from quant.calibration import calibration_reader
    from quant.lint import lint_model
    from quant.ptq import run_with_preset

    if opset is not None and opset < FP8_MIN_OPSET:
        raise InputError(f"fp8: opset {opset} is below {FP8_MIN_OPSET}, the first ONNX opset whose Transpose/Reshape accept float8 "
                         f"tensors (ModelOpt places FP8 Q -> Transpose -> DQ in attention); pass opset >= {FP8_MIN_OPSET} or leave it unset")
    samples = check_calibration(calibration, batch, 1, "fp8", "max")
    preset, plan, model, removed = run_with_preset(
        source, target, "fp8", preset_name, max_sequence, nodes_to_exclude, min_opset=max(FP8_MIN_OPSET, opset or 0), quantize_mode="fp8",
        calibration_data_reader=calibration_reader(split(calibration, batch, batch_axes(source)), on_step), calibration_method="max",
        high_precision_dtype=high_precision_dtype, **MODELOPT_ARGUMENTS,
    )
    figures = write_checked(model, target, source, reference, held_out)
    notes = [*plan.notes, f"preset {preset.name} removed {len(removed)} Q/DQ node(s)"]
    return PtqResult("fp8", "max", samples, opset_of(model), qdq_counts(model), figures, min_cosine,
                     figures["cosine_centered"] >= min_cosine, notes, lint_model(model, max_sequence), preset.name)
