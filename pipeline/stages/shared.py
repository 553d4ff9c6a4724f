"""What the precision stages share: the held-out samples and the FP32 reference run beside the
conversion, the accuracy figures and the gate, the shape checks, the calibration data and batch, the
libraries' log, and what `python -m pipeline quantize` hands a precision's module."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core import seeds
from pipeline.core.profiles import Profile
from pipeline.stage import Job, Status

if TYPE_CHECKING:
    from pipeline.core.verify import OnnxSession
    from quant.accuracy import BackgroundOutputs

# what the held-out samples are made from: every stage that uses them declares these
HELD_OUT_READS = ("inputs", "dims", "quant.accuracy_samples")
# what calibration data is made from (the profile's samples, or --calib)
CALIBRATION_READS = ("calib", "inputs", "dims", "quant.samples")
SEQUENCE_DIMS = ("seq", "sequence", "seq_len")


@dataclass(frozen=True)
class QuantizeRequest:
    """`python -m pipeline quantize SOURCE -o OUTPUT --<precision>`: what its module's `quantize_command` gets."""

    source: Path
    output: Path
    profile: Profile | None  # --profile: its settings, samples and shapes (as the build holding `source` saw it)
    calib: Path | None
    preset: str | None
    float_parts: str | None = None  # the other precision flag given, when the registry lets them combine (--int8 --fp16)
    fixed: dict | None = None  # an encoder-decoder's decoder part: the encoder outputs its build checked it on
    on_step: Callable[[int, int], None] = lambda done, total: None


def held_out(profile: Profile) -> list[dict]:
    """The held-out accuracy samples (seeds apart from calibration's), stacked into as few runs as the batch dim allows."""
    from pipeline.core.samples import make_inputs, stack_batches

    samples = profile.quant.accuracy_samples
    return stack_batches(profile, [make_inputs(profile, seed=seeds.HELD_OUT_SEED + i) for i in range(samples)])


def shape_checks(profile: Profile) -> list[dict]:
    """Inputs at the profile's min, opt and max shapes: a converted model must run at each."""
    from pipeline.core.samples import make_inputs, range_sizes

    return [make_inputs(profile, seed=seeds.FP16_SHAPE_CHECK + i, dims=sizes) for i, sizes in enumerate(range_sizes(profile))]


@contextmanager
def fp32_reference(job: Job, batches: list[dict], kind: str = "held-out", beside: str | None = None,
                   known: tuple[list | None, float] | None = None) -> Iterator[BackgroundOutputs]:
    """The optimized FP32 model's outputs on the held-out samples, started on a worker thread so
    they are computed while the stage converts (AutoCast, ModelOpt's calibration). Computed once per
    build: the precision stages share them, keyed by the FP32 model's sha256 and the `kind` of
    samples. A stage that fails or is interrupted stops the run. Where its session does not fit beside
    ModelOpt's step `beside` (quant.room_for_a_session_beside_modelopt), the run ends before ModelOpt starts.
    `known`: the outputs (flattened) and their seconds, where making the samples ran the FP32 model already."""
    from pipeline.core.rss import release_freed_memory
    from quant import room_for_a_session_beside_modelopt
    from quant.accuracy import BackgroundOutputs

    source = job.input("optimize", "onnx")
    key = ("fp32 outputs", job.input_sha256("optimize", "onnx"), len(batches), kind)
    if key not in job.cache:
        alone = known is None and beside is not None and not room_for_a_session_beside_modelopt(source, beside)
        job.cache[key] = BackgroundOutputs(source, batches, known)
        if alone:
            job.status("running the FP32 model on the held-out samples first (its session does not fit beside ModelOpt's)")
            job.cache[key].finish()
            release_freed_memory()
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
    from quant.accuracy import checked

    started, waited = time.perf_counter(), reference.waited
    status(f"running the {label} model on {samples} held-out samples")
    figures = checked(candidate, batches, reference, reference.path, samples)
    waited = reference.waited - waited
    return {**figures, "check_seconds": round(time.perf_counter() - started, 3), "reference_wait_seconds": round(waited, 3),
            "reference_seconds": round(reference.seconds, 3) if reference.served == 1 else 0.0}


def fp16_gate_hint(source: Path, profile: Profile) -> str:
    """What to try when FP16's accuracy is below its gate: `compare` on the FP16 model (written by `quantize` with
    the same flags) names the nodes where the error grows; this build's own files and profile in the commands."""
    profile_arg = profile.name if profile.packaged else str(profile.source)
    return (f"keep the nodes that lose it in FP32 ([quant] fp16_exclude_nodes or fp16_exclude_op_types): `python -m pipeline quantize "
            f"{source} -o fp16.onnx --fp16 --profile {profile_arg}`, then `python -m pipeline compare {source} fp16.onnx --profile "
            f"{profile_arg}` lists them")


