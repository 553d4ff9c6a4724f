"""The layers TensorRT builds outside Myelin: convolutions with their epilogue (BatchNorm, activation,
residual Add, pointwise `PWN(...)`), fully connected layers (8.x), pooling and resampling. Each fusion is a
rule of trt/predict/rules.py (`conv-epilogue`, `conv-residual-add`, `fc-as-convolution`)."""

from __future__ import annotations

from collections.abc import Callable

from trt.predict.graph import Node, PredictGraph
from trt.predict.parts import Group
from trt.predict.rules import ACTIVATIONS, CONV_EPILOGUE, CONV_OPS, POOL_OPS, STANDARD_OPS

MAX_EPILOGUE = 12  # ops one epilogue takes at most: a fused kernel's epilogue is short
UNARY_EPILOGUE = ACTIVATIONS | {"BatchNormalization"}


def residual_targets(g: PredictGraph) -> dict[str, str]:
    """Add node -> the convolution that takes it [FC: convolution + element-wise sum]: the Add of two computed
    tensors, taken by the convolution behind a float input; of two, the one computed last ([EQ] figures 6-7: a
    quantized input is the residual, so the convolution of the other input takes the Add)."""
    targets = {}
    for node in g.nodes:
        if node.op_type != "Add" or node.name in g.folded or len(g.computed(node)) != 2:
            continue
        candidates = [conv for tensor in node.input if (conv := _conv_behind(g, tensor)) is not None]
        if candidates:
            targets[node.name] = max(candidates, key=lambda conv: g.position[conv.name]).name
    return targets


def _conv_behind(g: PredictGraph, tensor: str) -> Node | None:
    """The convolution whose output `tensor` is, through single-reader BatchNorm/activations; None when quantized."""
    for _ in range(MAX_EPILOGUE):
        node = g.producer(tensor)
        if node is None or len(g.consumers(tensor)) != 1:
            return None
        if node.op_type in CONV_OPS:
            return node
        if node.op_type not in UNARY_EPILOGUE:
            return None
        tensor = node.input[0]
    return None


def grow(g: PredictGraph, start: Node, eligible: Callable[[Node, set[str]], bool], limit: int = MAX_EPILOGUE) -> list[Node]:
    """`start` and the ops after it that read only its outputs (and constants) and that `eligible` accepts, cut
    back to the longest run after which one tensor alone leaves the group (`Conv + PWN(Sigmoid, Mul)`)."""
    members, outputs = [start], set(start.output)
    taken = {start.name}
    best = 1
    for _ in range(limit):
        readers = [r for t in outputs for r in g.consumers(t) if r.name not in taken and eligible(r, outputs)]
        if not readers:
            break
        nxt = min(readers, key=lambda r: g.position[r.name])
        members.append(nxt)
        taken.add(nxt.name)
        outputs.update(nxt.output)
        if _leaving(g, outputs, taken) == 1:
            best = len(members)
    return members[:best]


def _leaving(g: PredictGraph, outputs: set[str], taken: set[str]) -> int:
    """How many of the group's tensors are read outside it (or are network outputs)."""
    return sum(1 for t in outputs if t in g.outputs or any(r.name not in taken for r in g.consumers(t)))


def conv_group(g: PredictGraph, conv: Node, targets: dict[str, str]) -> Group:
    """A convolution and its epilogue: BatchNorm, activations, pointwise ops on its output alone, and the residual
    Add it takes with the activation after it."""

    def eligible(node: Node, outputs: set[str]) -> bool:
        if node.name in g.folded:
            return False
        computed = g.computed(node)
        if node.name in g.erased:  # [FC] a no-op between the convolution and its epilogue is erased first
            return len(computed) == 1 and computed[0] in outputs
        if node.op_type == "Add" and targets.get(node.name) == conv.name:
            return any(t in outputs for t in computed)
        return node.op_type in CONV_EPILOGUE and bool(computed) and all(t in outputs for t in computed)

    members = grow(g, conv, eligible)
    if len(members) > 1 and members[-1].name in g.erased:  # a reshape last is no epilogue: it stays erased
        members = members[:-1]
    group = Group("conv", [m.name for m in members if m.name not in g.erased], conv.name, members[-1].output[0])
    for member in members:
        if member.op_type == "Add" and targets.get(member.name) == conv.name:
            group.residual = next(t for t in g.computed(member) if t not in {o for m in members for o in m.output})
    return group


def fc_group(g: PredictGraph, gemm: Node) -> Group:
    """TensorRT 8.x: a Gemm/MatMul with constant weights as a 1x1 convolution with its bias and activation."""

    def eligible(node: Node, outputs: set[str]) -> bool:
        computed = g.computed(node)
        return node.op_type in ({"Add"} | UNARY_EPILOGUE) and len(computed) == 1 and computed[0] in outputs

    members = grow(g, gemm, eligible, limit=4)
    return Group("fc", [m.name for m in members], gemm.name, members[-1].output[0])


def standard_groups(g: PredictGraph, fc_gemms: bool) -> tuple[list[Group], dict[str, Group]]:
    """The layers outside Myelin that exist whatever the Q/DQ: convolutions (with their epilogue), pooling,
    resampling, and with `fc_gemms` (TensorRT 8.x without Myelin) the fully connected layers. Returns the
    groups and the group of each node they hold."""
    targets = residual_targets(g)
    groups, owner = [], {}
    for node in g.nodes:
        if node.name in owner or node.name in g.folded or node.name in g.weight_qdq or node.name in g.erased:
            continue
        if node.op_type in CONV_OPS:
            group = conv_group(g, node, targets)
        elif fc_gemms and g.is_weighted(node) and node.op_type in ("Gemm", "MatMul"):
            group = fc_group(g, node)
        elif node.op_type in POOL_OPS or spatial_reduction(g, node):
            group = Group("pool", [node.name], node.name, node.output[0])
        elif node.op_type in STANDARD_OPS:
            group = Group("resize" if node.op_type in ("Resize", "Upsample") else "scale" if node.op_type == "BatchNormalization" else "other",
                          [node.name], node.name, node.output[0])
        else:
            continue
        groups.append(group)
        for name in group.nodes:
            owner[name] = group
    return groups, owner


def spatial_reduction(g: PredictGraph, node: Node) -> bool:
    """`reduce-as-pooling`: ReduceMean/ReduceMax over H and W of an NCHW tensor (axes 2, 3 or -2, -1 of a rank-4 input)."""
    if node.op_type not in ("ReduceMean", "ReduceMax"):
        return False
    axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
    if axes is None and len(node.input) > 1 and node.input[1]:
        value = g.constant(node.input[1])
        axes = None if value is None else [int(v) for v in value.reshape(-1)]
    if not axes or len(axes) != 2:
        return False
    if sorted(axes) == [2, 3]:
        return True
    rank = len(g.shapes.get(node.input[0]) or []) if sorted(axes) == [-2, -1] else 0
    return rank == 4
