"""Benchmark: the optimize stage against the onnx.load+save floor and onnxscript's optimizer.

In one run, on the dynamo export of the bert-base profile (12 x 768, dynamic batch x seq):
  (a) python -c "onnx.load + onnx.save"                 the floor: reading and writing the file
  (b) python -m pipeline optimize IN -o OUT             ours, whole process
  (c) python -c "onnxscript.optimizer.optimize + save"  the onnxscript optimizer, whole process
each 5 times, interleaved; medians and the ratios b/a, c/a. Also the optimize call alone
(in process: shape inference + rules, no load/save) on bert-base, and the ratio of that call
on a 48-layer to a 12-layer encoder (hidden 256 to keep the exports small; the call never
reads weights, so only the node count matters).
Run: python bench/optimize_speed.py  -> bench/results/optimize_speed.json (takes a few minutes)
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS = 5


def export(profile_text: str, folder: Path, name: str) -> Path:
    from pipeline.export import export_model
    from pipeline.profiles import load_profile

    profile_path = folder / f"{name}.toml"
    profile_path.write_text(profile_text)
    target = folder / f"{name}.onnx"
    export_model(load_profile(str(profile_path)), target)
    return target


def scaled_profile(layers: int, hidden: int, heads: int, ffn: int) -> str:
    text = (REPO / "profiles" / "bert-base.toml").read_text()
    for key, value in (("layers", layers), ("hidden", hidden), ("heads", heads), ("ffn", ffn), ("mlp_hidden", hidden)):
        text = "\n".join(f"{key} = {value}" if line.startswith(f"{key} = ") else line for line in text.splitlines())
    return text.replace('name = "bert-base"', f'name = "bench-{layers}x{hidden}"')


def wall(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def optimize_call_seconds(source: Path) -> float:
    """Median over RUNS fresh loads of shape inference + rules (what `optimize` adds to load + save)."""
    import onnx_ir as ir
    from onnx_ir.passes.common import ShapeInferencePass

    from pipeline.optimize import select_rules
    from pipeline.optimize.engine import run_rules

    times = []
    for _ in range(RUNS):
        model = ir.load(source)
        started = time.perf_counter()
        model = ShapeInferencePass()(model).model
        run_rules(model, select_rules())
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def node_count(path: Path) -> int:
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print("exporting bert-base ...", flush=True)
        base = export((REPO / "profiles" / "bert-base.toml").read_text(), folder, "bert-base")
        out = folder / "out.onnx"
        commands = {
            "a_onnx_load_save": [sys.executable, "-c", f"import onnx; onnx.save(onnx.load({str(base)!r}), {str(out)!r})"],
            "b_pipeline_optimize": [sys.executable, "-m", "pipeline", "optimize", str(base), "-o", str(out)],
            "c_onnxscript_optimize": [sys.executable, "-c", "import onnx, onnxscript; "
                                      f"m = onnxscript.optimizer.optimize(onnx.load({str(base)!r})); onnx.save(m, {str(out)!r})"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for run in range(RUNS):
            for name, command in commands.items():
                times[name].append(wall(command))
            print(f"run {run + 1}/{RUNS}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
        medians = {name: statistics.median(values) for name, values in times.items()}
        call_base = optimize_call_seconds(base)
        print("exporting 12- and 48-layer encoders (hidden 256) ...", flush=True)
        small = export(scaled_profile(12, 256, 4, 1024), folder, "enc12")
        large = export(scaled_profile(48, 256, 4, 1024), folder, "enc48")
        call_12, call_48 = optimize_call_seconds(small), optimize_call_seconds(large)
        result = {
            "benchmark": "bert-base dynamo export, whole processes interleaved, median of 5",
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "model": {"nodes": node_count(base), "bytes": base.stat().st_size},
            "median_seconds": {k: round(v, 3) for k, v in medians.items()},
            "all_seconds": {k: [round(x, 3) for x in v] for k, v in times.items()},
            "ratios": {
                "b_over_a": round(medians["b_pipeline_optimize"] / medians["a_onnx_load_save"], 3),
                "c_over_a": round(medians["c_onnxscript_optimize"] / medians["a_onnx_load_save"], 3),
            },
            "optimize_call_seconds": {"bert_base": round(call_base, 4), "encoder_12_layers": round(call_12, 4), "encoder_48_layers": round(call_48, 4)},
            "nodes_12_vs_48": [node_count(small), node_count(large)],
            "ratio_48_over_12_layers": round(call_48 / call_12, 3),
            "targets": {"b_over_a": 1.3, "optimize_call_seconds": 0.25, "ratio_48_over_12_layers": 4.5},
        }
        result["meets_targets"] = {
            "b_over_a": result["ratios"]["b_over_a"] <= 1.3,
            "optimize_call_seconds": call_base <= 0.25,
            "ratio_48_over_12_layers": result["ratio_48_over_12_layers"] <= 4.5,
        }
    target = REPO / "bench" / "results" / "optimize_speed.json"
    target.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
