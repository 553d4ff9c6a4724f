"""What the TensorRT stages (build, report, diff, bench) share: which precisions' engines a build makes
and from which file, which it wrote, and the reasons they are skipped without TensorRT or an engine."""

from __future__ import annotations

from pipeline import precisions
from pipeline.settings import Settings
from pipeline.stage import Input, Job, StageResult


def engine_inputs() -> tuple[Input, ...]:
    """The ONNX file of each precision's engine: the optimized model always, a precision's own when it is built."""
    return tuple(Input(f"{p.stage}.onnx", when=None if p.module is None else (lambda s, name=p.name: name in s.precisions))
                 for p in precisions.PRECISIONS)


def engines_built(job: Job) -> list[precisions.Precision]:
    """The precisions whose engine (and its layer information) the build recorded, in registry order."""
    labels = job.outputs_of("build")
    return [p for p in precisions.PRECISIONS if f"{p.name}_layers" in labels]


def precisions_of(settings: Settings) -> list[precisions.Precision]:
    return [p for p in precisions.PRECISIONS if p.name in settings.precisions]


def skip_without_tensorrt(what: str, job: Job, wanted: list[precisions.Precision] = ()) -> StageResult | None:
    """A skip with the reason and the command that runs it in our image, when TensorRT is not here; None when it is.
    The precisions `wanted` that need a newer GPU say so."""
    from trt.capability import needs_tensorrt, tensorrt_missing

    missing = tensorrt_missing()
    if missing is None:
        return None
    requirements = {p.name: {"requires_compute_capability": ".".join(map(str, p.min_compute_capability))} for p in wanted if p.min_compute_capability}
    needs = "".join(f" (the {precisions.by_name(name).label} engine also needs compute capability {n['requires_compute_capability']}+)"
                    for name, n in requirements.items())
    reason = needs_tensorrt(what, missing + needs, job.rerun_hint())
    return StageResult({}, requirements, skipped=True, reason=reason, capability_missing=True)


def no_engine(what: str, job: Job) -> StageResult:
    status = job.status_of("build")
    why = f"the build stage was {status}" if status else "no build stage ran"
    return StageResult({}, skipped=True, reason=f"{what}: no engine layer information ({why})", capability_missing=False)
