"""INT8 stage: explicit Q/DQ placed by ModelOpt PTQ (quant/ptq.py: on a private copy, on our samples), calibrated
on the data given, then shaped by a placement preset (quant/presets.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.onnxfile import atomic_onnx, save_onnx
from pipeline.core.samples import batch_axes, split
from quant.calibration import calibration_reader
from quant.ptq import MODELOPT_ARGUMENTS


@dataclass(frozen=True)
class Int8Result:
    preset: str
    high_precision_dtype: str
    calibration_samples: int
    calibration_method: str
    disable_mha_qdq: bool
    qdq_pairs: int
    qdq_removed_by_preset: list[str]
    notes: list[str]
    findings: list  # quant.lint.Finding: the result's Q/DQ placement checked against TensorRT's rules


def quantize_int8(
    source: Path,
    target: Path,
    calibration: dict[str, np.ndarray] | list[dict[str, np.ndarray]],
    batch: int,
    preset_name: str,
    high_precision_dtype: str,
    calibration_method: str = "entropy",
    max_sequence: int | None = None,
    on_step: Callable[[int, int], None] = lambda done, total: None,
    nodes_to_exclude: list[str] | None = None,
) -> Int8Result:
    """Q/DQ `source` into `target`; `nodes_to_exclude`: regular expressions of nodes left unquantized, besides the preset's."""
    from quant.lint import lint_model
    from quant.patterns import attention_state
    from quant.ptq import run_with_preset

    feeds = calibration if isinstance(calibration, list) else split(calibration, batch, batch_axes(source))  # a list: feeds of their own shapes
    preset, plan, model, removed = run_with_preset(
        source, target, "int8", preset_name, max_sequence, nodes_to_exclude or [], hint="try another --preset", quantize_mode="int8",
        calibration_data_reader=calibration_reader(feeds, on_step), calibration_method=calibration_method, high_precision_dtype=high_precision_dtype,
        **MODELOPT_ARGUMENTS,
    )
    with atomic_onnx(target) as tmp:
        save_onnx(model, tmp)
    pairs = sum(1 for n in model.graph.node if n.op_type == "DequantizeLinear")  # a weight's Q is folded into its INT8 values
    notes = [*plan.notes, f"attention MatMuls in the result: {attention_state(model)}"]
    findings = lint_model(model, max_sequence)
    return Int8Result(preset.name, high_precision_dtype, sum(len(f[next(iter(f))]) for f in feeds), calibration_method, plan.disable_mha_qdq, pairs, removed, notes, findings)
