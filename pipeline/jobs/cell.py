"""One cell: build its model with `python -m pipeline build` (its own process, into an artifacts
folder shared by the cells of one build, under the build's own lock), time it with trt/bench.py,
read the engine's report, and write `RESULTS/cells/<id>.json` (schema CELL_SCHEMA, every field in
docs/jobs.md) atomically."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline import precisions as registry
from pipeline.artifacts import Built, read_build
from pipeline.core.errors import CapabilityMissing, PipelineError
from pipeline.core.fileio import write_json
from pipeline.jobs import provenance
from pipeline.jobs.plan import Cell
from pipeline.jobs.spec import Matrix
from pipeline.jobs.store import CELL_SCHEMA, cell_path, claim_store


def run_cell(matrix: Matrix, cell: Cell, out: Path) -> dict[str, Any]:
    """Run `cell` and write its record; a failure inside is recorded (status failed) and returned."""
    claim_store(out, matrix.name)
    started = time.monotonic()
    record = _record(matrix, cell, provenance={**provenance.host(), "gpu_before": provenance.gpu_state(), "gpu_after": None})
    missing = _missing_capability(cell, record["provenance"]["gpu_before"])
    if missing:
        record.update(status="skipped", reason=missing, docker=_docker(matrix, cell, out))
    else:
        try:
            _build_and_time(cell, out, record)
        except CapabilityMissing as err:  # a GPU but an onnxruntime without its CUDA provider; no CPU kernel for BF16/FP8
            record.update(status="skipped", reason=str(err), docker=None if cell.backend == "ort-cpu" else _docker(matrix, cell, out))
        except PipelineError as err:
            record.update(status="failed", reason=str(err).splitlines()[0] if str(err) else type(err).__name__)
    record["seconds"] = round(time.monotonic() - started, 3)
    write_json(cell_path(out, cell.id), record)
    return record


def failed_record(matrix: Matrix, cell: Cell, reason: str, seconds: float) -> dict[str, Any]:
    """What the runner records for a cell whose process died before writing its own file."""
    return _record(matrix, cell, status="failed", reason=reason, seconds=round(seconds, 3))


def _record(matrix: Matrix, cell: Cell, **fields: Any) -> dict[str, Any]:
    """A cell record, every field present (docs/jobs.md), `fields` set and the rest empty."""
    return {"schema": CELL_SCHEMA, "matrix": matrix.name, "id": cell.id, "index": cell.index, "label": cell.label,
            "definition": cell.definition(), "status": "done", "reason": None, "docker": None,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "seconds": None, "provenance": None,
            "method": None, "latency": None, "repeats": [], "valid": None, "validity": [], "engine": None, "build": None} | fields


def _missing_capability(cell: Cell, gpu: dict[str, Any]) -> str | None:
    if cell.backend == "ort-cpu":
        return None
    if cell.backend == "trt":
        from trt.capability import tensorrt_missing

        missing = tensorrt_missing()
        if missing:
            return f"{cell.backend} needs TensorRT and a GPU: {missing}"
    elif gpu.get("gpu_absent"):
        return f"ort-cuda needs a GPU: {gpu['gpu_absent']}"
    else:  # before the build it would time: a GPU host's onnxruntime can be the CPU build
        from pipeline.core.devices import onnxruntime_cuda_missing

        missing = onnxruntime_cuda_missing()
        if missing:
            return f"ort-cuda needs onnxruntime's CUDA provider: {missing}"
    if gpu.get("gpu_absent") is None and cell.gpu not in ("local", "cpu") and cell.gpu != gpu["name"].replace(" ", "-"):
        return f"this cell is for GPU type {cell.gpu}; this machine has {gpu['name']}"
    return None


def _docker(matrix: Matrix, cell: Cell, out: Path) -> str:
    from trt.capability import docker_command

    return docker_command(["jobs", "cell", Path(matrix.source), "--index", str(cell.index), "--out", Path(out)])


def _build_and_time(cell: Cell, out: Path, record: dict[str, Any]) -> None:
    folder = out / "artifacts" / cell.build_key()
    log = out / "logs" / f"{cell.id}.build.log"
    built = time.monotonic()
    _build(cell, folder, log)
    record["build"] = {"folder": str(folder), "log": str(log), "seconds": round(time.monotonic() - built, 3)}
    built = read_build(folder)[1].get(cell.precision)
    model = (built.engine if cell.backend == "trt" else built.onnx) if built else None
    if model is None:
        what = "engine" if cell.backend == "trt" else "model"
        raise PipelineError(f"the build recorded no usable {cell.precision} {what} (see {log})")
    _time(cell, model, record)
    record["provenance"]["gpu_after"] = provenance.gpu_state()
    after = record["provenance"]["gpu_after"]
    if after.get("throttle_reasons"):
        record["validity"].append(f"GPU throttled: {', '.join(after['throttle_reasons'])}")
        record["valid"] = False
    if cell.backend == "trt":
        record["engine"] = _engine(folder, built)


def _build(cell: Cell, folder: Path, log: Path) -> None:
    command = [sys.executable, "-m", "pipeline", "build", "--profile", _profile_for_build(cell, folder), "--out", str(folder), "--wait"]
    if cell.onnx:
        command += ["--onnx", cell.onnx]
    precision = registry.by_name(cell.precision)
    if precision.module is not None:
        command.append(f"--{precision.name}")
    if cell.backend != "trt":
        command += ["--until", precision.stage]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as stream:
        done = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "160"})
    if done.returncode != 0:
        lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.startswith("error:")]
        raise PipelineError(f"build failed: {lines[-1].removeprefix('error: ') if lines else f'exit {done.returncode}'} (log: {log})")


def _profile_for_build(cell: Cell, folder: Path) -> str:
    """The profile, or for a builder setting other than its own, a copy with [build] changed (in the artifacts folder)."""
    if not cell.builder:
        return cell.profile
    import tomlkit

    from pipeline.core.fileio import write_text
    from pipeline.core.profiles import load_profile

    profile = load_profile(cell.profile)
    data = profile.model_dump(mode="json", exclude_none=True)
    data["build"].update(cell.builder)
    if profile.model.onnx is not None:
        data["model"]["onnx"] = str(profile.onnx_path())
    if profile.model.hf is not None and (profile.folder / profile.model.hf).exists():
        data["model"]["hf"] = str((profile.folder / profile.model.hf).resolve())
    derived = folder / "profile.toml"
    write_text(derived, tomlkit.dumps(data))  # atomic_path makes the folder
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(profile.folder), os.environ.get("PYTHONPATH")]))
    return str(derived)


MARGIN = 1.25  # the count is aimed this far over min_duration_ms: runs often get faster once the machine warms up
RETRIES = 3  # a repeat that still comes out short is run again, with its count scaled by the shortfall, this often


def _time(cell: Cell, model: Path, record: dict[str, Any]) -> None:
    """Calibration runs (discarded) find a count of at least min_iterations lasting MARGIN x min_duration_ms; each
    repeat (its own session or engine context, from trt/bench.py) then discards warmup_ms worth of runs and times
    that count, run again with more runs when it lasted under min_duration_ms. A repeat still short after RETRIES
    makes the cell INVALID."""
    from pipeline.core.profiles import load_profile
    from pipeline.core.samples import make_inputs

    method = cell.method
    feeds = make_inputs(load_profile(cell.profile), seed=method["seed"], dims=cell.shape)
    timed = _Timed(cell, model, feeds)
    iterations, mean = _calibrate(timed, method)
    warmup = math.ceil(method["warmup_ms"] / max(mean, 1e-6))
    for _ in range(cell.repeats):
        record["repeats"].append(_repeat(timed, warmup, iterations, method))
    means = [r["mean_ms"] for r in record["repeats"]]
    center = sorted(record["repeats"], key=lambda r: r["p50_ms"])[len(means) // 2]
    mean = sum(means) / len(means)
    cv = (sum((m - mean) ** 2 for m in means) / len(means)) ** 0.5 / mean if mean else 0.0
    record["method"] = {**method, "calibration_runs": timed.discarded_runs, "warmup_runs_per_repeat": warmup, "iterations_per_repeat": iterations,
                        "timing": timed.result["timing"], "batch": timed.result["batch"], "input_shapes": timed.result["input_shapes"]}
    record["latency"] = {key: center[key] for key in ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "throughput_per_s")} | {"cv": round(cv, 4)}
    short = [r for r in record["repeats"] if _short(r, method)]
    if short:
        record["validity"].append(f"{len(short)} of {len(means)} repeats under the minimum duration ({method['min_duration_ms']:g} ms) "
                                  f"or iteration count ({method['min_iterations']}) after {RETRIES} longer reruns")
    record["valid"] = not short


class _Timed:
    """The cell's model timed by trt/bench.py, counting the runs whose times are discarded."""

    def __init__(self, cell: Cell, model: Path, feeds: dict[str, Any]) -> None:
        self.cell, self.models, self.feeds = cell, {cell.precision: model}, feeds
        self.discarded_runs = 0
        self.result: dict[str, Any] = {}

    def row(self, warmup: int, iterations: int) -> dict[str, Any]:
        from trt.bench import bench

        self.result = bench(self.models, self.cell.backend, self.feeds, warmup=warmup, iterations=iterations)
        row = dict(self.result["models"][self.cell.precision])
        row.pop("model")
        row["timed_ms"] = round(row["iterations"] * row["mean_ms"], 3)
        return row


