"""The optimize stage on ONNX's own backend node tests (the models that ship inside the `onnx` package).

For every `onnx/backend/test/data/node/<test>/model.onnx` with its `test_data_set_0` inputs:
run the model on onnxruntime CPU (graph optimizations off) as given; if onnxruntime cannot
load or run it, the model is skipped with onnxruntime's reason. Otherwise optimize it
(`optimize_file`, in process) and run the result on the same inputs. Outcomes:
  same       every output equals the original's onnxruntime output (floats within the optimize
             stage's tolerance, max |a - b| <= 1e-5; everything else exactly; sequences and
             optionals element by element), and wherever the original's output matches the test's
             expected output (the ONNX runner's rtol 1e-3, atol 1e-7) the optimized one does too
  declined   optimize refused the model with one line (a PipelineError); nothing was written
  changed    the optimized model loads but gives other outputs, or does not load or run
  error      optimize raised anything else (a bug)
The safety net's cost (pipeline/optimize/safety.py) is measured on a large model given with
--cost-model PATH (bench/optimize_speed.py's bert-base export): the check alone, and the whole
optimize_file call (load, rules, check, write), 5 runs each, median and min-max.
Run: python bench/onnx_backend_suite.py [--every K] [--cli N] [--cost-model BERT.onnx]  -> bench/results/onnx_backend_suite.json
(--every K checks every K-th model by sorted name, as the CI test does; --cli N also runs N models
through `python -m pipeline optimize` and checks the written files the same way.)
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "onnx_backend_suite.json"
NODE_TESTS = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
TOLERANCE = 1e-5  # the optimize stage's default (OptimizeSection.tolerance)
EXPECTED_RTOL, EXPECTED_ATOL = 1e-3, 1e-7  # onnx.backend.test.runner's defaults


def node_tests() -> list[Path]:
    """Every node test folder, sorted by name."""
    return sorted(p.parent for p in NODE_TESTS.glob("*/model.onnx"))


def _read_value(path: Path, type_proto: onnx.TypeProto) -> Any:
    """One test_data_set .pb file as onnxruntime takes it: an array, a list (sequence), or None/value (optional)."""
    data = path.read_bytes()
    if type_proto.HasField("sequence_type"):
        sequence = onnx.SequenceProto()
        sequence.ParseFromString(data)
        return numpy_helper.to_list(sequence)
    if type_proto.HasField("optional_type"):
        optional = onnx.OptionalProto()
        optional.ParseFromString(data)
        return numpy_helper.to_optional(optional)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return numpy_helper.to_array(tensor)


def load_case(folder: Path) -> tuple[dict[str, Any], list[Any]]:
    """(feeds by input name, expected outputs in order) of test_data_set_0."""
    model = onnx.load(folder / "model.onnx", load_external_data=False)
    data = folder / "test_data_set_0"
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    feeds = {i.name: _read_value(data / f"input_{n}.pb", i.type) for n, i in enumerate(inputs) if (data / f"input_{n}.pb").exists()}
    expected = [_read_value(data / f"output_{n}.pb", o.type) for n, o in enumerate(model.graph.output) if (data / f"output_{n}.pb").exists()]
    return feeds, expected


def run_ort(path: Path, feeds: dict[str, Any]) -> list[Any]:
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # a model onnxruntime cannot run is recorded, not logged
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def differs(a: Any, b: Any, close) -> str | None:
    """Why `b` is not `a` (element by element through sequences and optionals), or None."""
    if a is None or b is None:
        return None if a is None and b is None else "one optional is empty"
    if isinstance(a, list) or isinstance(b, list):
        if not (isinstance(a, list) and isinstance(b, list)) or len(a) != len(b):
            return "sequence lengths differ"
        return next((f"element {i}: {why}" for i, (x, y) in enumerate(zip(a, b, strict=True)) if (why := differs(x, y, close))), None)
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    if a.dtype.kind in "fc" and b.dtype.kind in "fc":
        return None if close(a, b) else f"max |diff| {np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0):.3g}"
    if a.dtype != b.dtype and not (a.dtype.kind in "OUS" and b.dtype.kind in "OUS"):
        return f"dtype {a.dtype} vs {b.dtype}"
    return None if np.array_equal(a, b) else "values differ"


def _within_tolerance(a: np.ndarray, b: np.ndarray) -> bool:
    """max |a - b| <= TOLERANCE; NaNs at the same places, equal infinities equal."""
    wide = np.complex128 if "c" in (a.dtype.kind, b.dtype.kind) else np.float64
    a, b = a.astype(wide), b.astype(wide)
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    with np.errstate(invalid="ignore"):
        diff = np.where((a == b) | np.isnan(a), 0, np.abs(a - b))
    return bool(np.max(diff, initial=0) <= TOLERANCE)


def _matches_expected(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.allclose(a.astype(np.float64) if a.dtype.kind == "f" else a, b, rtol=EXPECTED_RTOL, atol=EXPECTED_ATOL, equal_nan=True))


def compare(original: list[Any], optimized: list[Any], expected: list[Any]) -> str | None:
    """Why the optimized outputs are not the original's, or None when they are."""
    if len(original) != len(optimized):
        return f"{len(optimized)} outputs instead of {len(original)}"
    for i, (a, b) in enumerate(zip(original, optimized, strict=True)):
        if why := differs(a, b, _within_tolerance):
            return f"output {i} differs from the original's: {why}"
        if i < len(expected) and differs(expected[i], a, _matches_expected) is None and (why := differs(expected[i], b, _matches_expected)):
            return f"output {i} no longer matches the expected output: {why}"
    return None


