"""One self-contained HTML page (inline CSS and SVG): the verdict, the fusion map (ONNX nodes in order, coloured
by the engine region each runs in), findings, module bars and tables. Model strings go through jinja2's autoescape."""

from __future__ import annotations

from itertools import groupby
from pathlib import Path
from typing import Any

from pipeline.core.text import html_breakable
from trt.plan import EnginePlan, Region, looks_qdq
from trt.render.text import cell, nodes_preview
from trt.views import Diff, Report

STRIP_WIDTH = 1100  # px
PAD = 5  # px either side of the strip: a marker at its first or last node is drawn whole (it is 8 px wide)
# alternating shades per kind, so two neighbouring regions of one kind still differ
PALETTE = {
    "myelin": ("#5f9e00", "#9ccc4a", "#3f6f00", "#c3e38f"),
    "layer": ("#4f81bd", "#9db8d9", "#2f5597", "#c6d6ec"),
    "qdq": ("#e69138", "#f4c28a"),
}
NOT_IN_ENGINE = "#e4e4e4"
# the band under each run: the region's precision
PRECISION_COLOURS = {"FP32": "#8c8c8c", "FP16": "#2a9d9d", "BF16": "#2a9d9d", "INT8": "#e69138", "FP8": "#8e63b8", "FP4": "#c44e52", "INT4": "#c44e52"}
DARK = {shades[i] for shades in PALETTE.values() for i in (0, 2) if i < len(shades)}  # white text on these


def html(view: Report | Diff) -> str:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(Path(__file__).parents[1] / "templates"), autoescape=select_autoescape(default=True))
    env.filters["cell"] = cell
    env.filters["nodes"] = nodes_preview
    env.filters["breakable"] = html_breakable
    fusion_map = view.fusion_map
    common = {"order": fusion_map["order"], "palette": PALETTE, "blank": NOT_IN_ENGINE, "precisions": PRECISION_COLOURS, "width": STRIP_WIDTH + 2 * PAD}
    order = fusion_map["order"]
    if isinstance(view, Report):
        strip = _strip(fusion_map["nodes"], fusion_map["region"], view.regions, fusion_map["qdq"])
        strips = [strip | {"label": _label("engine", _nodes_counted(order, "the layers name", view.plan), strip, view.plan)}]
        peak = max([m.layers for m in view.modules] + [1])
        peak_ms = max([m.time_ms or 0 for m in view.modules] + [0]) or 1.0
        return env.get_template("report.html.j2").render(report=view, strips=strips, peak=peak, peak_ms=peak_ms, **common)
    own = " in its own order (the node names do not join)" if "b_nodes" in fusion_map else ""
    named = "it names" if own else "either engine names"
    a = _strip(fusion_map["nodes"], fusion_map["a"], view.a.regions, [])
    b = _strip(fusion_map.get("b_nodes", fusion_map["nodes"]), fusion_map["b"], view.b.regions, fusion_map["qdq"])
    strips = [a | {"label": _label(f"A ({view.a.summary.precision}){own}", _nodes_counted(order, named), a, view.a.plan)},
              b | {"label": _label(f"B ({view.b.summary.precision}){own}", _nodes_counted(order, named), b, view.b.plan)}]
    return env.get_template("diff.html.j2").render(diff=view, strips=strips, **common)