def _calibrate(timed: _Timed, method: dict[str, Any]) -> tuple[int, float]:
    """(a count of at least min_iterations whose runs last MARGIN x min_duration_ms, the mean run in ms); its runs are discarded."""
    target = MARGIN * method["min_duration_ms"]
    iterations = method["min_iterations"]
    for _ in range(6):  # grow the count until one run of it lasts the target
        row = timed.row(warmup=1, iterations=iterations)
        timed.discarded_runs += 1 + iterations
        if row["timed_ms"] >= target:
            break
        iterations = math.ceil(iterations * min(100.0, target / max(row["timed_ms"], 1e-6)))
    return iterations, row["mean_ms"]


def _repeat(timed: _Timed, warmup: int, iterations: int, method: dict[str, Any]) -> dict[str, Any]:
    """One timed repeat of `iterations` runs; one lasting under min_duration_ms (the runs got faster since calibrating)
    is discarded and run again with the count scaled by its shortfall, up to RETRIES times."""
    row = timed.row(warmup, iterations)
    for _ in range(RETRIES):
        if not _short(row, method):
            break
        timed.discarded_runs += warmup + iterations
        iterations = math.ceil(iterations * MARGIN * method["min_duration_ms"] / max(row["timed_ms"], 1e-6))
        row = timed.row(warmup, iterations)
    return row


