"""The diff stage: every quantized engine of the build against the float one (FP16 when it was built, else
FP32), region by region (trt/diff.py), as JSON and HTML. Cheap: never cached."""

from __future__ import annotations

from pipeline.precisions import REFERENCE
from pipeline.stage import Job, Stage, StageResult
from pipeline.stages.engines import engine_inputs, engines_built, no_engine


def pairs(built) -> list[tuple]:
    """(reference, quantized) for each quantized precision built: the reference is FP16 when built, else FP32."""
    names = {p.name: p for p in built}
    reference = names.get("fp16") or names.get(REFERENCE)
    return [(reference, p) for p in built if p.quantized] if reference else []


def run_diff(job: Job) -> StageResult:
    built = engines_built(job)
    if not built:
        return no_engine("diff", job)
    todo = pairs(built)
    if not todo:
        return StageResult({}, skipped=True, reason=f"diff: no quantized engine to compare with a float one (built: {', '.join(p.name for p in built)})")
    from pipeline.core.fileio import write_text
    from trt.diff import diff_from_files
    from trt.render import render

    outputs, metrics = {}, {}
    for a, b in todo:
        job.status(f"diffing the {a.label} and {b.label} engines")
        data = diff_from_files(job.input("build", f"{a.name}_layers"), job.input("build", f"{b.name}_layers"), job.input(a.stage, "onnx"),
                               job.input(b.stage, "onnx"), job.input("build", f"{a.name}_profile"), job.input("build", f"{b.name}_profile"))
        for fmt in ("json", "html"):
            path = job.out / f"diff.{a.name}-{b.name}.{fmt}"
            write_text(path, render(data, fmt))
            outputs[f"{a.name}-{b.name}_{fmt}"] = path
        found = data.to_json()
        metrics[f"{a.name}-{b.name}"] = {"join": data.join, "verdict": data.verdict, "totals": found["totals"], "splits": len(data.splits),
                                         "merges": len(data.merges), "findings": data.findings}
    return StageResult(outputs, metrics)


def _summary(metrics: dict) -> str:
    return "; ".join(f"{pair}: {m['splits']} fused groups split, layers {m['totals']['layers']['a']} -> {m['totals']['layers']['b']}"
                     for pair, m in metrics.items())


STAGE = Stage("diff", run_diff, reads=("precisions",), inputs=("build.*", *engine_inputs()), cached=False, key_metric=_summary)
