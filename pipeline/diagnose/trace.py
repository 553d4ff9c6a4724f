"""Everything one execution of an ONNX model computes, in execution order.

The model runs once on onnxruntime (CPU, every graph optimization off, so each node of the file
runs as written) with every node result exposed as a graph output. The trace lists the inputs,
then the node results in the order the outputs demand them (`demand_order`), each initializer
just before the first node that reads it, each with its dtype,
shape, a fingerprint of its values (`Step.key`: summary statistics rounded to 3 significant digits,
equal for results equal within float noise), the op and node that made it and the torch module
the node came from (pipeline/core/scopes.py). align.py aligns two traces.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.core.errors import InputError
from pipeline.core.graph import QDQ_OPS, GraphIndex
from pipeline.core.scopes import module_name, node_scope

DEFAULT_LIMIT_MB = 4096  # largest trace kept without --nodes or --max-trace-mb


@dataclass
class Step:
    kind: str  # "input", "initializer" or "result"
    name: str  # the tensor's name
    op_type: str  # the op that made it ("" for inputs and initializers)
    node: str  # the node that made it (for an initializer: the first node reading it)
    module: str  # that node's torch module ("" when the export did not record it)
    value: np.ndarray = field(repr=False)
    key: str = ""  # value fingerprint: equal keys mean equal values up to float noise
    stats: tuple[float, float, float] = (0.0, 0.0, 0.0)  # mean, std, max |x| (0s for non-floats)

    @property
    def dtype(self) -> str:
        return str(self.value.dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def is_float(self) -> bool:
        return np.issubdtype(self.value.dtype, np.floating)

    def summary(self) -> str:
        """A short human fingerprint: mean±std for floats, the values or their range otherwise."""
        if self.value.size == 0:
            return "empty"
        if self.is_float:
            return f"{self.stats[0]:.3g}±{self.stats[1]:.3g}"
        flat = self.value.reshape(-1)
        if flat.size <= 4:
            return ",".join(str(v) for v in flat.tolist())
        return f"{flat.min()}..{flat.max()}"


@dataclass
class Trace:
    path: Path
    steps: list[Step]
    not_exposed: list[str]  # node results onnxruntime could not return (no type known for them)
    nbytes: int


def _sig(x: float) -> str:
    return f"{x:.3g}" if np.isfinite(x) else str(x)


ENDS = 2048  # values at each end of a tensor that its order-sensitive statistic reads
SATURATED = 1e30  # beyond it a value stands for an infinity (attention masks use -inf or float32's lowest value)


def saturated(data: np.ndarray) -> np.ndarray:
    """float64 values with those beyond +-SATURATED set to +-inf."""
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(data) >= SATURATED, np.copysign(np.inf, data), data)


def fingerprint(value: np.ndarray) -> tuple[str, tuple[float, float, float]]:
    """(key, (mean, std, max |x|)). The key holds the squeezed shape, the dtype family and rounded
    statistics, so a result and its transpose differ, and fp16 and fp32 forms of one result agree."""
    shape = "x".join(str(d) for d in value.shape if d != 1)
    if value.size == 0:
        return f"{value.dtype.kind}|{shape}|empty", (0.0, 0.0, 0.0)
    if np.issubdtype(value.dtype, np.floating):
        data = value.reshape(-1)
        top = float(np.abs(data).max())
        if not top < SATURATED:  # infinities, NaNs or mask values: the slow path, in float64
            data = saturated(data.astype(np.float64))
            data = data[np.isfinite(data)]
            top = float(np.abs(data).max()) if data.size else 0.0
        infinite = value.size - data.size
        if data.size:
            mean, std = float(data.mean(dtype=np.float64)), float(data.std(dtype=np.float64))
            # order-sensitive: the first and last values weighted by their place (tells a matrix from its transpose)
            ends = np.concatenate([data[:ENDS], data[-ENDS:]]).astype(np.float64)
            centroid = float(np.dot(ends, np.linspace(-1.0, 1.0, ends.size))) / (float(np.abs(ends).sum()) or 1.0)
        else:
            mean = std = centroid = 0.0
        return f"f|{shape}|{_sig(mean)}|{_sig(std)}|{_sig(top)}|{_sig(centroid)}|{infinite}", (mean, std, top)
    flat = value.reshape(-1)
    if value.dtype == np.bool_:
        return f"b|{shape}|{int(flat.sum())}|{flat[:16].tobytes().hex()}", (0.0, 0.0, 0.0)
    data = flat.tobytes() if flat.size <= 4096 else flat[:2048].tobytes() + flat[-2048:].tobytes() + str(int(flat.sum())).encode()
    return f"i|{shape}|{zlib.crc32(data):08x}", (0.0, 0.0, 0.0)


def _itemsize(elem_type: int) -> int:
    import onnx

    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError):
        return 4


def trace_model(path: Path, feeds: dict[str, np.ndarray], workdir: Path, nodes: str | None = None,
                limit_mb: float = DEFAULT_LIMIT_MB, known: dict[str, str] | None = None) -> Trace:
    """Run the model on `feeds` (one sample, by its input names) with every node result exposed
    (only the nodes whose name, op or module matches the regex `nodes`, when given). `known`: node name
    -> module, for the nodes that record none (a model quantized from the one traced first)."""
    from pipeline.diagnose.exposed import Exposed, load_inlined, tensor_types

    model = load_inlined(path)
    types = tensor_types(model, feeds)
    pattern = re.compile(nodes) if nodes else None
    modules = node_modules(GraphIndex.of(model), known or {})
    kept = [pattern is None or bool(pattern.search(n.name) or pattern.search(n.op_type) or pattern.search(m)) for n, m in zip(model.graph.node, modules)]
    existing = {o.name for o in model.graph.output}
    exposed, not_exposed, estimate, unknown = [], [], 0, 0
    for node, keep in zip(model.graph.node, kept):
        for tensor in node.output:
            if not tensor or not keep:
                continue
            tensor_type = types.get(tensor)
            if tensor not in existing and (tensor_type is None or not tensor_type.HasField("tensor_type")):
                not_exposed.append(tensor)
                continue
            exposed.append(tensor)
            if tensor_type is not None and tensor_type.HasField("tensor_type"):
                dims = tensor_type.tensor_type.shape.dim
                if dims and all(d.HasField("dim_value") for d in dims) or not dims and tensor_type.tensor_type.HasField("shape"):
                    estimate += int(np.prod([d.dim_value for d in dims], dtype=np.int64)) * _itemsize(tensor_type.tensor_type.elem_type)
                else:
                    unknown += 1
    weights = sum(int(np.prod(t.dims, dtype=np.int64)) * _itemsize(t.data_type) for t in model.graph.initializer)
    needed_mb = (estimate + weights) / 2**20
    if needed_mb > limit_mb:
        raise InputError(f"{path}: keeping every node result needs about {needed_mb:,.0f} MiB ({len(exposed)} results, "
                         f"{unknown} more of unknown size), over the {limit_mb:g} MiB limit; keep a subset with --nodes PATTERN "
                         "(a regex over node names, ops and modules) or raise --max-trace-mb")
    session = Exposed(path, model, exposed, types, workdir)
    values = session.run(feeds)
    graph = GraphIndex.of(model)  # with the results exposed: demand order starts from each output
    steps = [Step("input", name, "", "", "", np.asarray(feeds[name])) for name in session.inputs]
    seen: set[str] = set()
    for position in demand_order(graph):
        node, module, keep = graph.nodes[position], modules[position], kept[position]
        if not keep:
            continue
        for tensor in node.input:
            if tensor in graph.initializers and tensor not in seen:
                seen.add(tensor)
                steps.append(Step("initializer", tensor, "", node.name, module, graph.constant(tensor)))
        for tensor in node.output:
            if tensor in values:
                steps.append(Step("result", tensor, node.op_type, node.name, module, np.asarray(values[tensor])))
    for step in steps:
        step.key, step.stats = fingerprint(step.value)
    return Trace(path, steps, not_exposed, sum(s.value.nbytes for s in steps))


def node_modules(graph: GraphIndex, known: dict[str, str]) -> list[str]:
    """Each node's torch module: the one it records, else the one `known` gives its name ("" for neither).
    A Q/DQ node the export never saw (ModelOpt inserts them) takes the module of the node it quantizes:
    the first reader of its dequantized tensor that has one, else the node that made the tensor it quantizes."""
    modules = [module_name(node_scope(n.name, {p.key: p.value for p in n.metadata_props})) or known.get(n.name, "") for n in graph.nodes]
    for position, node in enumerate(graph.nodes):
        if node.op_type in QDQ_OPS and not modules[position]:
            modules[position] = _quantized_module(graph, position, modules)
    return modules


def _quantized_module(graph: GraphIndex, position: int, modules: list[str]) -> str:
    """The module of the first non-Q/DQ reader downstream of a Q/DQ node, else of the maker upstream of it."""
    ahead = [position]
    while ahead:
        for reader in (r for t in graph.nodes[ahead.pop(0)].output for r in graph.readers.get(t, ())):
            if graph.nodes[reader].op_type in QDQ_OPS:
                ahead.append(reader)
            elif modules[reader]:
                return modules[reader]
    maker = graph.producers.get(graph.nodes[position].input[0])
    while maker is not None and graph.nodes[maker].op_type in QDQ_OPS:
        maker = graph.producers.get(graph.nodes[maker].input[0])
    return modules[maker] if maker is not None else ""


def demand_order(graph: GraphIndex) -> list[int]:
    """Node positions in the order a run driven by the outputs computes them: depth first from each
    graph output, each node's inputs in their order, a node after what it reads (nodes no output needs
    last, in file order). Two graphs that list independent branches in different orders (an optimizer
    hoisting shape computations) get the same order."""
    producer = graph.producers
    order: list[int] = []
    done: set[int] = set()
    for start in [producer[o] for o in graph.outputs if o in producer] + list(range(len(graph.nodes))):
        stack = [(start, 0)]
        while stack:
            node, next_input = stack.pop()
            if node in done:
                continue
            inputs = graph.nodes[node].input
            while next_input < len(inputs) and (inputs[next_input] not in producer or producer[inputs[next_input]] in done):
                next_input += 1
            if next_input < len(inputs):
                stack += [(node, next_input + 1), (producer[inputs[next_input]], 0)]
            else:
                done.add(node)
                order.append(node)
    return order


def match_inputs(path_a: Path, path_b: Path, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[str]]:
    """Feeds for A and for B from one sample, and a note per input of B fed by position (its name
    differs from A's, its dtype and rank agree)."""
    import onnx

    inputs = []
    for path in (path_a, path_b):
        model = onnx.load(str(path), load_external_data=False)
        init = {t.name for t in model.graph.initializer}
        inputs.append([(i.name, i.type.tensor_type.elem_type, len(i.type.tensor_type.shape.dim)) for i in model.graph.input if i.name not in init])
    a_inputs, b_inputs = inputs
    missing = [name for name, _, _ in a_inputs if name not in feeds]
    if missing:
        raise InputError(f"{path_a}: model input {missing[0]!r} has no data (given: {', '.join(sorted(feeds))}); give one array per input of A")
    feeds_a = {name: feeds[name] for name, _, _ in a_inputs}
    b_names = {name for name, _, _ in b_inputs}
    if b_names <= feeds.keys():
        return feeds_a, {name: feeds[name] for name in b_names}, []
    if len(a_inputs) != len(b_inputs):
        raise InputError(f"{path_b}: takes {len(b_inputs)} inputs ({', '.join(sorted(b_names))}), {path_a} takes {len(a_inputs)} and the names differ: "
                         "the two models cannot run on the same inputs; compare two graphs of one model")
    feeds_b, notes = {}, []
    for (a_name, a_type, a_rank), (b_name, b_type, b_rank) in zip(a_inputs, b_inputs):
        if b_name == a_name:
            feeds_b[b_name] = feeds[a_name]
            continue
        if (a_type, a_rank) != (b_type, b_rank):
            raise InputError(f"{path_b}: input {b_name!r} ({onnx.TensorProto.DataType.Name(b_type).lower()}, rank {b_rank}) is not in A, and A's input at "
                             f"its position, {a_name!r}, is {onnx.TensorProto.DataType.Name(a_type).lower()} of rank {a_rank}: the models have no common "
                             "inputs; compare two graphs of one model")
        feeds_b[b_name] = feeds[a_name]
        notes.append(f"B's input {b_name!r} fed A's {a_name!r} (matched by position, dtype and rank)")
    return feeds_a, feeds_b, notes
