"""The report stage: for each engine built, which ONNX nodes fused into which layers and Myelin regions
(trt/report.py), as JSON and HTML beside the engine, and how well the prediction from its ONNX matched it
(trt/predict/score.py), in the manifest."""

from __future__ import annotations

from dataclasses import asdict

from pipeline.stage import Job, Stage, StageResult
from pipeline.stages.engines import engine_inputs, engines_built, no_engine


def run_report(job: Job) -> StageResult:
    built = engines_built(job)
    if not built:
        return no_engine("report", job)
    from pipeline.core.fileio import write_text
    from trt.render import render
    from trt.report import report_from_files

    outputs, metrics = {}, {}
    for precision in built:
        prec = precision.name
        job.status(f"reporting the {prec} engine")
        data = report_from_files(job.input("build", f"{prec}_layers"), job.input(precision.stage, "onnx"), job.input("build", f"{prec}_profile"))
        for fmt in ("json", "html"):
            write_text(job.out / f"{prec}.report.{fmt}", render(data, fmt))
            outputs[f"{prec}_{fmt}"] = job.out / f"{prec}.report.{fmt}"
        metrics[prec] = asdict(data.summary) | {"verdict": data.verdict, "findings": data.findings,
                                                 "prediction": prediction_score(job.input(precision.stage, "onnx"), data.plan)}
    return StageResult(outputs, metrics)


def prediction_score(onnx, plan) -> dict:
    """How well the prediction from the engine's ONNX (trt/predict/) matches the engine built: `jobs gather` shows it."""
    from pipeline.core.onnxfile import load_onnx
    from quant.lint import family_rules
    from trt.predict.score import score_engine

    model = load_onnx(onnx, weights=True)
    return score_engine(model, str(onnx), plan, family_rules(model))


STAGE = Stage(
    "report", run_report,
    reads=("precisions",),
    inputs=("build.*", *engine_inputs()),
    key_metric=lambda m: ", ".join(f"{p}: {v['myelin_graphs']} Myelin graphs / {v['layers']} layers"
                                   f" (predicted {v['prediction']['myelin_regions']['predicted']} / {v['prediction']['layers']['predicted']})"
                                   for p, v in m.items()),
)
