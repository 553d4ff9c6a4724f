"""Numerical checks on onnxruntime's CPU provider (imported lazily; BF16 models, with no CPU kernels, on its CUDA one).

One session per model (making one costs several runs of a small model). Accuracy checks run the basic graph optimizations,
which make Q/DQ models several times faster, with the DequantizeLinear of each constant weight folded too (onnxruntime's
`session.disable_quant_qdq`: by default it keeps them for the providers that fuse Q/DQ, and the CPU then dequantized every
weight on every run: a 0.5B decoder's INT8 generation check took 23.3 s so, 12.8 s folded); not the extended level, whose
`FastGeluFusion` breaks a valid graph where the erf and tanh GELU forms share `x * 0.5` (tests/factories.py
`hand_written_block`). Checks of our own rewrites run the graph
`as_written`: the basic level fuses a written-out LayerNorm into a one-pass-variance kernel, which would hide what a rewrite
did (and is off by orders of magnitude on rows whose std is tiny against their mean). As written means onnxruntime's basic
level with every transformer but constant folding turned off: a constant subgraph is computed once with the kernels a run
would use, not on every run (a decoder's tied embedding transposed for its output head: 0.48 of each 0.50 s step at 0.5B
parameters, issue 33). A MatMul whose weight the folding made constant may take onnxruntime's prepacked kernel, which rounds
differently (float32 rounding, ~1e-5 on a 0.5B decoder's logits). A session run once or twice skips the folding too
(`fold_constants=False`): computing the 0.5B decoder's folded transpose costs more than two runs of it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from pipeline.core.errors import CapabilityMissing, InputError, StageFailed, first_line

# onnxruntime 1.24's basic-level graph transformers and rewrite rules but ConstantFolding, by the names its
# `disabled_optimizers` takes (its library's strings; a name it lacks is ignored): an `as_written` session folds constants
# and changes nothing else, which tests/test_verify.py holds on the fusions a check must not see
NOT_CONSTANT_FOLDING = (
    "CommonSubexpressionElimination", "ConstantSharing", "ReshapeFusion", "FreeDimensionOverrideTransformer", "Pad_Fusion",
    "LayerNormFusionL1", "SimplifiedLayerNormFusion", "GeluFusionL1", "MatMulAddFusion", "DoubleQDQPairsRemover",
    "QDQPropagationTransformer", "EnsureUniqueDQForNodeUnit", "CastChainElimination", "RemoveDuplicateCastTransformer",
    "EliminateIdentity", "EliminateSlice", "UnsqueezeElimination", "EliminateDropout", "ExpandElimination", "CastElimination",
    "PreShapeNodeElimination", "NoopElimination", "DivMulFusion", "FuseReluClip", "GemmSumFusion", "GemmTransposeFusion",
    "NotWhereFusion", "ConvAddFusion", "ConvMulFusion", "ConvBNFusion", "ClipQuantFusion", "ReluQuantFusion", "LabelEncoderFusion",
    "MatMul_BatchNormalization_Fusion", "GatherToSliceFusion", "MatmulTransposeFusion", "TransposeOptimizer",
)


def session_options(as_written: bool, threads: int = 0, fold_constants: bool = True):
    """The onnxruntime SessionOptions of an OnnxSession, and the transformers it turns off (module docstring)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # errors are raised to us, and said in our one line
    level = ort.GraphOptimizationLevel
    options.graph_optimization_level = level.ORT_DISABLE_ALL if as_written and not fold_constants else level.ORT_ENABLE_BASIC
    # no arena: a session keeps its largest run's buffers in it (its memory pattern, even with arena shrinkage), so
    # the FP16 stage's FP32 and FP16 sessions held EfficientNet's 600x600 batch-16 runs together (killed at 23.7
    # GB). bench/results/session_memory.json: with the arena 2.6x a run's estimate stays held after it, without
    # none; the runs take 1.4x as long without it (a Conv stack at 600x600), the price of the checks' memory
    options.enable_cpu_mem_arena = False
    options.add_session_config_entry("session.disable_quant_qdq", "1")  # constant folding folds weights' DequantizeLinear
    if threads:
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options, list(NOT_CONSTANT_FOLDING) if as_written and fold_constants else None


