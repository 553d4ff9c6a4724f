"""The stages `build` runs, in order: export, optimize, one stage per precision asked for (from the
registry, pipeline/precisions.py), then the TensorRT stages. Each is one declaration (`STAGE`, a
`pipeline.stage.Stage`: what it reads, its inputs, its entry) and one run function, in a module of
its own; docs/stages.md says how to add one."""

from __future__ import annotations

import importlib

from pipeline import precisions
from pipeline.settings import Options
from pipeline.stage import Stage


def catalogue() -> tuple[Stage, ...]:
    """Every stage there is, in pipeline order."""
    modules = ("pipeline.stages.export", "pipeline.stages.optimize", *(p.module for p in precisions.optional()),
               "pipeline.stages.build", "pipeline.stages.report", "pipeline.stages.diff", "pipeline.stages.bench")
    return tuple(importlib.import_module(m).STAGE for m in modules)


def named(name: str) -> Stage:
    """The stage called `name`."""
    return next(stage for stage in catalogue() if stage.name == name)


def build_plan(options: Options) -> list[Stage]:
    """The stages of one build: every stage but the precisions' that the options do not ask for."""
    unasked = {p.name for p in precisions.optional()} - options.precisions
    return [stage for stage in catalogue() if stage.name not in unasked]
