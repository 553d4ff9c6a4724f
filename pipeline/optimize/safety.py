"""The writer's safety net: before the optimized model replaces its target, it must pass the checks its input
passes: `onnx.checker` with `full_check` (a plain check when shape inference rejected the input), then loading in
onnxruntime CPU with graph optimizations off (its own type inference, inside If/Loop/Scan bodies too). Both run on
the model without its large weights (bert-base: 0.2 MB instead of 440 MB; neither check reads a weight's values).
A failure is one line naming the failing node and the rule that last touched it; nothing is written.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import onnx_ir as ir

from pipeline.core.errors import StageFailed
from pipeline.optimize import recent_rules

log = logging.getLogger(__name__)

CHECKER, ONNXRUNTIME = "onnx.checker", "onnxruntime loading"
# how onnx and onnxruntime name a node in their messages: "node name: X)", "Node (X) Op (T)", "Name:'X'"
NODE_PATTERNS = (re.compile(r"node name: ([^)\s]*)\)"), re.compile(r"Node \(([^)]*)\) Op \((\w+)\)"), re.compile(r"Name:'([^']*)'"),
                 re.compile(r"Name: (\S+) OpType"))


def check_optimized(model: ir.Model, source: Path, history: list[str], touched: dict[str, str], full_check: bool) -> list[str]:
    """Raise StageFailed when the optimized `model` fails a check its input `source` passes; return the
    names of the checks it passed (a check the input fails too is not asked of it, and not listed)."""
    from pipeline.optimize.shapes import proto_without_weights

    proto, original, passed = proto_without_weights(model), None, []
    for check in (CHECKER, ONNXRUNTIME):
        detail = _run(check, proto, full_check)
        if detail is None:
            passed.append(f"{CHECKER} (full)" if check == CHECKER and full_check else check)
            continue
        original = original if original is not None else proto_without_weights(ir.load(source))
        if _run(check, original, full_check) is None:
            raise StageFailed(f"optimize: the optimized model fails {check}, so nothing was written: {detail}; {_culprit(detail, history, touched)}")
        log.info("note: %s rejects the input %s too, so it is not asked of the output (%s)", check, source, detail)
    return passed


def _run(check: str, proto, full_check: bool) -> str | None:
    """Why `proto` fails `check`, in one line, or None when it passes."""
    import onnx

    try:
        if check == CHECKER:
            onnx.checker.check_model(proto, full_check=full_check)
        else:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.log_severity_level = 4
            options.intra_op_num_threads = options.inter_op_num_threads = 1  # loaded, never run: no thread pool
            ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - onnx and onnxruntime raise several untyped errors; each is the reason
        return " ".join(str(err).split())[:400]
    return None


def _culprit(detail: str, history: list[str], touched: dict[str, str]) -> str:
    """Which rule to blame: the one that last touched the node the message names, else the last applied."""
    for pattern in NODE_PATTERNS:
        match = pattern.search(detail)
        if match and match.group(1) in touched:
            rule = touched[match.group(1)]
            return f"node {match.group(1)} was last touched by rule {rule}; skip it with --skip-rules {rule} and report this"
    if not history:
        return "no rule changed the graph; report this"
    last = recent_rules(history)
    return f"last rules applied: {', '.join(last)}; skip them with --skip-rules {','.join(last)} and report this"
