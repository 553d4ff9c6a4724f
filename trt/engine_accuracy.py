"""Does the engine compute what the model computes? Polygraphy's Comparator runs the engine and the FP32 ONNX
(onnxruntime, CPU) on the same held-out inputs: a Q/DQ model on onnxruntime is not the engine, which fuses,
picks kernels and runs the float parts in the model's precision."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import StageFailed
from trt.polygraphy_log import polygraphy_log

ENGINE, ONNX = "tensorrt", "onnxruntime-fp32"


@dataclass(frozen=True)
class EngineRun:
    """Per held-out sample, the model's outputs in its output order: from onnxruntime and from the engine.
    `not_compared` says why there are none."""

    onnx: list[list[Any]]
    engine: list[list[Any]]
    not_compared: str = ""


def run_engine_and_onnx(engine_path: Path, onnx_path: Path, feed_sets: list[dict[str, Any]]) -> EngineRun:
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner
    from polygraphy.comparator import Comparator
    from polygraphy.exception import DataTypeConversionException, PolygraphyException

    runners = [TrtRunner(EngineFromBytes(engine_path.read_bytes()), name=ENGINE),
               OnnxrtRunner(SessionFromOnnx(str(onnx_path), providers=["CPUExecutionProvider"]), name=ONNX)]
    lines: list[str] = []
    try:
        with polygraphy_log(lines, "warning"):
            results = dict(Comparator.run(runners, data_loader=feed_sets).items())
    except DataTypeConversionException as err:
        return EngineRun([], [], f"an engine output has no numpy type, which Polygraphy's TrtRunner cannot read back ({_one_line(err)})")
    except PolygraphyException as err:
        errors = [" ".join(line.split()) for line in lines if line.startswith("[E]")][:3]
        raise StageFailed("; ".join([f"{engine_path}: Polygraphy could not run the engine and {onnx_path} on the held-out inputs: {_one_line(err)}",
                                     *errors])) from err
    names = list(results[ONNX][0].keys())
    missing = [name for name in names if name not in results[ENGINE][0]]
    if missing:
        raise StageFailed(f"{engine_path}: the engine has no output {missing[0]!r}, which {onnx_path} has; was it built from another model?")
    return EngineRun([[sample[name] for name in names] for sample in results[ONNX]],
                     [[sample[name] for name in names] for sample in results[ENGINE]])


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())
