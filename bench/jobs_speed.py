"""Benchmark: what the jobs machinery costs beside the work it orchestrates.

  orchestration  one ort-cpu cell of a tiny matrix (tiny MLP, fp32, build cached), `jobs cell` as a whole
                 process, against the same work run by hand: `build` (same profile and --out, cached) then
                 `bench` of the same model with the same number of warm-up and timed runs. 3 rounds
                 interleaved; ratio cell / by hand per round (the issue's target: <= 1.05).
  gather         10,000 synthetic cell files (a real cell's record, ids and latencies varied) read and
                 rendered to html by `gather` in one process (target: 2 s).
  k8s            a 1,000-cell matrix planned and written as manifests, in process (target: 1 s).
Run: python bench/jobs_speed.py [--table]  -> bench/results/jobs_speed.json (--table: print its table).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "jobs_speed.json"
ROUNDS = 3
TINY = 'name = "tiny-mlp"\n[model]\nfactory = "factories:tiny_mlp"\nseed = 3\n[dims.batch]\nmin = 1\nopt = 4\nmax = 16\n' \
       '[[inputs]]\nname = "x"\ndtype = "float32"\nshape = ["batch", 8]\n'
MATRIX = 'name = "speed"\nprecisions = ["fp32"]\nbackends = ["ort-cpu"]\nrepeats = 3\n[[models]]\nprofile = "tiny.toml"\n' \
         '[method]\nwarmup_ms = 100\nmin_duration_ms = 1000\nmin_iterations = 10\n'


def _wall(command: list[str], cwd: Path) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)])}
    started = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def orchestration(work: Path) -> dict:
    (work / "tiny.toml").write_text(TINY)
    (work / "matrix.toml").write_text(MATRIX)
    python = [sys.executable, "-m", "pipeline"]
    _wall(python + ["jobs", "cell", "matrix.toml", "--index", "0", "--out", "res"], work)  # the build, once
    record = next((work / "res" / "cells").glob("*.json"))
    rounds = []
    for _ in range(ROUNDS):
        cell = _wall(python + ["jobs", "cell", "matrix.toml", "--index", "0", "--out", "res"], work)
        method, repeats = (json.loads(record.read_text())[key] for key in ("method", "repeats"))
        runs = method["calibration_runs"] + sum(r["iterations"] for r in repeats)
        folder = json.loads(record.read_text())["build"]["folder"]
        by_hand = _wall(python + ["build", "--profile", "tiny.toml", "--out", folder, "--until", "optimize"], work)
        by_hand += _wall(python + ["bench", f"{folder}/model.opt.onnx", "--profile", "tiny.toml", "--backend", "ort-cpu", "--batch", "4",
                                   "--warmup", str(3 * method["warmup_runs_per_repeat"]), "--iterations", str(runs), "-o", str(work / "hand.json")], work)
        rounds.append({"cell_s": round(cell, 3), "by_hand_s": round(by_hand, 3), "ratio": round(cell / by_hand, 3)})
    return {"rounds": rounds, **_stats([r["ratio"] for r in rounds])}


def gather_10k(work: Path, template: dict) -> dict:
    from pipeline.jobs.gather import gather, render_html

    cells = work / "many" / "cells"
    cells.mkdir(parents=True)
    for n in range(10_000):
        record = json.loads(json.dumps(template))
        record["id"] = f"{n:012x}"
        record["index"] = n
        record["definition"]["shape"] = {"batch": 1 + n % 16}
        record["definition"]["model"] = f"model-{n // 48}"
        record["definition"]["precision"] = ("fp32", "fp16", "int8")[n % 3]
        scale = 1 + (n % 7) / 10
        record["latency"] = {k: v * scale for k, v in record["latency"].items()}
        record["repeats"] = [{k: v * scale for k, v in r.items()} for r in record["repeats"]]
        (cells / f"{record['id']}.json").write_text(json.dumps(record))
    times, reading = [], []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        result = gather([work / "many"])
        reading.append(time.perf_counter() - started)
        html = render_html(result)
        times.append(time.perf_counter() - started)
    return {"cells": 10_000, "html_bytes": len(html), "read_seconds": [round(t, 3) for t in reading], **_stats(times, "seconds")}


def k8s_1000(work: Path) -> dict:
    from pipeline.jobs.k8s import manifests, to_yaml
    from pipeline.jobs.plan import plan
    from pipeline.jobs.spec import load_matrix

    shapes = ", ".join(f"{{ batch = {1 + b % 16} }}" for b in range(125))
    (work / "big.toml").write_text(MATRIX.replace('["fp32"]', '["fp32", "fp16"]').replace('["ort-cpu"]', '["trt", "ort-cuda"]')
                                   .replace('profile = "tiny.toml"\n', f'profile = "tiny.toml"\nshapes = [{shapes}]\n')
                                   + '[cluster]\ngpus = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-L4"]\nimage = "i"\nresults_pvc = "r"\n')
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        matrix = load_matrix(work / "big.toml")
        cells = plan(matrix)
        jobs, gather = manifests(matrix, cells)
        text = to_yaml(jobs, "speed") + to_yaml(gather, "speed")
        times.append(time.perf_counter() - started)
    return {"cells": len(cells), "yaml_bytes": len(text), **_stats(times, "seconds")}


def _stats(values: list[float], unit: str = "ratio") -> dict:
    return {f"median_{unit}": round(statistics.median(values), 3), f"min_{unit}": round(min(values), 3), f"max_{unit}": round(max(values), 3)}


def table(result: dict) -> str:
    o, g, k = result["orchestration"], result["gather"], result["k8s"]
    return "\n".join([
        "| what | measured | target |", "|---|---|---|",
        f"| `jobs cell` / `build` + `bench` by hand (one ort-cpu tiny cell, whole processes) | {o['median_ratio']:.2f}x ({o['min_ratio']:.2f}-{o['max_ratio']:.2f}) | <= 1.05x |",
        f"| `gather` of {g['cells']:,} cells to html (of which reading the files: {statistics.median(g['read_seconds']):.2f} s) "
        f"| {g['median_seconds']:.2f} s ({g['min_seconds']:.2f}-{g['max_seconds']:.2f}) | <= 2 s |",
        f"| `k8s` manifests of {k['cells']:,} cells (load, plan, write) | {k['median_seconds']:.2f} s ({k['min_seconds']:.2f}-{k['max_seconds']:.2f}) | <= 1 s |",
    ]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true", help="print the table of the recorded results and exit")
    if parser.parse_args().table:
        print(table(json.loads(RESULTS.read_text())), end="")
        return
    sys.path[:0] = [str(REPO)]
    work = Path(tempfile.mkdtemp(prefix="jobs_speed."))
    try:
        result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_average": [round(x, 2) for x in os.getloadavg()]}}
        result["orchestration"] = orchestration(work)
        template = json.loads(next((work / "res" / "cells").glob("*.json")).read_text())
        result["gather"] = gather_10k(work, template)
        result["k8s"] = k8s_1000(work)
        result["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result), end="")


if __name__ == "__main__":
    main()
