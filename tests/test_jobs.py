"""Benchmark jobs end to end on a tiny matrix, as a user runs them: plan, run (each cell its own
process; a failing cell; trt cells skipped with the Docker command), resume, a run killed mid-cell,
concurrent cells into one folder, the pod command of the Kubernetes manifests, gather and the gate."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, TESTS, TINY_MLP_PROFILE, run_cli

MATRIX = """
name = "tiny"
precisions = ["fp32", "fp16"]
backends = ["ort-cpu", "trt"]
repeats = 2
[[models]]
profile = "tiny.toml"
shapes = [{ batch = 1 }, { batch = 16 }]
[[models]]
profile = "tiny.toml"
onnx = "broken.onnx"
[method]
warmup_ms = 10
min_duration_ms = 50
min_iterations = 10
"""
CLUSTER = """
[cluster]
gpus = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-L4"]
image = "registry.example.com/trt-pipeline@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
parallelism = 3
results_pvc = "bench-results"
queue = "gpu-queue"
"""
KUBERNETES = "1.37.0"  # kubernetes-validate's schemas for this version ship inside the package


def _cells(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (out / "cells").glob("*.json")}


def _plan(work: Path, matrix: str = "matrix.toml") -> list[dict]:
    result = run_cli("jobs", "plan", matrix, "--format", "json", cwd=work)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The tiny matrix run once by `jobs run`: (folder, its plan, the run's result)."""
    work = tmp_path_factory.mktemp("jobs")
    (work / "tiny.toml").write_text(TINY_MLP_PROFILE)
    (work / "broken.onnx").write_bytes(b"not an onnx file")
    (work / "matrix.toml").write_text(MATRIX)
    (work / "cluster.toml").write_text(MATRIX + CLUSTER)
    result = run_cli("jobs", "run", "matrix.toml", "--out", "res", cwd=work)
    return work, _plan(work), result


def test_plan_ids_are_stable_and_defined_by_the_cell(ran):
    work, cells, _ = ran
    assert len(cells) == 2 * 2 * 2 + 1 * 2 * 2 and len({c["id"] for c in cells}) == len(cells)
    assert [c["index"] for c in cells] == list(range(len(cells)))
    # adding a model and a precision leaves every existing cell's id as it was
    (work / "grown.toml").write_text(MATRIX.replace('["fp32", "fp16"]', '["fp32", "fp16", "int8"]') + '[[models]]\nprofile = "bert-tiny"\n')
    grown = {c["id"]: c["label"] for c in _plan(work, "grown.toml")}
    assert all(grown.get(c["id"]) == c["label"] for c in cells)


def test_run_records_every_cell_once_with_trt_skipped_and_a_failing_cell(ran):
    work, cells, result = ran
    assert result.returncode == 1, result.stderr  # one model's build fails; the rest went on
    assert "cell(s) failed" in result.stderr.splitlines()[-1]
    records = _cells(work / "res")
    assert set(records) == {c["id"] for c in cells}
    by_status = {s: [r for r in records.values() if r["status"] == s] for s in ("done", "failed", "skipped")}
    assert {r["definition"]["backend"] for r in by_status["skipped"]} == {"trt"} and len(by_status["skipped"]) == 6
    for skipped in by_status["skipped"]:
        assert "needs TensorRT and a GPU" in skipped["reason"]
        assert skipped["docker"].endswith(f"trt-pipeline jobs cell matrix.toml --index {skipped['index']} --out res")
    assert [r["definition"]["onnx"] for r in by_status["failed"]] == [str(work / "broken.onnx")] * 2
    for failed in by_status["failed"]:
        assert failed["reason"].startswith("build failed: ") and "broken.onnx" in failed["reason"] and "\n" not in failed["reason"], failed["reason"]
    assert len(by_status["done"]) == 4
    for done in by_status["done"]:
        assert done["schema"] == 1 and done["definition"]["backend"] == "ort-cpu"
        assert done["provenance"]["gpu_before"]["gpu_absent"] and done["provenance"]["versions"]["onnxruntime-gpu"]
        assert len(done["repeats"]) == 2 and all(r["iterations"] >= 10 for r in done["repeats"])
        assert done["valid"] is all(r["timed_ms"] >= 50 for r in done["repeats"]) and done["method"]["calibration_runs"] >= 11
        assert 0 < done["latency"]["p50_ms"] <= done["latency"]["p90_ms"] <= done["latency"]["p99_ms"]
        assert done["method"]["input_shapes"]["x"] == [done["definition"]["shape"]["batch"], 8]
    # the four done cells share one build folder (the shape and backend do not change the build)
    assert len({r["build"]["folder"] for r in by_status["done"]}) == 1


