"""Kubernetes manifests for a matrix: a ConfigMap holding the matrix, one Indexed Job per GPU type
(completion index N = that type's N-th cell, `jobs cell --gpu TYPE` reads JOB_COMPLETION_INDEX),
a CPU Job for ort-cpu cells; and a gather Job, in its own file, to apply once they complete."""

from __future__ import annotations

import re
import shlex
from collections import Counter
from typing import Any

from pipeline.core.errors import InputError
from pipeline.jobs.plan import Cell
from pipeline.jobs.spec import Matrix

MATRIX_MOUNT = "/matrix"
RESULTS_MOUNT = "/results"
GPU_LABEL = "nvidia.com/gpu.product"


def manifests(matrix: Matrix, cells: list[Cell], parallelism: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the ConfigMap and the cell Jobs, the gather Job): apply the second once the first have completed."""
    cluster = matrix.cluster
    if cluster is None:
        raise InputError(f"{matrix.source}: has no [cluster] section; add gpus, image and results_pvc (or results_uri) to write Kubernetes Jobs")
    groups = Counter(cell.gpu for cell in cells)
    documents: list[dict[str, Any]] = [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"{matrix.name}-matrix", "namespace": cluster.namespace, "labels": _labels(matrix)},
        "data": {"matrix.toml": matrix.source.read_text(encoding="utf-8")},
    }]
    for gpu, count in groups.items():
        command = ["python", "-m", "pipeline", "jobs", "cell", f"{MATRIX_MOUNT}/matrix.toml", "--gpu", gpu, "--out", RESULTS_MOUNT]
        documents.append(_job(matrix, _name(matrix.name, gpu), command, gpu, indexed=count, parallelism=parallelism or cluster.parallelism))
    gather = ["python", "-m", "pipeline", "jobs", "gather", RESULTS_MOUNT, "-o", f"{RESULTS_MOUNT}/report.html"]
    return documents, [_job(matrix, f"{matrix.name}-gather", gather, gpu="cpu", indexed=None, parallelism=1)]


def _labels(matrix: Matrix) -> dict[str, str]:
    labels = {"app.kubernetes.io/name": "trt-pipeline", "trt-pipeline/matrix": matrix.name}
    if matrix.cluster and matrix.cluster.queue:
        labels["kueue.x-k8s.io/queue-name"] = matrix.cluster.queue
    return labels


def _name(matrix: str, gpu: str) -> str:
    """`<matrix>-<gpu type>`, lowercase, at most 52 characters: pod hostnames add `-<index>` within 63."""
    return f"{matrix}-{re.sub(r'[^a-z0-9-]+', '-', gpu.lower())}"[:52].strip("-")


def _job(matrix: Matrix, name: str, command: list[str], gpu: str, indexed: int | None, parallelism: int) -> dict[str, Any]:
    cluster = matrix.cluster
    assert cluster is not None
    volumes = [{"name": "matrix", "configMap": {"name": f"{matrix.name}-matrix"}}]
    mounts = [{"name": "matrix", "mountPath": MATRIX_MOUNT, "readOnly": True}]
    if cluster.results_pvc:
        volumes.append({"name": "results", "persistentVolumeClaim": {"claimName": cluster.results_pvc}})
    else:
        volumes.append({"name": "results", "emptyDir": {}})
        command = _with_object_store(command, cluster.results_uri, gather=indexed is None)
    mounts.append({"name": "results", "mountPath": RESULTS_MOUNT})
    container: dict[str, Any] = {"name": "cell" if indexed else "gather", "image": cluster.image, "command": command, "volumeMounts": mounts,
                                 "env": [{"name": "IMAGE_DIGEST", "value": cluster.image.partition("@")[2] or ""}]}
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container], "volumes": volumes}
    if gpu not in ("cpu", "local"):
        container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
        pod["nodeSelector"] = {GPU_LABEL: gpu}
    spec: dict[str, Any] = {"template": {"metadata": {"labels": _labels(matrix)}, "spec": pod}}
    if indexed:
        spec.update(completionMode="Indexed", completions=indexed, parallelism=min(parallelism, indexed),
                    backoffLimitPerIndex=cluster.backoff_limit_per_index)
    else:
        spec.update(completions=1, parallelism=1, backoffLimit=cluster.backoff_limit_per_index)
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": cluster.namespace, "labels": _labels(matrix)}, "spec": spec}


def _with_object_store(command: list[str], uri: str | None, gather: bool) -> list[str]:
    """Results on an emptyDir, copied to (and for gather, first from) the object store by its CLI in the image."""
    copy = "aws s3 cp --recursive" if uri and uri.startswith("s3://") else "gsutil -m cp -r"
    run = shlex.join(command)
    if gather:
        script = f"{copy} {uri}/cells {RESULTS_MOUNT}/cells && {run} && {copy} {RESULTS_MOUNT}/report.html {uri}/report.html"
    else:
        script = f"{run}; status=$?; {copy} {RESULTS_MOUNT}/cells {uri}/cells; exit $status"
    return ["sh", "-c", script]


def to_yaml(documents: list[dict[str, Any]], header: str) -> str:
    import yaml

    return "".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False)
