"""`jobs gather`: the cells of one or more results folders in one report (html, json or md): a table
of latency with each engine's Myelin region count and verdict beside it, plots of latency per model x
precision x shape per GPU type (error bars p50..p90 and the spread across repeats) and of the speedups
of each precision over FP32 (and of each quantized one over FP16), the cells that failed or were skipped with their reason; and the baseline gate."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

from pipeline import precisions as registry
from pipeline.core.collector import collector_paused
from pipeline.core.errors import InputError
from pipeline.core.text import html_breakable
from pipeline.jobs.store import CELL_SCHEMA, read_cells

PLOTTED_GROUPS = 40  # bars per plot; the table holds every cell


def gather(folders: list[Path]) -> dict[str, Any]:
    by_id = {record["id"]: ((record["definition"]["gpu"], record["index"]), _row(record))  # a cell in two folders: the last
             for folder in folders for record in read_cells(folder)}
    rows = [row for _, row in sorted(by_id.values(), key=lambda item: item[0])]
    done = [r for r in rows if r["status"] == "done"]
    return {
        "schema": CELL_SCHEMA, "folders": [str(f) for f in folders],
        "counts": {status: sum(r["status"] == status for r in rows) for status in ("done", "failed", "skipped")},
        "gpus": sorted({r["gpu_name"] for r in done}),
        "cells": rows, "speedups": _speedups(done),
        "not_run": [{"id": r["id"], "label": r["label"], "status": r["status"], "reason": r["reason"], "docker": r["docker"]}
                    for r in rows if r["status"] != "done"],
    }


def _row(record: dict[str, Any]) -> dict[str, Any]:
    d = record["definition"]
    latency = record.get("latency") or {}
    engine = record.get("engine") or {}
    repeats = record.get("repeats") or []
    return {
        "id": record["id"], "label": record["label"], "status": record["status"], "reason": record.get("reason"),
        "docker": record.get("docker"), "model": d["model"], "precision": d["precision"], "backend": d["backend"],
        "shape": ",".join(f"{k}={v}" for k, v in d["shape"].items()) or "static",
        "builder": " ".join(f"{k}={v}" for k, v in d["builder"].items()), "gpu": d["gpu"],
        "gpu_name": _device_name(record),
        "p50_ms": latency.get("p50_ms"), "p90_ms": latency.get("p90_ms"), "p99_ms": latency.get("p99_ms"),
        "throughput_per_s": latency.get("throughput_per_s"), "cv": latency.get("cv"),
        "p50_min_ms": min((r["p50_ms"] for r in repeats), default=None), "p50_max_ms": max((r["p50_ms"] for r in repeats), default=None),
        "valid": record.get("valid"), "validity": record.get("validity") or [],
        "regions": engine.get("myelin_graphs"), "layers": engine.get("layers"), "verdict": engine.get("verdict"),
        **_predicted(engine.get("predicted") or {}),
        "engine_report": engine.get("report"),
        "engine_note": None if engine else ("no engine: onnxruntime runs the ONNX model" if d["backend"] != "trt" else None),
    }


def _device_name(record: dict[str, Any]) -> str:
    """What ran the cell: an ort-cpu cell's CPU (on a GPU machine too: its NVML reading names the GPU it did not use),
    else the GPU NVML named, else the matrix's GPU type."""
    provenance = record.get("provenance") or {}
    if record["definition"]["backend"] == "ort-cpu":
        cpu = (provenance.get("host") or {}).get("cpu")
        return f"CPU: {cpu}" if cpu else "CPU"
    return (provenance.get("gpu_before") or {}).get("name") or record["definition"]["gpu"]


def _predicted(score: dict[str, Any]) -> dict[str, Any]:
    """The prediction from the engine's ONNX beside what was built: its regions, layers and grouping pair F1."""
    def predicted(key: str):
        return (score.get(key) or {}).get("predicted")

    return {"predicted_regions": predicted("myelin_regions"), "predicted_layers": predicted("layers"),
            "prediction_f1": (score.get("grouping") or {}).get("f1")}


