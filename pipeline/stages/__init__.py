"""The stages `build` runs, in order. Each is one declaration (`pipeline.runner.Stage`: what it reads,
its inputs, its code) and one run function, in a module of its own; docs/stages.md says how to add one."""

from __future__ import annotations

from pipeline.runner import Stage
from pipeline.settings import Options
from pipeline.stages.bf16 import BF16
from pipeline.stages.engines import BENCH, BUILD, DIFF, PRECISION_SOURCES, REPORT
from pipeline.stages.export import EXPORT
from pipeline.stages.fp8 import FP8
from pipeline.stages.fp16 import FP16
from pipeline.stages.int4 import INT4
from pipeline.stages.int8 import INT8
from pipeline.stages.optimize import OPTIMIZE

STAGES = (EXPORT, OPTIMIZE, FP16, INT8, FP8, INT4, BF16, BUILD, REPORT, DIFF, BENCH)
OPTIONAL = {"fp16": FP16, "int8": INT8, "fp8": FP8, "int4": INT4, "bf16": BF16}  # stages a command-line flag asks for


def build_plan(options: Options) -> list[Stage]:
    """The stages of one build: every stage but the optional ones the options do not ask for."""
    return [stage for stage in STAGES if stage not in OPTIONAL.values() or options.get(stage.name)]


__all__ = ["BENCH", "BF16", "BUILD", "DIFF", "EXPORT", "FP8", "FP16", "INT4", "INT8", "OPTIMIZE", "PRECISION_SOURCES", "REPORT", "STAGES", "build_plan"]