def _strip(nodes: list[str], regions: list[int | None], info: list[Region], markers: list[list]) -> dict[str, Any]:
    """Runs of consecutive nodes in one region (`info`: the engine's regions, by index), as SVG rectangles with a tooltip
    each. Nodes the engine does not name (Myelin lists the ops it fuses, not every reshape) between two nodes of one
    region are drawn in it."""
    shown = _fill_gaps(regions)
    count = max(1, len(nodes))
    scale = STRIP_WIDTH / count
    colours: dict[int, str] = {}
    used = {"myelin": 0, "layer": 0, "qdq": 0}
    runs, start = [], 0
    for i in range(1, len(nodes) + 1):
        if i < len(nodes) and shown[i] == shown[start]:
            continue
        region = None if shown[start] is None else info[shown[start]]
        span = nodes[start:i]
        if region is None:
            colour, title = NOT_IN_ENGINE, "in no compute layer of this engine (folded, or only in a reformat)"
        else:
            family = "qdq" if region.qdq else ("myelin" if region.kind == "myelin" else "layer")
            if region.index not in colours:
                shades = PALETTE[family]
                colours[region.index] = shades[used[family] % len(shades)]
                used[family] += 1
            colour = colours[region.index]
            unnamed = sum(r is None for r in regions[start:i])
            title = f"region {region.index}: {region.name} ({region.type}, {region.precision or '?'})" + (
                f"; {unnamed} of these nodes are not named by the engine" if unnamed else "")
        title += f"\n{len(span)} node{'s' if len(span) != 1 else ''}: {span[0]}" + (f" ... {span[-1]}" if len(span) > 1 else "")
        width = max((i - start) * scale, 0.6)
        runs.append({"x": round(PAD + start * scale, 2), "w": round(width, 2), "colour": colour, "title": title, "text": _fit(region.name if region else "", width),
                     "ink": "#fff" if colour in DARK else "#222", "band": PRECISION_COLOURS.get(region and region.precision or "", "#ffffff")})
        start = i
    ticks = [{"x": round(PAD + min(position, count) * scale, 2), "title": str(name)} for position, name in markers]
    named = [r for r in regions if r is not None]
    changes = sum(1 for a, b in zip(named, named[1:]) if a != b)
    return {"runs": runs, "ticks": ticks, "nodes": len(nodes), "regions": sorted(set(named)), "changes": changes}


def _nodes_counted(order: str, named: str, plan: EnginePlan | None = None) -> str:
    """What the strip's nodes are: the graph's in its order, else those the layers name; Q/DQ nodes are markers, not cells."""
    if order == "onnx":
        return "ONNX nodes of the graph, its Q/DQ nodes and folded constants apart"
    if plan is None:
        return f"ONNX nodes {named}, Q/DQ apart"
    qdq = len({n for layer in plan.layers if layer.profile == 0 for n in layer.onnx_nodes if looks_qdq(n)})
    return f"ONNX nodes {named} besides {qdq} Q/DQ node{'s' if qdq != 1 else ''}" if qdq else f"ONNX nodes {named}"


def _label(name: str, counted: str, strip: dict[str, Any], plan: EnginePlan) -> str:
    """The strip's counts, each saying what it counts, so they add up to the totals the page shows elsewhere (the summary's
    regions and ONNX nodes): the regions drawn of the engine's, and what the others are."""
    engine = [r for r in plan.regions if r.profile == 0]
    drawn = set(strip["regions"])
    others = [r for r in engine if r.index not in drawn]
    kinds = {"Q/DQ": sum(r.compute and r.qdq for r in others), "reformat/copy": sum(not r.compute for r in others)}
    kinds["with none of these nodes"] = sum(r.compute and not r.qdq and all(looks_qdq(n) for n in r.onnx_nodes) for r in others)
    kinds["with nodes drawn elsewhere"] = len(others) - sum(kinds.values())
    whose = "profile 0's" if plan.profiles > 1 else "its"
    text = f"{name}: {strip['nodes']} {counted}, in {len(drawn)} of {whose} {len(engine)} regions"
    if others:
        text += f" (the other{'s' if len(others) != 1 else ''}: " + ", ".join(f"{n} {kind}" for kind, n in kinds.items() if n) + ")"
    changes, ticks = strip["changes"], len(strip["ticks"])
    text += f"; {changes} change{'s' if changes != 1 else ''} of region"
    return text + (f"; {ticks} marker{'s' if ticks != 1 else ''}" if ticks else "")


def _fill_gaps(regions: list[int | None]) -> list[int | None]:
    """None runs with the same region on both sides take that region."""
    runs = [(region, len(list(run))) for region, run in groupby(regions)]
    shown = []
    for i, (region, size) in enumerate(runs):
        if region is None and 0 < i < len(runs) - 1 and runs[i - 1][0] == runs[i + 1][0]:
            region = runs[i - 1][0]
        shown += [region] * size
    return shown


def _fit(name: str, width: float) -> str:
    """The region name shortened to fit its run (about 6.2 px per character at the label's size), or ''."""
    room = int((width - 8) / 6.2)
    if room < 10 or not name:
        return ""
    return name if len(name) <= room else name[: room - 1] + "…"