def rounding_limit(precision: str, source: Path, reference: BackgroundOutputs, batches: list[dict], samples: int, minimum: float,
                   status: Status) -> str:
    """When the `precision` ("FP16" or "INT8") gate fails even after the repair: the FP32 model's own figure on the held-out
    samples with only its float inputs rounded as that precision rounds them (FP16's mantissa; INT8: one symmetric scale per
    input, from its largest magnitude, as the Q/DQ on an input does). Below the gate, no model of that precision which rounds
    its inputs can pass: what the gate's message says instead of the nodes to exclude (the sweep's random-weight LeViT read
    0.93 for FP16, MobileNetV1 0.69 for INT8). "" otherwise, and for a model without float inputs."""
    import numpy as np

    from pipeline.core.verify import OnnxSession

    floats = {name for feeds in batches for name, array in feeds.items() if array.dtype.kind == "f" and array.size}  # not an empty cache
    if not floats:
        return ""
    largest = {name: max(float(np.abs(feeds[name]).max()) for feeds in batches if feeds[name].size) for name in floats}

    def rounded(name: str, array: np.ndarray) -> np.ndarray:
        if name not in floats or not array.size:
            return array
        if precision == "FP16":
            return array.astype(np.float16).astype(array.dtype)
        scale = largest[name] / 127 or 1.0
        return (np.clip(np.round(array / scale), -127, 127) * scale).astype(array.dtype)

    figures = accuracy(OnnxSession(source), reference, [{name: rounded(name, array) for name, array in feeds.items()} for feeds in batches],
                       samples, f"FP32 (inputs rounded to {precision})", status)
    if passes(figures, minimum):
        return ""
    return (f"the FP32 model itself reads cosine_centered={figures['cosine_centered']:.5f} with only its inputs rounded to {precision}: its "
            f"outputs are more sensitive to {precision}'s rounding than the gate allows, so no {precision} model of it passes (random weights "
            f"can make a model this sensitive, a trained one rarely is); build it without --{precision.lower()}")


def kernel_metrics(result) -> dict[str, Any]:
    """The manifest's record of the nodes an AutoCast conversion kept in FP32 for want of an onnxruntime kernel."""
    return {"kept_without_kernel": list(result.kept_without_kernel)} if result.kept_without_kernel else {}


def kernel_note(metrics: dict[str, Any], precision: str) -> str:
    """The stage line's `1 node kept in FP32, onnxruntime has no FP16 kernel for it: X; `, when there are any."""
    nodes = metrics.get("kept_without_kernel") or []
    if not nodes:
        return ""
    return f"{len(nodes)} node{'s' * (len(nodes) != 1)} kept in FP32, onnxruntime has no {precision} kernel for {'them' if len(nodes) > 1 else 'it'}: {', '.join(nodes)}; "


def passes(metrics: dict[str, Any], minimum: float) -> bool:
    """The accuracy figures meet the gate (NaN never does)."""
    return metrics["cosine_centered"] >= minimum


def gate(stage: str, metrics: dict[str, Any], minimum: float, hint: str) -> None:
    from pipeline.core.errors import StageFailed

    if passes(metrics, minimum):
        return
    if math.isnan(metrics["cosine_centered"]):  # NaN is below every gate, and says more than a figure
        raise StageFailed(f"{stage}: the {stage.upper()} model's outputs hold NaN or Inf on the held-out samples (an overflow: a value past "
                          f"{stage.upper()}'s range), so no accuracy figure exists; {hint}")
    raise StageFailed(
        f"{stage}: accuracy below the gate: cosine_centered={metrics['cosine_centered']:.5f} < {minimum} "
        f"(cosine={metrics['cosine']:.6f}, max_abs_diff={metrics['max_abs_diff']:.3g} vs FP32 on {metrics['samples']} held-out samples); "
        f"{hint}, or lower this gate: [quant] min_cosine_{stage} in the profile (--min-cosine lowers every precision's)"
    )


def require_quantized(stage: str, nodes: int, why: str) -> None:
    """A precision stage whose model has no quantized node made nothing of what it exists for: it fails, saying why."""
    from pipeline.core.errors import StageFailed

    if nodes == 0:
        raise StageFailed(f"{stage}: no node was quantized, so nothing of this model would run in {stage.upper()}: {why}")


def calibration_batch(profile: Profile, source: Path) -> int:
    """Samples per calibration run: the model's static batch dim, else the profile's batch size (at opt) for
    the model's first input it describes, else 1 (a profile describing another model says nothing of this one)."""
    from pipeline.core.samples import model_inputs

    inputs = model_inputs(source)
    first = next(iter(inputs.values()), ("", []))[1]
    if first and first[0] is not None:
        return first[0]
    named = {spec.name: spec for spec in profile.inputs}
    return next((profile.shape(named[name])[0] for name in inputs if name in named), 1)


def calibration(profile: Profile, calib: Path | None, source: Path):
    """(samples by input, batch, where they came from): the calibration data for `source`."""
    from quant.calibration import calibration_data

    data, origin = calibration_data(profile, calib, source)
    return data, calibration_batch(profile, source), origin