def _short(row: dict[str, Any], method: dict[str, Any]) -> bool:
    return row["iterations"] < method["min_iterations"] or row["timed_ms"] < method["min_duration_ms"]


def _engine(folder: Path, built: Built) -> dict[str, Any]:
    """The engine's sha256, layer and Myelin region counts, precision mix and verdict (trt/report.py), the
    build's own accuracy figures for it, and the prediction from its ONNX scored against it (trt/predict/score.py)."""
    from pipeline.core.fileio import sha256_file
    from pipeline.core.manifest import Manifest
    from pipeline.core.onnxfile import load_onnx
    from quant.lint import family_rules
    from trt.predict.score import score_engine
    from trt.report import report_from_files

    precision, engine = built.precision.name, built.engine
    report = report_from_files(built.layers, onnx=built.onnx)
    model = load_onnx(built.onnx, weights=True)
    stage = Manifest.load_or_new(folder / "manifest.json", "").get("build")  # read_build read it a moment ago
    accuracy = stage.metrics.get(precision, {}).get("accuracy") if stage else None
    report_html = folder / f"{precision}.report.html"
    return {
        "sha256": sha256_file(engine), "path": str(engine),
        "layers": report.summary.layers, "myelin_graphs": report.summary.myelin_graphs,
        "precision_mix": dict(Counter(layer.precision or "unknown" for layer in report.layers)),
        "verdict": report.verdict, "report": str(report_html) if report_html.is_file() else None, "accuracy": accuracy,
        "predicted": score_engine(model, str(built.onnx), report.plan, family_rules(model)),
    }
