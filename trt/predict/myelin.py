"""Which ops run in Myelin and how they form regions: the ops no TensorRT layer takes (`myelin-scope`,
`myelin-offload-8x`), in connected groups holding a GEMM, a normalization, a softmax or a reduction; a group
is cut wherever a layer outside Myelin sits between two of its ops (`myelin-convex`)."""

from __future__ import annotations

from trt.predict.graph import PredictGraph
from trt.predict.parts import Group
from trt.predict.quantize import Quantization


def candidates(g: PredictGraph, owner: dict[str, Group], trt_major: int, attention: bool) -> set[str]:
    """The ops Myelin may take: in 10.x/11.x every op no standard layer holds; in 8.x the same only when the
    network has an attention pattern [2576], else none."""
    if trt_major < 10 and not attention:
        return set()
    skip = g.folded | g.weight_qdq
    return {n.name for n in g.nodes if n.name not in owner and n.name not in skip}


def members(g: PredictGraph, possible: set[str], quantization: Quantization) -> set[str]:
    """The candidates left once the Q/DQ that run standalone, or go into a standard layer, are taken out."""
    kept = set()
    for name in possible:
        root = quantization.root(name) if name in quantization.fates else None
        if root is None or (root.kind == "absorbed" and root.into in possible):
            kept.add(name)
    return kept


def components(g: PredictGraph, nodes: set[str]) -> list[list[str]]:
    """Connected groups of `nodes` (tensor edges between two of them), each in graph order."""
    parent = {name: name for name in nodes}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for name in nodes:
        for tensor in g.by_name[name].output:
            for reader in g.consumers(tensor):
                if reader.name in nodes:
                    a, b = find(name), find(reader.name)
                    if a != b:
                        parent[a] = b
    groups: dict[str, list[str]] = {}
    for node in g.nodes:
        if node.name in nodes:
            groups.setdefault(find(node.name), []).append(node.name)
    return list(groups.values())


def convex_regions(g: PredictGraph, inside: set[str], layers: set[str]) -> list[list[str]]:
    """The regions of the Myelin ops `inside`: connected, and never with a layer outside them (`layers`) on a path
    between two of their ops. Each op's level counts the outside layers on its longest path from the inputs;
    a region holds ops of one level, so a path leaving it and coming back (which passes a layer) cannot exist."""
    level: dict[str, int] = {}
    for node in g.nodes:
        best = 0
        for tensor in g.computed(node):
            producer = g.producer(tensor)
            if producer is not None:
                best = max(best, level.get(producer.name, 0) + (producer.name in layers))
        level[node.name] = best
    by_level: dict[int, set[str]] = {}
    for name in inside:
        by_level.setdefault(level[name], set()).add(name)
    regions = [region for names in by_level.values() for region in components(g, names)]
    return sorted(regions, key=lambda region: g.position[region[0]])
