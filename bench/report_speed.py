"""Benchmark: `python -m pipeline report` on a 400-layer detailed JSON with its profile (target <= 1 s wall).

No real 400-layer file exists, so the input is built by repeating the layers of the real
TensorRT 10.16 fixture (trt10.16_detailed_mnist_myelin.layers.json) 45 times with unique
names (405 layers, the same schema and Metadata), plus a trtexec-style profile for every
layer. It measures our parsing and rendering; it is not TensorRT output.
Run: python bench/report_speed.py  -> bench/results/report_speed.json
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
FIXTURE = Path(os.environ.get("TRT_PIPELINE_FIXTURES", REPO.parent / "shared" / "fixtures" / "trt")) / "trt10.16_detailed_mnist_myelin.layers.json"
REPEATS = 45
RUNS = 5


def make_inputs(folder: Path) -> tuple[Path, Path]:
    source = json.loads(FIXTURE.read_text())
    layers = []
    for copy in range(REPEATS):
        for layer in source["Layers"]:
            layers.append({**layer, "Name": f"{layer['Name']} #{copy}"})
    layer_file = folder / "big.layers.json"
    layer_file.write_text(json.dumps({"Layers": layers, "Bindings": source["Bindings"]}))
    profile = [{"count": 100}] + [
        {"name": layer["Name"], "timeMs": 1.0 + i * 0.01, "averageMs": 0.01 + i * 1e-4, "medianMs": 0.01, "percentage": 0.2} for i, layer in enumerate(layers)
    ]
    profile_file = folder / "big.profile.json"
    profile_file.write_text(json.dumps(profile))
    return layer_file, profile_file


def wall(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        layers, profile = make_inputs(Path(tmp))
        commands = {
            "python_startup": [sys.executable, "-c", "pass"],
            "report_json": [sys.executable, "-m", "pipeline", "report", str(layers), "--timing", str(profile), "-f", "json", "-o", f"{tmp}/r.json"],
            "report_text": [sys.executable, "-m", "pipeline", "report", str(layers), "--timing", str(profile), "-o", f"{tmp}/r.txt"],
            "report_html": [sys.executable, "-m", "pipeline", "report", str(layers), "--timing", str(profile), "-f", "html", "-o", f"{tmp}/r.html"],
        }
        layer_count = len(json.loads(layers.read_text())["Layers"])
        medians = {}
        for name, command in commands.items():
            wall(command)  # warm the file cache
            medians[name] = statistics.median(wall(command) for _ in range(RUNS))
    result = {
        "benchmark": "report on a 405-layer detailed JSON + profile, whole process, median of 5",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "layers": layer_count,
        "median_seconds": {k: round(v, 4) for k, v in medians.items()},
        "target_seconds": 1.0,
        "ratio_to_python_startup": {k: round(v / medians["python_startup"], 2) for k, v in medians.items() if k != "python_startup"},
        "meets_target": all(v <= 1.0 for k, v in medians.items() if k != "python_startup"),
    }
    out = REPO / "bench" / "results" / "report_speed.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