def max_sequence(profile: Profile) -> int | None:
    """The longest sequence the profile allows (the attention rules depend on it), None without a sequence dim."""
    return max((d.max for name, d in profile.dims.items() if name in SEQUENCE_DIMS), default=None)


def log_output(log: Path) -> dict[str, Path]:
    """The stage's `log` output, when the libraries said anything (an empty log is not kept)."""
    return {"log": log} if log.is_file() else {}


@contextmanager
def logged(log: Path | None) -> Iterator[None]:
    """The libraries' output into `log`; a user's input error leaves no log behind (nothing half written)."""
    from pipeline.core.errors import InputError
    from pipeline.core.quiet import captured

    try:
        with captured(log):
            yield
    except InputError:
        if log is not None:
            log.unlink(missing_ok=True)
        raise


def ptq_line(m: dict[str, Any]) -> str:
    q = m["qdq"]
    return (f"{m['method']}: cosine_centered={m['accuracy']['cosine_centered']:.4f}, {q['quantize']} Q / {q['dequantize']} DQ, "
            f"{lint_count(m)}")


def lint_count(metrics: dict[str, Any]) -> str:
    count = metrics["lint"]["count"]
    return f"{count} lint finding{'s' * (count != 1)}"


def request_settings(stage: str, request: QuantizeRequest, reads: tuple[str, ...]):
    """The stage's `Settings` for `quantize`: the profile's, with the command's --calib and --preset."""
    from pipeline.core.errors import PipelineError
    from pipeline.settings import Options, Settings

    if request.profile is None:
        raise PipelineError(f"quantize --{stage} needs --profile NAME: its accuracy gate runs on held-out samples made from the profile")
    return Settings(stage, request.profile, Options(calib=request.calib, preset=request.preset), reads)


def zero_checks(source: Path) -> list[dict]:
    """Without a profile: zero-filled inputs with dynamic dims at 1 and 3, those the source model itself runs at."""
    from pipeline.core.errors import PipelineError
    from pipeline.core.samples import model_feeds, model_inputs
    from pipeline.core.verify import run_onnx

    def runs(feeds: dict) -> bool:
        try:
            run_onnx(source, feeds)
        except PipelineError:
            return False
        return True

    return [feeds for feeds in model_feeds(model_inputs(source)) if runs(feeds)]


def autocast_line(label: str, request: QuantizeRequest, result) -> str:
    """What `quantize --fp16` / `--bf16` prints: the file, its nodes, and the shapes it was run at."""
    if result.checked_shapes:
        first = next(iter(result.checked_shapes[0]))
        checked = f"runs at {first} {', '.join('x'.join(map(str, s[first])) for s in result.checked_shapes)}"
    elif getattr(result, "unchecked", None):
        checked = result.unchecked
    else:
        checked = "not run: the source runs at none of the zero-filled shapes; pass --profile to check at its shapes"
    return (f"wrote {request.output}: {result.nodes} nodes, {label} (AutoCast, providers {result.providers}); "
            f"{kernel_note(kernel_metrics(result), label)}{checked}")


def ptq_command_line(label: str, request: QuantizeRequest, result, origin: str) -> str:
    """What `quantize --fp8` / `--int4` prints."""
    figures = result.accuracy
    return (f"wrote {request.output}: {label} ({result.method}), opset {result.opset}, {result.qdq['quantize']} Q / "
            f"{result.qdq['dequantize']} DQ, cosine_centered={figures['cosine_centered']:.5f} (gate {result.min_cosine}), "
            f"calibration: {origin}; lint-qdq: {len(result.findings)} findings")


def predicted_engine(job: Job, precision: str, model: Path) -> tuple[dict[str, Path], dict[str, Any]]:
    """The engine TensorRT 10.x will build from the stage's model (trt/predict/), written beside it as
    `model.<precision>.predicted.json`: the output and the metrics the stage line reads."""
    from pipeline.core.fileio import write_text
    from pipeline.core.onnxfile import load_onnx
    from quant.lint import family_rules
    from trt.predict import counts, predict
    from trt.render import render

    job.status(f"predicting the {precision} engine")
    loaded = load_onnx(model, weights=True)
    prediction = predict(loaded, family_rules(loaded), "auto", 10, max_sequence(job.settings.profile), str(model))
    path = job.out / f"model.{precision}.predicted.json"
    write_text(path, render(prediction, "json"))
    return {"predicted": path}, {"predicted": counts(prediction) | {"verdict": prediction.verdict}}


def predicted_line(metrics: dict[str, Any]) -> str:
    """The stage line's prediction: `; predicted engine: N layers, M Myelin regions, K standalone Q/DQ`."""
    p = metrics.get("predicted")
    if not p:
        return ""
    regions = f"{p['myelin_regions']} Myelin region{'s' if p['myelin_regions'] != 1 else ''}"
    return f"; predicted engine: {p['layers']} layers, {regions}, {p['standalone_qdq']} standalone Q/DQ"