def _wait_for(check, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_a_run_killed_mid_cell_completes_on_rerun_with_no_cell_lost_or_duplicated(ran):
    """Two done cells' results removed, a run killed (with its cell) while redoing the first, rerun:
    both come back, every other done cell is kept as it was, nothing is duplicated or left half written."""
    work, cells, _ = ran
    out = work / "res"
    done = [c for c in cells if _cells(out)[c["id"]]["status"] == "done"]
    kept = {c["id"]: _cells(out)[c["id"]] for c in done[2:]}
    done = done[:2]
    for cell in done:
        (out / "cells" / f"{cell['id']}.json").unlink()
        (out / "logs" / f"{cell['id']}.cell.log").unlink()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)])}
    runner = subprocess.Popen([sys.executable, "-m", "pipeline", "jobs", "run", "matrix.toml", "--out", "res"], cwd=work, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _wait_for(lambda: (out / "logs" / f"{done[0]['id']}.cell.log").is_file())  # the first missing cell is running
    os.killpg(runner.pid, signal.SIGKILL)
    runner.wait()
    assert not (out / "cells" / f"{done[1]['id']}.json").exists()
    result = run_cli("jobs", "run", "matrix.toml", "--out", "res", cwd=work)
    assert "Traceback" not in result.stderr and "2 done, 2 failed, 6 skipped, 2 already done" in result.stdout
    records = _cells(out)
    assert {k: records[k] for k in kept} == kept
    assert sorted(records) == sorted(c["id"] for c in cells)
    assert all(records[c["id"]]["status"] == "done" for c in done)
    assert not [p.name for p in (out / "cells").iterdir() if not p.name.endswith(".json") or p.name.startswith(".")]


def test_concurrent_cells_into_one_folder_lose_nothing(ran):
    """Two cells of the matrix (sharing one build) and a second copy of one of them, at once."""
    work, cells, _ = ran
    out = work / "res"
    chosen = [c for c in cells if c["backend"] == "ort-cpu" and c["model"] == "tiny-mlp"][:2]
    for cell in chosen:
        (out / "cells" / f"{cell['id']}.json").unlink()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)])}
    processes = [subprocess.Popen([sys.executable, "-m", "pipeline", "jobs", "cell", "matrix.toml", "--index", str(c["index"]), "--out", "res"],
                                  cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for c in chosen + chosen[:1]]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0], outputs
    records = _cells(out)
    assert all(records[c["id"]]["status"] == "done" and records[c["id"]]["id"] == c["id"] for c in chosen)
    assert sorted(records) == sorted(c["id"] for c in cells)