def interface_changed(source: Path, target: Path) -> str | None:
    """Why the optimized model's inputs or outputs (names and types) are not the original's, or None."""
    def interface(path: Path) -> list:
        graph = onnx.load(path, load_external_data=False).graph
        initializers = {i.name for i in graph.initializer}
        return [[(v.name, v.type.WhichOneof("value"), _elem_type(v.type)) for v in values]
                for values in ([i for i in graph.input if i.name not in initializers], graph.output)]

    before, after = interface(source), interface(target)
    target.unlink(missing_ok=True)
    return None if before == after else f"inputs/outputs changed: {before} -> {after}"


def _elem_type(type_proto: onnx.TypeProto) -> int:
    while not type_proto.HasField("tensor_type"):
        kind = type_proto.WhichOneof("value")
        if kind not in ("sequence_type", "optional_type"):
            return -1
        type_proto = getattr(type_proto, kind).elem_type
    return type_proto.tensor_type.elem_type


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"


def check(folder: Path, workdir: Path, via_cli: bool = False) -> dict[str, Any]:
    """One node test through optimize: {"test", "outcome", "reason", "original_matches_expected"}."""
    from pipeline.core.errors import PipelineError
    from pipeline.optimize import optimize_file

    record: dict[str, Any] = {"test": folder.name}
    feeds, expected = load_case(folder)
    try:
        original = run_ort(folder / "model.onnx", feeds)
    except Exception as err:  # noqa: BLE001 - onnxruntime raises many types; all mean "cannot run"
        return {**record, "outcome": "ort-cannot-run", "reason": _one_line(err)}
    record["original_matches_expected"] = len(expected) == len(original) and all(
        differs(e, a, _matches_expected) is None for e, a in zip(expected, original, strict=True))
    target = workdir / f"{folder.name}.opt.onnx"
    if via_cli:
        done = subprocess.run([sys.executable, "-m", "pipeline", "optimize", str(folder / "model.onnx"), "-o", str(target)],
                              capture_output=True, text=True, cwd=REPO, env=_cli_env())
        if done.returncode == 2:
            return {**record, "outcome": "declined", "reason": done.stderr.strip()}
        if done.returncode != 0:
            return {**record, "outcome": "error", "reason": done.stderr.strip()[-300:]}
    else:
        try:
            optimize_file(folder / "model.onnx", target)
        except PipelineError as err:
            return {**record, "outcome": "declined", "reason": str(err)}
        except Exception as err:  # noqa: BLE001 - any other exception is a bug this run reports
            return {**record, "outcome": "error", "reason": _one_line(err)}
    try:
        optimized = run_ort(target, feeds)
    except Exception as err:  # noqa: BLE001
        target.unlink(missing_ok=True)
        return {**record, "outcome": "changed", "reason": f"the optimized model does not run: {_one_line(err)}"}
    why = compare(original, optimized, expected) or interface_changed(folder / "model.onnx", target)
    return {**record, "outcome": "changed" if why else "same", "reason": why}


