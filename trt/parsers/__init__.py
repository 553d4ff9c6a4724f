"""Readers for every form of TensorRT layer information (one module per format), behind one detector,
and for trtexec's profile. Every failure is a `LayerInfoParseError` saying the format detected, where it
broke and what was expected; every reader runs in time linear in its input."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipeline.core.errors import InputError
from trt.parsers import builder_log, inspector_json, layer_json, polygraphy_inspect, prediction
from trt.parsers.common import REBUILD_DETAILED, LayerInfoParseError, json_problem, loads_json, read_text
from trt.parsers.profile import TimingRecord, merge_timing, parse_timing
from trt.plan import EnginePlan

__all__ = ["INPUT_FORMATS", "REBUILD_DETAILED", "LayerInfoParseError", "TimingRecord", "detect_text", "merge_timing", "parse_layer_info", "parse_timing"]

INPUT_FORMATS = ("auto", "json", "log", "polygraphy", "layer-json")
# a JSON document starts with `{`, or `[` then a value; a log line may start with `[timestamp]`
_JSON_START = re.compile(r'\s{0,64}(?:\{|\[\s{0,64}(?:[\[{"\]\d-]|$))')


def parse_layer_info(path: Path | str, input_format: str = "auto", build: int | None = None) -> EnginePlan:
    """Read a layer-information file of any supported format; `build` picks one listing of a log holding several."""
    if input_format not in INPUT_FORMATS:
        raise InputError(f"--input-format {input_format!r}: use one of {', '.join(INPUT_FORMATS)}")
    path = Path(path)
    source = str(path)
    text = read_text(path, "layer information")
    if input_format in ("auto", "json"):
        try:
            data = loads_json(text)
        except json.JSONDecodeError as err:
            text_layers = layer_json.looks_like(text) or builder_log.has_layer_lines(text) or polygraphy_inspect.is_polygraphy(text)
            if input_format == "json" or (_JSON_START.match(text) and not text_layers):
                raise LayerInfoParseError(source, "JSON", f"line {err.lineno} column {err.colno}", err.msg, "inspector JSON as written by trtexec --exportLayerInfo") from err
        except (ValueError, RecursionError) as err:  # a 5,000-digit integer, nesting deeper than the reader follows
            raise LayerInfoParseError(source, "JSON", "whole file", json_problem(err), "inspector JSON as written by trtexec --exportLayerInfo") from err
        else:
            if prediction.looks_like(data):
                _no_build(source, build, "a predicted engine")
                return prediction.parse(source, data)
            _no_build(source, build, "inspector JSON")
            return inspector_json.parse(source, data)
    found = input_format if input_format != "auto" else detect_text(text)
    if found != "log":
        _no_build(source, build, found)
    if found == "layer-json":
        return layer_json.parse(source, text)
    if found == "polygraphy":
        return polygraphy_inspect.parse(source, text)
    return builder_log.parse(source, text, build)


def detect_text(text: str) -> str:
    """The format of a file that is not one JSON document: layer-json, polygraphy or log."""
    if layer_json.looks_like(text):
        return "layer-json"
    if not builder_log.has_layer_lines(text) and polygraphy_inspect.is_polygraphy(text):
        return "polygraphy"
    return "log"


def _no_build(source: str, build: int | None, found: str) -> None:
    if build is not None:
        raise InputError(f"{source}: --build {build} picks one of several layer listings in a log; this file is {found}, which holds one engine")
