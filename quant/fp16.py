"""FP16 stage: ModelOpt AutoCast turns an FP32 ONNX into a mixed FP16 model (inputs/outputs kept FP32).

TensorRT 11 takes precision only from the ONNX (strongly typed networks), so the FP16 engine
is built from this file. AutoCast keeps in FP32 the nodes whose values would overflow FP16
and those the profile excludes.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import InputError
from pipeline.fileio import atomic_path


@dataclass(frozen=True)
class Fp16Result:
    providers: list[str]
    nodes: int
    fp32_nodes_kept: int


def convert_fp16(source: Path, target: Path, op_types_to_exclude: list[str], nodes_to_exclude: list[str]) -> Fp16Result:
    import onnx
    from modelopt.onnx.autocast import convert_to_mixed_precision

    from pipeline.devices import cuda_device_present

    providers = ["cuda", "cpu"] if cuda_device_present() else ["cpu"]
    logging.getLogger("modelopt").setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            model = convert_to_mixed_precision(
                onnx_path=str(source), low_precision_type="fp16", keep_io_types=True, providers=providers,
                op_types_to_exclude=op_types_to_exclude or None, nodes_to_exclude=nodes_to_exclude or None,
            )
    except (ValueError, KeyError) as err:
        raise InputError(f"fp16: ModelOpt AutoCast cannot convert {source}: {err}") from err
    with atomic_path(target) as tmp:
        onnx.save(model, str(tmp))
    return Fp16Result(providers, len(model.graph.node), _fp32_compute_nodes(model))


def _fp32_compute_nodes(model) -> int:
    """Compute nodes AutoCast left in FP32: those fed by a Cast to FP32 inside the graph."""
    import onnx

    to_fp32 = {n.output[0] for n in model.graph.node if n.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in n.attribute)}
    return sum(1 for n in model.graph.node if n.op_type != "Cast" and any(i in to_fp32 for i in n.input))