def _cli_env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(REPO)}


def run_suite(folders: list[Path], cli_count: int = 0) -> list[dict[str, Any]]:
    import logging

    logging.getLogger("pipeline").setLevel(logging.ERROR)  # shape-inference notes: one per odd model
    with tempfile.TemporaryDirectory() as tmp:
        records = [check(folder, Path(tmp)) for folder in folders]
        step = max(1, len(folders) // cli_count) if cli_count else 0
        cli = [{**check(folder, Path(tmp), via_cli=True), "via": "cli"} for folder in folders[::step][:cli_count]] if cli_count else []
    return records + cli


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    in_process = [r for r in records if r.get("via") != "cli"]
    counts: dict[str, int] = {}
    for r in in_process:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return {
        "models": len(in_process),
        "counts": dict(sorted(counts.items())),
        "original_disagrees_with_expected": sorted(r["test"] for r in in_process if r.get("original_matches_expected") is False),
        "not_same": [r for r in in_process if r["outcome"] not in ("same", "ort-cannot-run")],
        "ort_cannot_run": {r["test"]: r["reason"] for r in in_process if r["outcome"] == "ort-cannot-run"},
        "cli": [r for r in records if r.get("via") == "cli"],
    }


def safety_cost(path: Path, runs: int = 5) -> dict[str, Any]:
    """Seconds of the safety net beside the whole optimize_file call on `path`."""
    import statistics

    import onnx_ir as ir

    from pipeline.optimize import optimize_file, optimize_model, select_rules
    from pipeline.optimize.safety import check_optimized

    model, _, history, touched, inferred = optimize_model(ir.load(path), select_rules())
    check, whole = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            started = time.perf_counter()
            check_optimized(model, path, history, touched, inferred)
            check.append(time.perf_counter() - started)
            started = time.perf_counter()
            optimize_file(path, Path(tmp) / "out.onnx")
            whole.append(time.perf_counter() - started)

    def spread(xs: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}

    share = [c / w for c, w in zip(check, whole, strict=True)]
    return {"model": path.name, "nodes": len(model.graph), "runs": runs, "check_seconds": spread(check),
            "optimize_file_seconds": spread(whole), "check_share": spread(share)}


def main() -> None:
    sys.path.insert(0, str(REPO))  # this checkout's pipeline, not an installed one
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=1, help="every K-th model by sorted name (default: all)")
    parser.add_argument("--cli", type=int, default=20, help="also run this many models through the CLI")
    parser.add_argument("--cost-model", type=Path, help="a large ONNX file to time the safety net on (bert-base)")
    args = parser.parse_args()
    import onnx_ir
    import onnxruntime

    folders = node_tests()[:: args.every]
    started = time.perf_counter()
    records = run_suite(folders, args.cli)
    seconds = time.perf_counter() - started
    summary = summarize(records)
    result = {
        "what": "optimize on the onnx package's backend node tests (test_data_set_0), onnxruntime CPU with graph optimizations off",
        "versions": {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__, "onnx_ir": onnx_ir.__version__, "python": platform.python_version()},
        "every": args.every, "tolerance": TOLERANCE, "expected_rtol": EXPECTED_RTOL, "expected_atol": EXPECTED_ATOL,
        "seconds": round(seconds, 1), **summary,
    }
    if args.cost_model:
        result["safety_net_cost"] = safety_cost(args.cost_model)
    if args.every == 1:
        RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result.get(k) for k in ("models", "counts", "seconds", "safety_net_cost")}), file=sys.stderr)
    for r in summary["not_same"] + [r for r in summary["cli"] if r["outcome"] not in ("same", "ort-cannot-run")]:
        print(f"{r['outcome']:9} {r['test']}: {r['reason']}", file=sys.stderr)


if __name__ == "__main__":
    main()
