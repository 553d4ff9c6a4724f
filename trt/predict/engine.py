"""The predicted engine, before it becomes a plan: the standard layers, the Q/DQ fates, the layers outside
Myelin for what is left (pointwise `PWN(...)`, shuffles, 8.x's own layers), the Myelin regions and, in
TensorRT 10.x/11.x, their kernels."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.graph import QDQ_OPS
from pipeline.core.qdq import PlacementRules
from trt.predict import kernels, layers, myelin
from trt.predict.graph import PredictGraph
from trt.predict.parts import Group
from trt.predict.quantize import Placement, Quantization
from trt.predict.rules import GEMM_OPS, INDEX_OPS, MOVE_OPS, MYELIN_ANCHORS, NORMALIZATION_OPS, POINTWISE_OPS, REDUCE_OPS, SOFTMAX_OPS


@dataclass
class Built:
    """Every layer the engine will have (Myelin regions as their kernels or as one 8.x layer), in graph order."""

    groups: list[Group]
    quantization: Quantization
    regions: list[list[Group]]  # the kernels (10.x) or the one layer (8.x) of each region
    region_nodes: list[list[str]]


def build(g: PredictGraph, rules: PlacementRules, trt_major: int, max_sequence: int | None) -> Built:
    scores = {matmul.name for matmul, _, _ in g.attention()}
    standard, owner = layers.standard_groups(g, fc_gemms=trt_major < 10 and not scores)
    possible = myelin.candidates(g, owner, trt_major, bool(scores))
    quantization = Placement(g, rules, owner, possible, max_sequence).run()
    _absorb(g, quantization, owner)
    standard = _conv_pool(g, standard, owner, quantization)
    inside = myelin.members(g, possible, quantization)
    # Myelin takes the groups holding a GEMM, a normalization, a softmax or a reduction
    anchored = [c for c in myelin.components(g, inside) if any(g.by_name[n].op_type in MYELIN_ANCHORS for n in c)]
    myelin_nodes = {name for component in anchored for name in component}
    rest = {n.name for n in g.nodes if n.name not in owner and n.name not in myelin_nodes and n.name not in g.folded}
    groups = standard + _qdq_layers(g, quantization) + _leftovers(g, myelin.components(g, rest), quantization, owner)
    layer_nodes = {name for group in groups for name in group.nodes}
    region_nodes = myelin.convex_regions(g, myelin_nodes, layer_nodes)
    regions = [[Group("myelin", region, region[0])] if trt_major < 10 else kernels.Kernels(g, region, scores).build() for region in region_nodes]
    groups.sort(key=lambda group: g.position[group.anchor])
    return Built(groups, quantization, regions, region_nodes)


def _absorb(g: PredictGraph, quantization: Quantization, owner: dict[str, Group]) -> None:
    """Q/DQ absorbed into (and weights' Q/DQ read by) a standard layer join its nodes."""
    for name in list(quantization.fates):
        root = quantization.root(name)
        group = owner.get(root.into) if root.kind in ("absorbed", "weight") and root.into else None
        if group is not None:
            group.nodes.append(name)
            owner[name] = group
    for group in {id(gr): gr for gr in owner.values()}.values():
        group.nodes.sort(key=g.position.__getitem__)


def _conv_pool(g: PredictGraph, standard: list[Group], owner: dict[str, Group], quantization: Quantization) -> list[Group]:
    """`conv-pool-int8`: an INT8 convolution whose only reader is a max pooling running INT8 takes it."""
    kept = []
    for group in standard:
        if group.kind == "pool" and group.anchor in quantization.int8:
            pool = g.by_name[group.anchor]
            conv = owner.get(g.producer(pool.input[0]).name) if g.producer(pool.input[0]) else None
            if conv is not None and conv.kind == "conv" and conv.output == pool.input[0] and len(g.consumers(conv.output)) == 1:
                conv.nodes = sorted(conv.nodes + group.nodes, key=g.position.__getitem__)
                conv.output = group.output
                for name in group.nodes:
                    owner[name] = conv
                continue
        kept.append(group)
    return kept


def _qdq_layers(g: PredictGraph, quantization: Quantization) -> list[Group]:
    """A Reformat layer for each standalone Q/DQ, holding the Q/DQ merged with it."""
    found = {name: Group("qdq", [], name) for name, fate in quantization.fates.items() if fate.kind == "standalone"}
    for name, fate in quantization.fates.items():
        if fate.kind == "merged" and fate.into in found:
            found[fate.into].nodes.append(name)
    for name, group in found.items():
        group.nodes = sorted([name, *group.nodes], key=g.position.__getitem__)
    return list(found.values())


def _leftovers(g: PredictGraph, outside: list[list[str]], quantization: Quantization, owner: dict[str, Group]) -> list[Group]:
    """What neither a standard layer nor Myelin takes: connected pointwise ops as one PointWise layer [FC], a data
    movement as a Shuffle, a softmax, normalization, reduction or two-input MatMul as a layer of its own."""
    fates, groups = quantization.fates, []
    taken = set(owner) | {name for name, fate in fates.items() if fate.kind in ("standalone", "merged", "weight")}
    for component in outside:
        names = [n for n in component if n not in taken and n not in g.erased and g.by_name[n].op_type not in QDQ_OPS]
        pointwise = [n for n in names if g.by_name[n].op_type in POINTWISE_OPS]
        groups += [Group("pointwise", part, part[0]) for part in myelin.components(g, set(pointwise))]
        for name in names:
            op = g.by_name[name].op_type
            if op in POINTWISE_OPS or op == "Concat":  # [FC] concatenation elimination: the producers write one buffer
                continue
            kind = ("shuffle" if op in MOVE_OPS else "softmax" if op in SOFTMAX_OPS else "norm" if op in NORMALIZATION_OPS
                    else "reduce" if op in REDUCE_OPS or op in INDEX_OPS else "matmul" if op in GEMM_OPS else "other")
            groups.append(Group(kind, [name], name))
    for group in groups:
        for name in group.nodes:
            owner[name] = group
    for name in list(fates):  # a Q/DQ absorbed by one of these layers
        root = quantization.root(name)
        if root.kind == "absorbed" and root.into in owner and name not in owner and owner[root.into] in groups:
            owner[root.into].nodes.append(name)
    return groups
