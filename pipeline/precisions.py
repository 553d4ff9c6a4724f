"""The precisions, each declared once: the flags, stages, gates, engines, bench, jobs and diff follow from `PRECISIONS`.
A precision other than FP32 is made by the stage `module` of its name (its `STAGE` and `quantize_command`) into
`model.<name>.onnx` and built into `<name>.engine`; FP32 is the optimize stage's model, the reference of every gate
(docs/stages.md, "Adding a precision"). Pure data: it imports nothing else (the CLI reads it at start-up).
"""

from __future__ import annotations

from dataclasses import dataclass

REFERENCE = "fp32"


@dataclass(frozen=True)
class Precision:
    name: str  # the flag (--fp16), the stage, the engine (<name>.engine)
    label: str  # as TensorRT and its users write it
    summary: str  # how its model is made
    module: str | None = None  # the stage module (None: FP32, the optimize stage's model)
    calibrated: bool = False  # reads calibration data (--calib, else [quant] samples)
    placed: bool = False  # its Q/DQ placement follows --preset
    quantized: bool = False  # Q/DQ in the graph: the build's diff stage compares its engine with the float one
    min_cosine: float | None = None  # default accuracy gate vs FP32 (cosine_centered), [quant] min_cosine_<name>
    min_token_agreement: float | None = None  # a decoder's generation gate (share of steps where, fed torch's tokens, it picks torch's), [quant] min_token_agreement_<name>
    min_compute_capability: tuple[int, int] | None = None  # the GPU its engine needs, at least
    combines_with: str | None = None  # quantize: with this flag too, the other precision is its float parts (--int8 --fp16)
    repairable: bool = False  # a failed accuracy gate searches for the nodes to keep in higher precision (pipeline/stages/repair.py)

    @property
    def stage(self) -> str:
        """The stage whose `onnx` output is this precision's model."""
        return "optimize" if self.name == REFERENCE else self.name

    @property
    def engine(self) -> str:
        return f"{self.name}.engine"

    @property
    def help(self) -> str:
        """What its flag asks for."""
        needs = f"; its engine needs a GPU of compute capability {'.'.join(map(str, self.min_compute_capability))}+" if self.min_compute_capability else ""
        return f"{self.label}: model.{self.name}.onnx, {self.summary}{needs}."


PRECISIONS: tuple[Precision, ...] = (
    Precision(REFERENCE, "FP32", "the optimized model, always built, the reference of every gate"),
    Precision("fp16", "FP16", "ModelOpt AutoCast", "pipeline.stages.fp16", min_cosine=0.999, min_token_agreement=0.5,
              repairable=True),
    Precision("int8", "INT8", "ModelOpt Q/DQ calibrated, its placement linted", "pipeline.stages.int8",
              calibrated=True, placed=True, quantized=True, min_cosine=0.99, min_token_agreement=0.5, combines_with="fp16",
              repairable=True),
    # FP8 E4M3 keeps 3 mantissa bits, per-tensor scales like INT8: INT8's gate
    Precision("fp8", "FP8", "ModelOpt FP8 Q/DQ calibrated, opset >= 21", "pipeline.stages.fp8",
              calibrated=True, placed=True, quantized=True, min_cosine=0.99, min_compute_capability=(8, 9), repairable=True),
    # weight-only 4-bit with 128-wide blocks loses more than INT8/FP8
    Precision("int4", "INT4", "ModelOpt weight-only INT4 for MatMul/Gemm weights (AWQ)", "pipeline.stages.int4",
              calibrated=True, quantized=True, min_cosine=0.98),
    # BF16 keeps 8 mantissa bits to FP16's 11: FP16's gate (0.999) is too tight for it
    Precision("bf16", "BF16", "ModelOpt AutoCast to BF16", "pipeline.stages.bf16", min_cosine=0.99, repairable=True),
)


def by_name(name: str) -> Precision:
    return next(p for p in PRECISIONS if p.name == name)


def names() -> tuple[str, ...]:
    return tuple(p.name for p in PRECISIONS)


def optional() -> tuple[Precision, ...]:
    """The precisions a flag asks for (all but FP32)."""
    return tuple(p for p in PRECISIONS if p.module is not None)


def gated(gate: str) -> tuple[Precision, ...]:
    """The precisions with a `gate` ("min_cosine" or "min_token_agreement")."""
    return tuple(p for p in PRECISIONS if getattr(p, gate) is not None)


def listed(precisions) -> str:
    """`--fp16, --int8 or --fp8`: the flags of `precisions`, for a message."""
    flags = [f"--{p.name}" for p in precisions]
    return flags[0] if len(flags) == 1 else ", ".join(flags[:-1]) + " or " + flags[-1]