# (faster, base) pairs of precisions whose p50 ratio the report shows
SPEEDUPS = tuple((p.name, base) for base in (registry.REFERENCE, "fp16") for p in registry.PRECISIONS
                 if p.name not in (registry.REFERENCE, base) and (base == registry.REFERENCE or p.quantized))


def _speedups(done: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every precision over FP32, and each quantized one over FP16 (as the build's diff pairs them), for each
    model x shape x backend x builder x GPU."""
    by_key: dict[tuple, dict[str, float]] = {}
    for row in done:
        key = (row["model"], row["shape"], row["backend"], row["builder"], row["gpu_name"])
        by_key.setdefault(key, {})[row["precision"]] = row["p50_ms"]
    return [{"model": model, "shape": shape, "backend": backend, "builder": builder, "gpu": gpu,
             "ratio": f"{faster}/{base}", "speedup": round(p50[base] / p50[faster], 3)}
            for (model, shape, backend, builder, gpu), p50 in by_key.items() for faster, base in SPEEDUPS
            if faster in p50 and base in p50 and p50[faster]]


def compare(current: dict[str, Any], baseline: dict[str, Any], max_slowdown: float) -> list[dict[str, Any]]:
    """Cells done in both whose p50 grew by more than `max_slowdown` (0.05 = 5%); raises when none are common."""
    old = {r["id"]: r for r in baseline["cells"] if r["status"] == "done"}
    common = [r for r in current["cells"] if r["status"] == "done" and r["id"] in old]
    if not common:
        raise InputError(f"--baseline {', '.join(baseline['folders'])}: no cell done there is done in {', '.join(current['folders'])} "
                         "(cell ids come from each cell's definition: compare runs of the same matrix)")
    slow = []
    for row in common:
        change = row["p50_ms"] / old[row["id"]]["p50_ms"] - 1
        row["baseline_p50_ms"], row["change"] = old[row["id"]]["p50_ms"], round(change, 4)
        if change > max_slowdown:
            slow.append(row)
    return slow


def parse_slowdown(text: str) -> float:
    try:
        value = float(text.strip().removesuffix("%")) / (100 if text.strip().endswith("%") else 1)
    except ValueError:
        raise InputError(f"--max-slowdown {text!r}: give a percentage like 5% (or a fraction like 0.05)") from None
    if not 0 <= value < 10:
        raise InputError(f"--max-slowdown {text!r}: give a percentage from 0% up, like 5%")
    return value


def plots(result: dict[str, Any]) -> dict[str, str]:
    """PNG plots as base64: latency per model x precision x shape for each GPU type, and speedups."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in result["cells"] if r["status"] == "done"]
    images = {}
    if done:
        gpus = sorted({r["gpu_name"] for r in done})
        figure, axes = plt.subplots(len(gpus), 1, figsize=(9, 2.8 * len(gpus) + 0.6), dpi=100, squeeze=False)
        colors = dict(zip(registry.names(), plt.get_cmap("tab10").colors))
        for axis, gpu in zip(axes[:, 0], gpus):
            rows = [r for r in done if r["gpu_name"] == gpu]
            labels = [f"{r['model']}\n{r['shape']} {r['backend']}{(' ' + r['builder']) if r['builder'] else ''}" for r in rows]
            groups = list(dict.fromkeys(labels))[:PLOTTED_GROUPS]
            position = {group: x for x, group in enumerate(groups)}
            precisions = [p for p in registry.names() if any(r["precision"] == p for r in rows)]
            width = 0.8 / max(1, len(precisions))
            for n, precision in enumerate(precisions):
                xs, ys, low, high = [], [], [], []
                for r, group in zip(rows, labels):
                    if r["precision"] == precision and group in position:
                        xs.append(position[group] + (n - (len(precisions) - 1) / 2) * width)
                        ys.append(r["p50_ms"])
                        low.append(max(0.0, r["p50_ms"] - (r["p50_min_ms"] or r["p50_ms"])))
                        high.append(max(0.0, r["p90_ms"] - r["p50_ms"]))
                axis.bar(xs, ys, width, yerr=[low, high], capsize=3, color=colors[precision], label=precision)
            axis.set_xticks(range(len(groups)), groups, fontsize=7)
            latencies = [r["p50_ms"] for r in rows]
            log = max(latencies) > 20 * min(latencies)
            if log:  # tiny and large models side by side
                axis.set_yscale("log")
            axis.set_ylabel("p50 latency (ms" + (", log scale)" if log else ")"))
            axis.set_title(f"{gpu}: p50, whiskers from the fastest repeat's p50 to p90", fontsize=9)
            axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside the bars, never over one
        figure.tight_layout()
        images["latency"] = _png(figure, plt)
    if result["speedups"]:
        rows = result["speedups"][:PLOTTED_GROUPS]
        figure, axis = plt.subplots(figsize=(9, 0.28 * len(rows) + 1.2), dpi=100)
        labels = [f"{r['model']} {r['shape']} {r['backend']} {r['gpu']}: {r['ratio']}" for r in rows]
        axis.barh(labels, [r["speedup"] for r in rows], color=["#76b900" if r["speedup"] >= 1 else "#cc3333" for r in rows])
        axis.axvline(1.0, color="#333", linewidth=1)
        axis.invert_yaxis()
        axis.tick_params(axis="y", labelsize=7)
        axis.set_xlabel("speedup of A over B in A/B (p50 of B / p50 of A; > 1: A is faster)")
        figure.tight_layout()
        images["speedup"] = _png(figure, plt)
    return images


def _png(figure, plt) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def render_html(result: dict[str, Any], slow: list[dict[str, Any]] | None = None) -> str:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    class KeysFirst(Environment):
        """`c.p50_ms` looks the key up first: the template reads dicts only, and jinja2's default tries
        the attribute first, failing with an exception for each of a 10,000-row table's 200,000 reads."""

        def getattr(self, obj: Any, attribute: str) -> Any:
            return self.getitem(obj, attribute)

    env = KeysFirst(loader=FileSystemLoader(Path(__file__).parent / "templates"), autoescape=select_autoescape(default=True))
    env.filters["breakable"] = html_breakable
    with collector_paused():
        return env.get_template("gather.html.j2").render(r=result, images=plots(result), slow=slow)


def render_md(result: dict[str, Any], slow: list[dict[str, Any]] | None = None) -> str:
    def cell(value: Any) -> str:
        text = "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", " ")

    c = result["counts"]
    lines = [f"# Benchmark jobs: {c['done']} done, {c['failed']} failed, {c['skipped']} skipped", "",
             "| cell | model | precision | shape | backend | ran on | p50 ms | p90 ms | cv | valid | regions | predicted regions / layers | verdict |",
             "|---|---|---|---|---|---|---:|---:|---:|---|---:|---:|---|"]
    for r in result["cells"]:
        if r["status"] == "done":
            predicted = f"{r['predicted_regions']} / {r['predicted_layers']}" if r["predicted_regions"] is not None else None
            lines.append("| " + " | ".join(cell(v) for v in (r["id"], r["model"], r["precision"], r["shape"], r["backend"], r["gpu_name"],
                                                          r["p50_ms"], r["p90_ms"], r["cv"], r["valid"], r["regions"], predicted,
                                                          r["verdict"] or r["engine_note"])) + " |")
    if result["speedups"]:
        lines += ["", "| model | shape | backend | ran on | A/B | speedup of A over B (p50 of B / p50 of A) |", "|---|---|---|---|---|---:|"]
        lines += ["| " + " | ".join(cell(s[k]) for k in ("model", "shape", "backend", "gpu", "ratio", "speedup")) + " |" for s in result["speedups"]]
    if result["not_run"]:
        lines += ["", "## Not run", ""] + [f"- `{r['id']}` {cell(r['label'])}: {r['status']}, {cell(r['reason'])}"
                                          + (f"; to run it: `{r['docker']}`" if r["docker"] else "") for r in result["not_run"]]
    if slow:
        lines += ["", "## Slower than the baseline allows", ""] + [f"- `{r['id']}` {cell(r['label'])}: {r['change']:+.1%}" for r in slow]
    return "\n".join(lines) + "\n"
