"""What the INT8, FP8 and INT4 entries share: ModelOpt's ONNX PTQ run on a private copy, quietly, its
errors as ours; the Q/DQ counts of the result; and its accuracy against the FP32 model.

Calibration always uses our samples on the CPU provider (never ModelOpt's built-in random data, whose token ids
can leave the vocabulary and crash Gather) and never `calibrate_per_node` (~600x slower on CPU). ModelOpt rewrites
the file it is given (shape inference in place) and writes intermediates beside it: it never gets the caller's file.
A model whose weights are in a data file is quantized with ModelOpt's intermediates in data files too: ModelOpt decides
from the model's size before it copies each shared weight (a tied embedding: 545 MB on Qwen2.5-0.5B), which took that
decoder's 1.9 GB past protobuf's 2 GB ("Failed to serialize proto").
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import InputError, StageFailed

MODELOPT_ERRORS = (ValueError, KeyError, RuntimeError, AssertionError, IndexError, TypeError, NotImplementedError)
GEMV_DETECTING_MODES = ("int8", "fp8")  # the modes whose ModelOpt quantizer leaves GEMVs and small GEMMs in float

# ModelOpt arguments the INT8 and FP8 stages always pass (and the benchmarks' direct calls with them): weights stored in
# INT8/FP8 behind a DequantizeLinear, which TensorRT takes as pre-quantized weights, instead of in float behind a Q/DQ pair:
# a quarter (FP32) or half (FP16) of their bytes on disk, onnxruntime's check sessions fold one node per weight instead of
# two, and the checked weights are the engine's to the bit (a Q/DQ pair leaves the rounding to each runtime: onnxruntime's
# CPU Q divides an FP16 weight by its scale in FP32, ModelOpt rounds the quotient to FP16 first; in bert-tiny's FP8 model
# 0.45% of the weights came out one FP8 step apart, and its check read cosine_centered 0.9899 against 0.9921)
MODELOPT_ARGUMENTS = {"dq_only": True}


@dataclass(frozen=True)
class PtqResult:
    precision: str  # "fp8" or "int4"
    method: str  # the calibration / weight-quantization method that ran
    calibration_samples: int
    opset: int
    qdq: dict[str, Any]  # Q and DQ node counts and the quantized types of their data
    accuracy: dict[str, Any]  # quant.accuracy.accuracy against the FP32 model on the held-out samples
    min_cosine: float  # the gate on accuracy["cosine_centered"]
    passed: bool
    notes: list[str]
    findings: list  # quant.lint.Finding
    preset: str | None = None  # the Q/DQ placement preset that ran (FP8)

    def metrics(self) -> dict[str, Any]:
        """What the stage records in the manifest (the lint as counts, like the INT8 stage)."""
        from quant.lint import findings_json

        lint = findings_json(self.findings)
        return {**{k: v for k, v in asdict(self).items() if k != "findings" and v is not None}, "lint": {"count": lint["count"], "by_rule": lint["by_rule"]}}


def check_calibration(calibration: dict[str, np.ndarray], batch: int, minimum: int, stage: str, method: str) -> int:
    """The number of calibration samples; too few for the method is one line."""
    rows = len(next(iter(calibration.values()))) if calibration else 0
    if rows < max(minimum, batch):
        raise InputError(f"{stage}: {rows} calibration sample(s), {method} calibration needs at least {max(minimum, batch)} "
                         f"(one batch of {batch}{f', and {minimum} for {method}' if minimum > batch else ''}); "
                         "pass more samples (--calib FILE.npz or [quant] samples in the profile)")
    return rows


def run_modelopt(source: Path, beside: Path, stage: str, model=None, hint: str = "", **arguments: Any):
    """`modelopt.onnx.quantization.quantize(**arguments)` on a private copy of `source` (in a work folder
    beside `beside`); returns the quantized ModelProto. `model` is `source` already loaded (without its
    weights), if the caller has it. ModelOpt failing on the valid model is a failed stage (StageFailed,
    exit 1) naming the file, with `hint` as what to try."""
    import onnx
    from modelopt.onnx.quantization import quantize

    from pipeline.core.onnxfile import external_tensors, load_onnx, private_copy
    from pipeline.core.verify import onnxruntime_errors, run_failure
    from quant import before_modelopt, check_room_for_modelopt, modelopt_step

    check_room_for_modelopt(source, modelopt_step(arguments["quantize_mode"], arguments.get("calibration_method")), stage)
    model = model if model is not None else load_onnx(source)
    logging.getLogger("modelopt").setLevel(logging.ERROR)
    before_modelopt()  # lief is imported with modelopt.onnx.quantization, just above
    external = external_tensors(model)
    with private_copy(source, external, beside=beside) as (workdir, copy):
        if name_anonymous_input_dims(model):
            onnx.save(model, str(copy))
        del model
        output = workdir / "quantized.onnx"
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # ModelOpt's tqdm bars
                if arguments["quantize_mode"] in GEMV_DETECTING_MODES:
                    arguments = small_gemms_excluded_exactly(copy, arguments, bool(external))
                quantize(onnx_path=str(copy), calibration_eps=["cpu"], calibrate_per_node=False, output_path=str(output), log_level="ERROR",
                         use_external_data_format=bool(external), **arguments)
        except (*MODELOPT_ERRORS, *onnxruntime_errors()) as err:  # ModelOpt's calibration runs the model on onnxruntime
            raise StageFailed(f"{stage}: ModelOpt cannot quantize {source}: {type(err).__name__}: {run_failure(err)}; "
                             f"{hint + ', or ' if hint else ''}rerun with --debug for ModelOpt's traceback") from err
        return onnx.load(str(output))


def run_with_preset(source: Path, target: Path, stage: str, preset_name: str, max_sequence: int | None, nodes_to_exclude: list[str],
                    min_opset: int | None = None, hint: str = "", **arguments: Any):
    """`run_modelopt` with the Q/DQ placed by the preset `preset_name` (`nodes_to_exclude`: regular expressions of nodes
    left unquantized besides the preset's), at opset >= `min_opset` and the source's when given.
    Returns (preset, plan, quantized model, the names of the Q/DQ nodes the preset removed)."""
    from pipeline.core.onnxfile import load_onnx
    from quant.fp16 import exact_names
    from quant.presets import apply_preset, plan_preset, resolve_preset

    source_model = load_onnx(source)
    preset = resolve_preset(preset_name, source_model)
    plan = plan_preset(preset, source_model, max_sequence)
    if min_opset is not None:
        arguments["opset"] = max(min_opset, opset_of(source_model))
    model = run_modelopt(source, target, stage, model=source_model, hint=hint, op_types_to_quantize=plan.op_types_to_quantize,
                         disable_mha_qdq=plan.disable_mha_qdq, nodes_to_exclude=[*exact_names(plan.nodes_to_exclude), *nodes_to_exclude] or None, **arguments)
    return preset, plan, model, apply_preset(preset, model, frozenset(plan.nodes_to_exclude))


def small_gemms_excluded_exactly(path: Path, arguments: dict[str, Any], external_data: bool) -> dict[str, Any]:
    """`arguments` with ModelOpt's GEMV / small-GEMM exclusion (a MatMul or Gemm whose M or N is 1, or K or N under 16, on
    the first calibration feed) run here and passed as exact names, its own turned off. ModelOpt adds the names it finds
    to `nodes_to_exclude`, which it reads as regular expressions matched at the start of a name: JetMoE's router
    `node_linear` (8 experts: N = 8) left every `node_linear_*`, all 70 GEMMs, in float (and `node_linear_1` would take
    `node_linear_10` to `node_linear_19` with it)."""
    from modelopt.onnx.quantization.graph_utils import find_nodes_from_matmul_to_exclude

    from quant.fp16 import exact_names

    small = find_nodes_from_matmul_to_exclude(str(path), external_data, calibration_data_reader=arguments["calibration_data_reader"], calibration_eps=["cpu"])
    exact = exact_names(sorted(name for name in small if name))
    return {**arguments, "enable_gemv_detection_for_trt": False, "nodes_to_exclude": [*(arguments.get("nodes_to_exclude") or []), *exact] or None}


def name_anonymous_input_dims(model) -> list[str]:
    """Name each graph input dimension that has neither a size nor a name (skl2onnx writes a dynamic batch
    so): ModelOpt 0.47 compares every input dimension with 0 and fails on one (TypeError on None).
    Returns the names given, `<input>_dim<axis>`; the model is changed in place."""
    named = []
    for value in model.graph.input:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else ()):
            if not dim.HasField("dim_value") and not dim.HasField("dim_param"):
                dim.dim_param = f"{value.name}_dim{axis}"
                named.append(dim.dim_param)
    return named


def qdq_counts(model) -> dict[str, Any]:
    """Q and DQ nodes, and the element types they quantize to (read from zero points and DQ data)."""
    import onnx

    initializers = {i.name: i.data_type for i in model.graph.initializer}
    types: Counter[str] = Counter()
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear":
            tensor = node.input[2] if len(node.input) > 2 and node.input[2] else node.input[0]
            if tensor in initializers:
                types[onnx.TensorProto.DataType.Name(initializers[tensor])] += 1
    ops = Counter(n.op_type for n in model.graph.node)
    return {"quantize": ops["QuantizeLinear"], "dequantize": ops["DequantizeLinear"], "dequantize_types": dict(types)}


def opset_of(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def write_checked(model, target: Path, source: Path, reference, held_out: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """Write `model` to `target` only if it runs on `held_out`; return its quant.accuracy figures against the FP32
    outputs: `reference` is those outputs (an array, or a BackgroundOutputs still running beside the conversion),
    or None to run the FP32 model `source` for them."""

    from pipeline.core.onnxfile import atomic_onnx, save_onnx
    from quant.accuracy import checked

    with atomic_onnx(target) as tmp:
        save_onnx(model, tmp)
        return checked(tmp, held_out, reference, Path(source), sum(len(next(iter(b.values()))) for b in held_out))