class OnnxSession:
    """One onnxruntime session for an ONNX file on `provider`. `as_written`: no graph optimization but constant folding,
    and none at all without `fold_constants` (module docstring); `threads`: a cap on its compute threads, without
    spinning (the other cores stay free); `shown_as`: the file errors name where this one is a working copy of it."""

    def __init__(self, path: Path, as_written: bool = False, threads: int = 0, shown_as: Path | None = None, fold_constants: bool = True,
                 provider: str = "CPUExecutionProvider"):
        import onnxruntime as ort

        options, disabled = session_options(as_written, threads, fold_constants)
        self.path, self.provider = Path(shown_as or path), provider
        try:
            self.session = ort.InferenceSession(str(path), options, providers=[provider], disabled_optimizers=disabled)
        except Exception as err:  # onnxruntime raises its own untyped errors
            message = first_line(err).replace(str(path), str(self.path))
            if provider != "CPUExecutionProvider" and "NOT_IMPLEMENTED" in message:  # it fell back to the CPU, or has no such kernel
                raise CapabilityMissing(f"onnxruntime's {provider} cannot run it here ({message})") from err
            raise InputError(f"{self.path}: onnxruntime cannot load it: {message}") from err
        if self.session.get_providers()[0] != provider:  # onnxruntime falls back to the CPU where a GPU provider cannot start
            raise CapabilityMissing(f"onnxruntime could not start its {provider} (are CUDA's libraries installed?)")
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray], run_options=None) -> list[np.ndarray]:
        """The outputs for `feeds`; `run_options` (onnxruntime.RunOptions) lets another thread stop the run."""
        missing = [name for name in self.inputs if name not in feeds]
        if missing:
            raise InputError(f"{self.path}: model inputs {missing} are not in the profile's [[inputs]]; add them")
        try:
            return self.session.run(None, {name: feeds[name] for name in self.inputs}, run_options)
        except Exception as err:  # onnxruntime raises its own untyped errors
            shapes = {name: list(feeds[name].shape) for name in self.inputs}
            raise StageFailed(f"{self.path}: onnxruntime cannot run it at input shapes {shapes}: {run_failure(err)}") from err

    def run_fitting(self, feeds: dict[str, np.ndarray], sized_by: Path, run_options=None) -> list[np.ndarray]:
        """`run`, split into runs of fewer rows where the batch would not fit in memory (pipeline/core/memory.py), as the
        model at `sized_by` estimates it (a converted model's FP32 source: the session may outlive its file)."""
        from pipeline.core.memory import runs_that_fit

        runs = [self.run(part, run_options) for part in runs_that_fit(sized_by, feeds)]
        return runs[0] if len(runs) == 1 else [np.concatenate(parts) for parts in zip(*runs)]

    def run_named(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`run`, each output under its graph output name, in the graph's order."""
        return dict(zip(self.outputs, self.run(feeds), strict=True))


def run_onnx(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """One run of an ONNX file as written (a session for one feed: use OnnxSession to run several)."""
    return OnnxSession(path, as_written=True, fold_constants=False).run(feeds)


def max_abs_diff(expected: list[np.ndarray], actual: list[np.ndarray]) -> float:
    if len(expected) != len(actual):
        raise ValueError(f"{len(expected)} outputs vs {len(actual)}")
    worst = 0.0
    for a, b in zip(expected, actual, strict=True):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a64.shape != b64.shape:
            raise ValueError(f"output shapes differ: {a64.shape} vs {b64.shape}")
        if a64.size:
            worst = max(worst, float(np.max(np.abs(a64 - b64))))
    return worst


def onnxruntime_errors() -> tuple[type[Exception], ...]:
    """What onnxruntime raises for a model it cannot load or run: its own classes, none of them a RuntimeError."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort

    return (ort.Fail, ort.InvalidArgument, ort.InvalidGraph, ort.InvalidProtobuf, ort.RuntimeException, ort.NotImplemented, ort.EPFail)


def run_failure(err: Exception) -> str:
    """onnxruntime's run error as "<op> node '<name>': <message>" without its source locations."""
    text = " ".join(str(err).split())
    match = re.search(r"running (\w+) node\. Name:'([^']*)' Status Message: (.*)", text)
    if not match:
        return first_line(err)
    message = re.sub(r"^(\S+\.(cc|h):\d+ )?(.*?\) )?(status\.IsOK\(\) was false\. )?", "", match[3])
    return f"{match[1]} node '{match[2]}': {message}"


def _outputs(path: Path, feed_sets: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    session = OnnxSession(path, as_written=True, fold_constants=False)  # a run or two: folding would cost more
    return [session.run(feeds) for feeds in feed_sets]


def differences(reference: Path, candidate: Path, feed_sets: list[dict[str, np.ndarray]]) -> tuple[float, float, OnnxSession]:
    """(max |reference - candidate|, the same relative to each output's largest magnitude above 1) over all outputs and feeds,
    and the candidate's session, for the caller's further checks. One session at a time (the reference's outputs kept, its
    session gone before the candidate's is made): two at once held the weights twice, the optimize stage's peak (bert-base:
    5.2x the model's bytes)."""
    expected = _outputs(reference, feed_sets)
    session = OnnxSession(candidate, as_written=True)
    worst = scaled = 0.0
    for feeds, want in zip(feed_sets, expected, strict=True):
        got = session.run(feeds)
        try:
            for a, b in zip(want, got, strict=True):
                diff = max_abs_diff([a], [b])
                magnitude = float(np.max(np.abs(a))) if a.size and np.issubdtype(np.asarray(a).dtype, np.floating) else 1.0
                worst, scaled = max(worst, diff), max(scaled, diff / max(1.0, magnitude))
        except ValueError as err:
            raise InputError(f"{candidate}: outputs do not match {reference} ({err})") from err
    return worst, scaled, session
