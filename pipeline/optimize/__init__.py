"""Optimize stage: TensorRT-aware rewrites of an ONNX graph, standard ONNX ops only.

`optimize_file(source, target)` is the stage's one public entry: load with onnx_ir (weights
stay lazy), run the rules (pipeline/optimize/rules/, one family per file) by priority to
a fixed point, save atomically, return per-rule statistics.
"""

from __future__ import annotations

import gc
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.collector import collector_paused
from pipeline.core.errors import InputError


@dataclass
class OptimizeResult:
    nodes_before: int
    nodes_after: int
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    rules: list[dict[str, Any]]
    history: list[str]  # rule names in the order their rewrites were applied
    checks: list[str]  # what the written model was checked with (pipeline/optimize/safety.py)

    @property
    def op_delta(self) -> dict[str, int]:
        ops = set(self.ops_before) | set(self.ops_after)
        delta = {op: self.ops_after.get(op, 0) - self.ops_before.get(op, 0) for op in sorted(ops)}
        return {op: d for op, d in delta.items() if d}

    def last_rules(self) -> list[str]:
        return recent_rules(self.history)


def recent_rules(history: list[str]) -> list[str]:
    """The last three distinct rules applied, most recent first."""
    return list(dict.fromkeys(reversed(history)))[:3]


def select_rules(only: list[str] | None = None, skip: list[str] | None = None) -> list:
    from pipeline.optimize.rules import ALL_RULES, RULE_NAMES

    unknown = sorted((set(only or []) | set(skip or [])) - set(RULE_NAMES))
    if unknown:
        raise InputError(f"unknown rule {', '.join(unknown)}; rules are: {', '.join(RULE_NAMES)}")
    return [r for r in ALL_RULES if (not only or r.name in only) and r.name not in (skip or [])]


def describe_rules() -> list[dict[str, Any]]:
    """Every rule in the order it is tried: name, priority, minimum opset, and its rewrite (the rule's docstring)."""
    from pipeline.optimize.engine import PRIORITY_NAMES
    from pipeline.optimize.rules import ALL_RULES

    return [{"rule": r.name, "priority": PRIORITY_NAMES[r.priority], "min_opset": r.min_opset, "rewrite": type(r).__doc__.strip()} for r in ALL_RULES]


def _root_cause(err: BaseException) -> str:
    """The innermost reason of onnx_ir's chained errors, e.g. "Map types are not supported yet"."""
    while err.__cause__ is not None:
        err = err.__cause__
    return str(err).split(". Please contribute")[0].splitlines()[0].rstrip(".")


def _external_tensors(model) -> list[tuple[str, str, int, int | None]]:
    """(name, location, offset, length) of the weights onnx_ir left on disk (external data)."""
    import onnx_ir as ir

    return [(v.name, str(v.const_value.location), v.const_value.offset or 0, v.const_value.length)
            for v in model.graph.initializers.values() if isinstance(v.const_value, ir.ExternalTensor)]


def optimize_model(model, rules: list) -> tuple[Any, list, list[str], dict[str, str], bool]:
    """Local functions inlined, shape inference, then the rules to a fixed point; returns (model,
    per-rule stats, history, the rule that last touched each node, whether shape inference ran)."""
    from pipeline.core.scopes import inline_functions
    from pipeline.optimize.engine import run_rules
    from pipeline.optimize.shapes import infer_shapes

    with collector_paused():
        inline_functions(model)  # modules exported as functions: the rules must see inside them
        # symbolic dims on intermediates let shape subgraphs fold (weights are not serialized for it)
        inferred = infer_shapes(model)
        stats, history, touched = run_rules(model, rules)
    return model, stats, history, touched, inferred


def optimize_file(source: Path, target: Path, only: list[str] | None = None, skip: list[str] | None = None) -> OptimizeResult:
    import onnx_ir as ir

    from pipeline.core.fileio import require_file
    from pipeline.core.irwriter import write_model
    from pipeline.core.onnxfile import HINT, atomic_onnx, check_external_data
    from pipeline.optimize.safety import check_optimized

    rules = select_rules(only, skip)
    require_file(source, "ONNX file", HINT)
    try:
        model = ir.load(source)
    except ir.serde.SerdeError as err:  # protobuf read it; onnx_ir cannot represent something in it
        raise InputError(f"{source}: optimize cannot read this model ({_root_cause(err)}); use it unoptimized") from err
    except Exception as err:  # protobuf raises several types
        raise InputError(f"{source}: not an ONNX model (protobuf cannot parse it: {type(err).__name__}); {HINT}") from err
    check_external_data(_external_tensors(model), Path(source))
    before = Counter(node.op_type for node in model.graph)
    model, stats, history, touched, inferred = optimize_model(model, rules)
    after = Counter(node.op_type for node in model.graph)
    checks = check_optimized(model, Path(source), history, touched, full_check=inferred)
    with atomic_onnx(target) as tmp:
        write_model(model, tmp)
    del model
    gc.collect()  # an onnx_ir graph is a reference cycle: its weights stay until collected, beside the check's session
    return OptimizeResult(
        sum(before.values()), sum(after.values()), dict(before), dict(after),
        [s.as_dict() for s in stats], history, checks,
    )