def test_k8s_manifests_validate_against_the_kubernetes_schema(ran):
    import kubernetes_validate

    work, cells, _ = ran
    result = run_cli("jobs", "k8s", "cluster.toml", "-o", "jobs.yaml", cwd=work)
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all((work / "jobs.yaml").read_text())) + list(yaml.safe_load_all((work / "jobs.gather.yaml").read_text()))
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES, strict=True)
    plan = _plan(work, "cluster.toml")
    jobs = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Job"}
    counts = {gpu: sum(c["gpu"] == gpu for c in plan) for gpu in ("NVIDIA-H100-80GB-HBM3", "NVIDIA-L4", "cpu")}
    for gpu, slug in (("NVIDIA-H100-80GB-HBM3", "nvidia-h100-80gb-hbm3"), ("NVIDIA-L4", "nvidia-l4")):
        spec = jobs[f"tiny-{slug}"]["spec"]
        pod = spec["template"]["spec"]
        assert spec["completionMode"] == "Indexed" and spec["completions"] == counts[gpu] == 6 and spec["parallelism"] == 3
        assert spec["backoffLimitPerIndex"] == 1 and pod["restartPolicy"] == "Never"
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": gpu}
        assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
        assert jobs[f"tiny-{slug}"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert jobs["tiny-cpu"]["spec"]["completions"] == counts["cpu"] and "nodeSelector" not in jobs["tiny-cpu"]["spec"]["template"]["spec"]
    assert jobs["tiny-gather"]["spec"].get("completionMode") is None
    assert {v["persistentVolumeClaim"]["claimName"] for d in jobs.values() for v in d["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v} == {"bench-results"}


def test_k8s_object_store_variant_validates(ran):
    import kubernetes_validate

    work, _, _ = ran
    (work / "s3.toml").write_text(MATRIX + CLUSTER.replace('results_pvc = "bench-results"', 'results_uri = "s3://bucket/runs/1"'))
    assert run_cli("jobs", "k8s", "s3.toml", "-o", "s3.yaml", "--parallelism", "8", cwd=work).returncode == 0
    documents = list(yaml.safe_load_all((work / "s3.yaml").read_text()))
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES, strict=True)
    job = next(d for d in documents if d["metadata"]["name"] == "tiny-nvidia-l4")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["sh", "-c"] and "s3://bucket/runs/1/cells" in command[2] and job["spec"]["parallelism"] == 6  # capped at its cells


def _local(argument: str, mounts: dict[str, str]) -> str:
    """A pod's path under a volume mount, as the local folder standing in for that volume."""
    for mount, local in mounts.items():
        if argument == mount or argument.startswith(mount + "/"):
            return local + argument[len(mount):]
    return argument


def test_the_pod_command_run_here_writes_the_cell_file_jobs_run_writes(ran):
    """Each pod's exact command, with the mounts mapped to local folders and JOB_COMPLETION_INDEX=N,
    against what `jobs cell --index N` (the command `jobs run` runs for cell N) writes."""
    work, _, _ = ran
    documents = list(yaml.safe_load_all((work / "jobs.yaml").read_text()))
    config = next(d for d in documents if d["kind"] == "ConfigMap")
    mounted = work / "mnt"
    mounted.mkdir()
    # the pod's /matrix holds only the matrix; its profiles and ONNX files come from the image (here: this folder)
    (mounted / "matrix.toml").write_text(config["data"]["matrix.toml"].replace('"tiny.toml"', f'"{work / "tiny.toml"}"')
                                         .replace('"broken.onnx"', f'"{work / "broken.onnx"}"'))
    for folder in ("pods", "reference"):  # with the builds `jobs run` made, not the cells
        shutil.copytree(work / "res", work / folder, ignore=shutil.ignore_patterns("cells"))
    plan = _plan(work, "cluster.toml")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)])}
    for name, gpu, index in (("tiny-cpu", "cpu", 1), ("tiny-nvidia-l4", "NVIDIA-L4", 0), ("tiny-nvidia-l4", "NVIDIA-L4", 3)):
        job = next(d for d in documents if d["metadata"]["name"] == name)
        mounts = {"/matrix": str(mounted), "/results": str(work / "pods")}
        command = [_local(arg, mounts) for arg in job["spec"]["template"]["spec"]["containers"][0]["command"]]
        assert command[:2] == ["python", "-m"]
        done = subprocess.run([sys.executable, *command[1:]], cwd=work, env={**env, "JOB_COMPLETION_INDEX": str(index)}, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        cell = [c for c in plan if c["gpu"] == gpu][index]
        written = json.loads((work / "pods" / "cells" / f"{cell['id']}.json").read_text())
        assert run_cli("jobs", "cell", "cluster.toml", "--index", str(cell["index"]), "--out", "reference", cwd=work).returncode == 0
        same = _cells(work / "reference")[cell["id"]]
        if gpu == "cpu":  # and the same cell as the matrix without [cluster] had, in `jobs run`'s results
            assert _cells(work / "res")[cell["id"]]["definition"] == written["definition"]
        assert (written["id"], written["definition"], written["status"], written["index"]) == (same["id"], same["definition"], same["status"], same["index"])
        assert sorted(written) == sorted(same) and written["reason"] == same["reason"] and written["label"] == same["label"]


def test_gather_report_and_baseline_gate(ran):
    work, cells, _ = ran
    result = run_cli("jobs", "gather", "res", "-o", "report.json", cwd=work)
    assert result.returncode == 0, result.stderr
    report = json.loads((work / "report.json").read_text())
    assert report["counts"] == {"done": 4, "failed": 2, "skipped": 6}
    assert {s["ratio"] for s in report["speedups"]} == {"fp16/fp32"} and len(report["speedups"]) == 2
    assert {n["status"] for n in report["not_run"]} == {"failed", "skipped"} and all(n["reason"] for n in report["not_run"])
    html = run_cli("jobs", "gather", "res", "-o", "report.html", cwd=work)
    assert html.returncode == 0 and "data:image/png;base64," in (work / "report.html").read_text()
    md = run_cli("jobs", "gather", "res", cwd=work)
    assert "| tiny-mlp | fp16 | batch=16 | ort-cpu |" in md.stdout and "## Not run" in md.stdout
    # the gate: a baseline twice as fast in one cell fails naming that cell; an identical one passes
    shutil.copytree(work / "res" / "cells", work / "base" / "cells")
    slow_id = next(r["id"] for r in report["cells"] if r["status"] == "done")
    record = json.loads((work / "base" / "cells" / f"{slow_id}.json").read_text())
    record["latency"]["p50_ms"] /= 2
    (work / "base" / "cells" / f"{slow_id}.json").write_text(json.dumps(record))
    gate = run_cli("jobs", "gather", "res", "--baseline", "base", "--max-slowdown", "5%", "-o", "gate.md", cwd=work)
    assert gate.returncode == 1 and "1 cell(s) slower" in gate.stderr and slow_id in gate.stderr and "+100.0%" in gate.stderr
    assert slow_id in (work / "gate.md").read_text()
    shutil.copytree(work / "res" / "cells", work / "same" / "cells")
    assert run_cli("jobs", "gather", "res", "--baseline", "same", cwd=work).returncode == 0


def test_gpu_check_script_runs_every_step_here_with_the_gpu_cells_skipped(ran):
    """docker/gpu-check.sh with GPU_CHECK_HERE=1: every step but `docker build` runs on this machine."""
    work, _, _ = ran
    (work / "check.toml").write_text(MATRIX.split("[[models]]\nprofile = \"tiny.toml\"\nonnx")[0] + MATRIX.split('onnx = "broken.onnx"\n')[1])
    shutil.copytree(work / "res", work / "check" / "results")  # its builds and done cells: the run resumes
    for cell_id, record in _cells(work / "check" / "results").items():
        if record["status"] != "done":
            (work / "check" / "results" / "cells" / f"{cell_id}.json").unlink()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)]), "GPU_CHECK_HERE": "1", "MATRIX": str(work / "check.toml")}
    done = subprocess.run(["bash", str(REPO / "docker" / "gpu-check.sh"), str(work / "check")], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    check = work / "check"
    summary = (check / "summary.txt").read_text().splitlines()
    assert summary == ["docker-build: skipped (GPU_CHECK_HERE=1: the steps run with this machine's python)",
                       "pytest-gpu: skipped (TensorRT is not installed here (import tensorrt: No module named 'tensorrt'))",
                       "jobs-run: exit 0", "gather-html: exit 0", "gather-md: exit 0"]
    assert (check / "nvidia-smi.txt").read_text().strip()
    report = (check / "report.md").read_text()
    assert "4 done, 0 failed, 4 skipped" in report and "needs TensorRT and a GPU" in report
    assert (check / "report.html").read_text().startswith("<!doctype html>")


def test_the_docs_cost_table_is_the_recorded_benchmark():
    import importlib.util

    spec = importlib.util.spec_from_file_location("jobs_speed", REPO / "bench" / "jobs_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (REPO / "docs" / "jobs.md").read_text()
    block = text[text.index("<!-- jobs_speed table -->") + len("<!-- jobs_speed table -->"):text.index("<!-- end of jobs_speed table -->")]
    assert block == "\n" + module.table(json.loads(module.RESULTS.read_text()))


def test_every_repeat_lasts_the_minimum_duration_when_the_runs_get_faster_after_calibrating(monkeypatch, tmp_path):
    """The new user's INVALID cell: the count was calibrated once (54 runs of 5.6 ms for 300 ms) and the later repeats
    ran faster (341, 275, 224 ms). Each repeat must last min_duration_ms: a short one is run again with more runs."""
    import trt.bench
    from pipeline.jobs.cell import _time
    from pipeline.jobs.plan import Cell

    per_run_ms = iter([5.6, 5.6, 6.3, 5.1, 4.1, 4.1, 4.1, 4.1, 4.1, 4.1])  # one per bench() call: calibration, then the repeats

    def fake_bench(models, backend, feeds, warmup, iterations, **_):
        mean = next(per_run_ms)
        row = {"model": "m", "p50_ms": mean, "p90_ms": mean, "p99_ms": mean, "mean_ms": mean, "min_ms": mean, "max_ms": mean,
               "throughput_per_s": 1000 / mean, "iterations": iterations}
        return {"timing": "wall clock", "batch": 1, "input_shapes": {"x": [1, 8]}, "models": {"fp32": row}}

    monkeypatch.setattr(trt.bench, "bench", fake_bench)
    (tmp_path / "tiny.toml").write_text(TINY_MLP_PROFILE)
    method = {"seed": 0, "warmup_ms": 10, "min_duration_ms": 300, "min_iterations": 10}
    cell = Cell(index=0, model="tiny-mlp", profile=str(tmp_path / "tiny.toml"), onnx=None, shape={"batch": 1}, precision="fp32",
                backend="ort-cpu", builder={}, gpu="cpu", method=method, repeats=3)
    record = {"repeats": [], "validity": []}
    _time(cell, tmp_path / "model.onnx", record)
    assert len(record["repeats"]) == 3 and all(r["timed_ms"] >= 300 for r in record["repeats"]), record["repeats"]
    assert record["valid"] is True and record["validity"] == []


def test_an_ort_cuda_cell_on_a_gpu_host_without_onnxruntimes_cuda_provider_is_skipped_before_its_build(monkeypatch):
    """Seen on a lent H100 whose onnxruntime was the CPU build: each ort-cuda cell of the GPU matrix built its model
    (minutes for bert-base) before bench found no CUDA provider; run_cell now skips it before the build, as a trt
    cell is without TensorRT."""
    import onnxruntime

    from pipeline.core import devices
    from pipeline.jobs import cell as cells
    from pipeline.jobs.plan import Cell

    monkeypatch.setattr(devices, "cuda_device_present", lambda: True)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    gpu = {"gpu_absent": None, "name": "NVIDIA H100 80GB HBM3"}  # NVML's facts there
    method = {"seed": 0, "warmup_ms": 10, "min_duration_ms": 300, "min_iterations": 10}
    cell = Cell(index=0, model="bert-tiny", profile="bert-tiny", onnx=None, shape={}, precision="fp32", backend="ort-cuda", builder={},
                gpu="local", method=method, repeats=1)
    assert cells._missing_capability(cell, gpu) == ("ort-cuda needs onnxruntime's CUDA provider: this machine has a GPU but its "
                                                    f"onnxruntime {onnxruntime.__version__} has no CUDA provider (install onnxruntime-gpu)")


def test_an_ort_cpu_cell_on_a_gpu_machine_is_shown_on_its_cpu_not_on_the_gpu_nvml_names(tmp_path):
    """Seen on a lent H100 (2026-11-27): the gathered report put bert-tiny's ort-cpu latencies under "NVIDIA H100 80GB
    HBM3", the GPU NVML reported and the cell never used, and grouped their speedups with the GPU's."""
    from pipeline.jobs.gather import gather, render_md

    nvml = {"gpu_absent": None, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "driver": "580.159.04"}  # what it read there
    host = {"machine": "x86_64", "cpu": "Intel(R) Xeon(R) Processor", "cpus": 16}
    (tmp_path / "cells").mkdir()
    for index, (backend, p50) in enumerate((("ort-cpu", 4.63), ("trt", 0.21))):
        definition = {"model": "bert-tiny", "precision": "fp32", "backend": backend, "shape": {}, "builder": {}, "gpu": "cpu" if backend == "ort-cpu" else "local"}
        record = {"schema": 1, "id": f"{index}" * 12, "index": index, "label": f"bert-tiny fp32 static {backend}", "definition": definition,
                  "status": "done", "reason": None, "docker": None, "validity": [], "repeats": [{"p50_ms": p50}],
                  "provenance": {"host": host, "gpu_before": nvml}, "latency": {"p50_ms": p50, "p90_ms": p50, "cv": 0.02}}
        (tmp_path / "cells" / f"{record['id']}.json").write_text(json.dumps(record))
    result = gather([tmp_path])
    assert {row["backend"]: row["gpu_name"] for row in result["cells"]} == {"ort-cpu": "CPU: Intel(R) Xeon(R) Processor", "trt": "NVIDIA H100 80GB HBM3"}
    assert result["gpus"] == ["CPU: Intel(R) Xeon(R) Processor", "NVIDIA H100 80GB HBM3"]
    assert "| ort-cpu | CPU: Intel(R) Xeon(R) Processor | 4.630 |" in render_md(result)


def test_the_gathered_page_shows_why_a_cell_is_invalid_and_keeps_headers_on_one_line(tmp_path):
    """The reason a cell is INVALID is on the page, not only in a tooltip; column headers do not wrap ("to run it" took 3 lines);
    the "to run it" column is left out when no cell has a command to run it."""
    import re

    from pipeline.jobs.gather import gather, render_html, render_md

    definition = {"model": "tiny-mlp", "precision": "fp32", "backend": "ort-cpu", "shape": {"batch": 8}, "builder": {}, "gpu": "cpu"}
    reason = "2 of 3 repeats under the minimum duration (300 ms) or iteration count (10) after 3 longer reruns"
    cells = {"a" * 12: {"status": "done", "valid": False, "validity": [reason], "repeats": [{"p50_ms": 4.0}],
                        "latency": {"p50_ms": 4.0, "p90_ms": 4.2, "p99_ms": 4.4, "mean_ms": 4.1, "throughput_per_s": 1900.0, "cv": 0.17}},
             "b" * 12: {"status": "skipped", "reason": "onnxruntime's CPUExecutionProvider has no kernel for it"}}
    (tmp_path / "cells").mkdir()
    for index, (cell_id, fields) in enumerate(cells.items()):
        record = {"schema": 1, "id": cell_id, "index": index, "label": "tiny-mlp fp32 batch=8 ort-cpu on cpu", "definition": definition,
                  "reason": None, "docker": None, "validity": []} | fields
        (tmp_path / "cells" / f"{cell_id}.json").write_text(json.dumps(record))
    page = render_html(gather([tmp_path]))
    shown = re.sub(r"<[^>]*>", " ", page)  # the text a reader sees, without tags and their attributes
    assert reason in shown and "INVALID" in shown
    assert re.search(r"\bth \{[^}]*white-space: nowrap", page)
    assert "to run it" not in page
    skipped = json.loads((tmp_path / "cells" / f"{'b' * 12}.json").read_text()) | {"docker": "docker run --gpus all -v /data/res:/res trt-pipeline"}
    (tmp_path / "cells" / f"{'b' * 12}.json").write_text(json.dumps(skipped))
    page = render_html(gather([tmp_path]))  # a command wraps at its spaces and after / (it broke anywhere)
    assert "to run it" in page and "break-all" not in page
    assert '<td class="cmd">docker run --gpus all -v /<wbr>data/<wbr>res:/<wbr>res trt-pipeline</td>' in page
    assert "; to run it: `docker run --gpus all -v /data/res:/res trt-pipeline`" in render_md(gather([tmp_path]))  # md keeps it too


def test_plan_says_before_the_run_when_the_matrix_needs_transformers_and_it_is_not_installed(monkeypatch):
    """The packaged CPU matrix's hf-bert-tiny cells need the [hf] extra: after the quick start's install they failed in
    the run, one by one; `jobs plan` now says so first (and nothing where transformers is there)."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    matrix = str(REPO / "profiles" / "matrix-cpu.toml")
    installed = CliRunner().invoke(app, ["jobs", "plan", matrix])
    assert installed.exit_code == 0 and "note:" not in installed.output
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed: find_spec answers None
    missing = CliRunner().invoke(app, ["jobs", "plan", matrix])
    assert missing.exit_code == 0
    assert missing.output.splitlines()[-1].startswith(
        'note: model hf-bert-tiny (model.hf/hf_config) needs transformers: pip install "transformers')
    assert missing.output.splitlines()[-1].endswith('(the [hf] extra); `jobs run` fails their cells here without it')
    as_json = CliRunner().invoke(app, ["jobs", "plan", matrix, "--format", "json"])
    assert as_json.exit_code == 0 and len(json.loads(as_json.stdout)) == len(missing.output.splitlines()) - 2  # the cells, and no note
    assert as_json.stderr.strip() == missing.output.splitlines()[-1], "json says the same, on stderr"
