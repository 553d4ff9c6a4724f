"""Text logs holding layer listings (runs of one-line records, see oneline.py, or names-only lines
`Layer(Type): name, Tactic: value, in (Half[1,40]) -> out (Float[1])`, 8.2: `in[Half(1,40)]`). A log may hold
several (several builds; `trtexec --verbose --dumpLayerInfo` prints the engine twice): the last is read by default."""

from __future__ import annotations

import re
from dataclasses import dataclass

from trt.parsers import oneline
from trt.parsers.common import LayerInfoParseError, assign_nodes, finish, text_lines
from trt.plan import Build, EnginePlan, Layer, normalize_dtype, set_tensors

_NAMES_PREFIX = "Layer("
_TACTIC = ", Tactic: "
# the end of one tensor: ` (Half[1,40])` (TensorRT 10.x) or `[Half(1,40)]` (8.2), then `, ` or the end
_TENSOR_END = re.compile(
    r" ?(?:\((?P<type10>[A-Za-z][A-Za-z0-9]{0,15})\[[-0-9,]{0,400}\]\)|\[(?P<type8>[A-Za-z][A-Za-z0-9]{0,15})\([-0-9,]{0,400}\)\])(?=, |$)"
)


@dataclass
class _Listing:
    first_line: int
    style: str  # "detailed" or "names"
    lines: list[tuple[int, str]]  # (line number, the layer record)
    header: str  # the two non-empty lines above it


def find_listings(text: str) -> list[_Listing]:
    """Runs of consecutive layer lines, each with the header lines above it."""
    listings: list[_Listing] = []
    current: _Listing | None = None
    above = ["", ""]
    for number, line in enumerate(text_lines(text), 1):
        body, style = _layer_record(line)
        if body is None:
            current = None
            if line.strip():
                above = [above[1], line[:200]]
            continue
        if current is None or current.style != style:
            current = _Listing(number, style, [], " | ".join(above))
            listings.append(current)
        current.lines.append((number, body))
    return listings


def has_layer_lines(text: str) -> bool:
    return any(_layer_record(line)[0] is not None for line in text_lines(text))


def _layer_record(line: str) -> tuple[str | None, str]:
    body = oneline.layer_body(line)
    if body is not None:
        return body, "detailed"
    start = line.find(_NAMES_PREFIX, 0, 120)
    if start != -1 and (start == 0 or line.startswith("[")) and "): " in line[start : start + 80] and _TACTIC in line:
        return line[start:], "names"
    return None, ""


def parse(source: str, text: str, build: int | None = None) -> EnginePlan:
    listings = find_listings(text)
    if not listings:
        raise LayerInfoParseError(
            source, "text", f"lines 1-{text.count(chr(10)) + 1}", "no TensorRT layer lines found",
            "inspector JSON, polygraphy inspect output, or a log with 'Name: ..., LayerType: ...' (detailed) or 'Layer(Type): ...' (layer names only) lines",
        )
    number = len(listings) if build is None else build
    if not 1 <= number <= len(listings):
        raise LayerInfoParseError(source, _format(listings[0]), f"--build {number}", f"this log holds {len(listings)} layer listing(s)", f"--build 1 to {len(listings)}")
    plan = _plan(source, listings[number - 1])
    if len(listings) > 1:
        plan.builds, plan.build = _builds(listings), number
        repeats = [b for b in plan.builds if b.same_as is not None]
        plan.notes.insert(0, (
            f"this log holds {len(listings)} layer listings (" + "; ".join(f"{b.number}: lines {b.first_line}-{b.last_line}, {b.layers} layers" for b in plan.builds)
            + f"); this report reads listing {number}" + (" (the last)" if build is None else "") + "; `--build N` reads another"
            + "".join(f"; listing {b.number} repeats listing {b.same_as}" for b in repeats)
            + (" (the same engine printed twice, or the same network built again)" if repeats else "")
        ))
    return plan


def _plan(source: str, listing: _Listing) -> EnginePlan:
    detected, detailed = _format(listing), listing.style == "detailed"
    read = oneline.layer_from_line if detailed else _layer_from_names_line
    layers = [read(source, detected, number, body) for number, body in listing.lines]
    return finish(EnginePlan(source, detected, "detailed" if detailed else "layer_names_only", layers))


def _format(listing: _Listing) -> str:
    """Which tool printed the listing, told by the lines above it."""
    header = listing.header
    if "[TRT]" in header:
        origin = "verbose builder log"
    elif "Layer Information:" in header and "Engine Layer Information" not in header:
        origin = "trtexec --dumpLayerInfo"
    elif listing.style == "detailed":
        origin = "one-line layer information (IEngineInspector ONELINE)"
    else:
        origin = "builder log"
    if listing.style == "names" and any(match["type8"] for _, body in listing.lines[:5] for match in _TENSOR_END.finditer(body)):
        origin += " (TensorRT 8.x tensor syntax)"
    return f"{origin}, " + ("detailed" if listing.style == "detailed" else "layer names only")


def _builds(listings: list[_Listing]) -> list[Build]:
    builds, seen = [], {}
    for number, listing in enumerate(listings, 1):
        key = (listing.style, tuple(body for _, body in listing.lines))
        builds.append(Build(number, listing.first_line, listing.lines[-1][0], len(listing.lines), _format(listing), seen.get(key)))
        seen.setdefault(key, number)
    return builds


def _layer_from_names_line(source: str, detected: str, number: int, body: str) -> Layer:
    type_end = body.find("): ")
    layer_type, rest = body[len(_NAMES_PREFIX) : type_end], body[type_end + 3 :]
    name, sep, after = rest.partition(_TACTIC)
    if not sep or not name.strip():
        raise LayerInfoParseError(source, detected, f"line {number}", "no ', Tactic: ' after the layer name", "'Layer(Type): <name>, Tactic: <value>, <inputs> -> <outputs>'")
    tactic, _, tensors = after.partition(", ")
    inputs, _, outputs = tensors.partition(" -> ")
    layer = Layer(name=name.strip(), type=layer_type.strip() or "unknown", tactic=tactic.strip() or None)
    set_tensors(layer, _names_tensors(inputs), _names_tensors(outputs))
    return assign_nodes(layer, None)


def _names_tensors(text: str) -> list[tuple[str, str | None]]:
    """`a (Float[1,3]), b (Half[2])` or `a[Float(1,3)], b[Half(2)]`: each tensor ends at its type and shape."""
    tensors, start = [], 0
    text = text.strip()
    for match in _TENSOR_END.finditer(text):
        name = text[start : match.start()].strip().removeprefix(", ").strip()
        tensors.append((name, normalize_dtype(match["type10"] or match["type8"])))
        start = match.end()
    return tensors
