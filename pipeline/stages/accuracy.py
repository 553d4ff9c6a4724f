"""What the fp16 and int8 stages share: the held-out samples, the FP32 reference run beside the
conversion, the accuracy figures and the gate."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.profiles import Profile
from pipeline.runner import Job, Status
from pipeline.stages import seeds

if TYPE_CHECKING:
    from pipeline.core.verify import OnnxSession
    from quant.accuracy import BackgroundOutputs

# what the held-out samples are made from: every stage that uses them declares these
HELD_OUT_READS = ("inputs", "dims", "quant.accuracy_samples")


def held_out(profile: Profile) -> list[dict]:
    """The held-out accuracy samples (seeds apart from calibration's), stacked into as few runs as the batch dim allows."""
    from pipeline.core.samples import make_inputs, stack_batches

    samples = profile.quant.accuracy_samples
    return stack_batches(profile, [make_inputs(profile, seed=seeds.HELD_OUT_SEED + i) for i in range(samples)])


@contextmanager
def fp32_reference(job: Job, batches: list[dict], kind: str = "held-out") -> Iterator[BackgroundOutputs]:
    """The optimized FP32 model's outputs on the held-out samples, started on a worker thread so
    they are computed while the stage converts (AutoCast, ModelOpt's calibration). Computed once per
    build: the fp16 and int8 stages share them, keyed by the FP32 model's sha256 and the `kind` of
    samples. A stage that fails or is interrupted stops the run."""
    from quant.accuracy import BackgroundOutputs

    source = job.input("optimize", "onnx")
    key = ("fp32 outputs", job.input_sha256("optimize", "onnx"), len(batches), kind)
    if key not in job.cache:
        job.cache[key] = BackgroundOutputs(source, batches)
    reference = job.cache[key]
    try:
        yield reference
    except BaseException:
        reference.cancel()
        job.cache.pop(key, None)
        raise


def accuracy(candidate: Path | OnnxSession, reference: BackgroundOutputs, batches: list[dict], samples: int, label: str,
             status: Status) -> dict[str, Any]:
    """Accuracy of `candidate` against the FP32 reference. The figures record the check's wall time in the
    stage (`check_seconds`: the candidate's run, then any wait for the reference), within it the wait
    (`reference_wait_seconds`), and the reference run's own time beside the conversion (`reference_seconds`,
    0 in a stage that reused it), so the check's share of the stage is on record."""
    from quant.accuracy import accuracy as figures_of
    from quant.accuracy import model_outputs

    started = time.perf_counter()
    status(f"running the {label} model on {samples} held-out samples")
    outputs = model_outputs(candidate, batches)
    status("waiting for the FP32 model's run on the held-out samples")
    waiting = time.perf_counter()
    expected = reference.result()
    waited = time.perf_counter() - waiting
    figures = figures_of(expected, outputs, samples)
    return {**figures, "check_seconds": round(time.perf_counter() - started, 3), "reference_wait_seconds": round(waited, 3),
            "reference_seconds": round(reference.seconds, 3) if reference.served == 1 else 0.0}


def gate(stage: str, metrics: dict[str, Any], minimum: float) -> None:
    from pipeline.core.errors import StageFailed

    if not metrics["cosine_centered"] >= minimum:
        raise StageFailed(
            f"{stage}: accuracy below the gate: cosine_centered={metrics['cosine_centered']:.5f} < {minimum} "
            f"(cosine={metrics['cosine']:.6f}, max_abs_diff={metrics['max_abs_diff']:.3g} vs FP32 on {metrics['samples']} held-out samples); "
            f"{GATE_HINTS.get(stage, 'exclude sensitive nodes, try another preset or more calibration data')}, or lower --min-cosine"
        )


# what to try when FP16's accuracy is below its gate: `compare` on the FP16 model (written by `quantize`
# with the same flags) names the nodes where the error grows
GATE_HINTS = {
    "fp16": ("keep the nodes that lose it in FP32 ([quant] fp16_exclude_nodes or fp16_exclude_op_types): `python -m pipeline "
             "quantize model.opt.onnx -o fp16.onnx --fp16 --profile P`, then `python -m pipeline compare model.opt.onnx fp16.onnx "
             "--profile P` lists them"),
}
