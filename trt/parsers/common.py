"""What every layer-information parser shares: reading the file, the parse error, ONNX node names from Metadata
or layer names, the checks once the layers are read. All linear in the input: no unbounded backtracking or recursion."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipeline.core.errors import InputError
from pipeline.core.fileio import require_file
from trt.plan import MAPPING_METADATA, MAPPING_NAME, MAPPING_RANGE, MYELIN_KERNEL, EnginePlan, Layer, profile_of, without_profile

REBUILD_DETAILED = (
    "rebuild with detailed profiling verbosity: `python -m pipeline build --verbosity detailed`, "
    "`trtexec --profilingVerbosity=detailed`, or `config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED`"
)


class LayerInfoParseError(InputError):
    def __init__(self, source: str, detected: str, where: str, problem: str, expected: str):
        super().__init__(f"{source}: {detected}: {where}: {problem}; expected {expected}")


def read_text(path: Path, what: str) -> str:
    """The file as text; a missing, empty, binary or non-UTF-8 file is a clear error."""
    data = require_file(path, f"{what} file", f"pass the {what} file TensorRT or trtexec wrote").read_bytes()
    if not data or data.isspace():
        raise LayerInfoParseError(str(path), "empty file", "byte 0", "the file is empty", f"TensorRT {what}")
    if b"\x00" in data[:65536]:
        raise InputError(_binary(Path(path), what, data.index(0)))
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise LayerInfoParseError(str(path), "binary file", f"byte {err.start}", "not UTF-8 text", f"TensorRT {what} as text") from err


def _binary(path: Path, what: str, nul: int) -> str:
    """Why a binary file is not layer information, and what to give instead (an ONNX model and an engine say so)."""
    if path.suffix.lower() == ".onnx":
        return (f"{path}: an ONNX model, not TensorRT {what}: TensorRT writes that when it builds an engine from the model (the build "
                "stage's <precision>.layers.json, trtexec --exportLayerInfo); build one where TensorRT is: python -m pipeline build "
                f"--onnx {path} --profile P --strict")
    if path.suffix.lower() in (".engine", ".plan", ".trt"):
        return (f"{path}: a serialized engine, not TensorRT {what} as text: export its layer information, e.g. trtexec "
                f"--loadEngine={path} --profilingVerbosity=detailed --exportLayerInfo=layers.json")
    return f"{path}: binary file: byte {nul}: a NUL byte; expected TensorRT {what} as text (an .engine file is not accepted: export its layer information)"


def text_lines(text: str) -> list[str]:
    """Lines split on newlines only: TensorRT's Metadata separators \\x1e/\\x1f are not line breaks."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def loads_json(text: str):
    """One JSON document: orjson reads it (a third of the time at 40,000 layers); whatever orjson refuses
    the standard reader reads again, so what is accepted and the error a user sees are the standard's
    (NaN, lone surrogates, 5,000-digit integers, 1,000 levels of nesting)."""
    import orjson

    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def json_problem(err: Exception) -> str:
    """A one-line reason for a JSON document Python's reader refused beyond a syntax error."""
    if isinstance(err, RecursionError):
        return "arrays or objects nested deeper than a JSON reader follows (about 1,000 levels)"
    if "integer string conversion" in str(err):
        return "an integer with more than 4,300 digits"
    return f"a value that cannot be read ({str(err).splitlines()[0][:120]})"


# ---------------------------------------------------------------- ONNX nodes of a layer

_ONNX_ENTRY = "[ONNX Layer: "
_ENTRY_TAIL = "\x1e\x1f \t\r\n"


def nodes_from_metadata(metadata: str) -> list[str]:
    """`[ONNX Layer: a]\\x1e[ONNX Layer: b]` (or joined by \\x1f, or by nothing) -> [a, b]; split on the entry
    marker, so names holding `]` or `[` stay whole."""
    return unique(piece.rstrip(_ENTRY_TAIL).removesuffix("]") for piece in metadata.split(_ONNX_ENTRY)[1:])


_FOREIGN_PREFIX, _FOREIGN_SUFFIX = "{ForeignNode[", "]}"
_REFORMAT = re.compile(r"Reformatting CopyNode for (?:Input|Output) Tensor \d{1,6} to ")
# names TensorRT makes up for layers it adds: not ONNX nodes
_TRT_INTERNAL = re.compile(r"\(Unnamed Layer\* \d{1,9}\)|\[trainStation\d{1,9}\]|\[DevicetoShapeHostCopy\]")
_TRT_PREFIX = re.compile(r"(?:copied_)?(?:un)?(?:squeeze|reshape|transpose|shuffle|flatten)(?:_node)?_(?:after|before)_")
_TENSOR_NAME = re.compile(r":\d{1,6}$")  # TensorFlow tensor names (`.../ReadVariableOp:0`) are weights, not nodes
_INITIALIZER = re.compile(r"\.(?:weight|bias|running_mean|running_var)$")
_CLONE = re.compile(r"_clone_\d{1,6}$")


def assign_nodes(layer: Layer, metadata: str | None) -> Layer:
    """ONNX nodes from Metadata when TensorRT wrote the field (even empty), else from the layer's name.
    A Myelin kernel's own name (`__myl_CastReshCast_myl4_4`) is never an ONNX node."""
    base = layer.base_name
    kernel = MYELIN_KERNEL.search(base) if "_myl" in base else None
    if kernel:
        layer.myelin_graph = int(kernel["graph"])
    from_metadata = nodes_from_metadata(metadata) if metadata else []
    if from_metadata or (metadata is not None and not base.startswith(_FOREIGN_PREFIX)):
        layer.onnx_nodes, layer.mapping = from_metadata, MAPPING_METADATA  # the exact mapping: the name is not needed
        if layer.type == "Myelin":
            layer.myelin_graph = -1
        return layer
    named = nodes_from_name(layer.name)
    if not kernel and (layer.type == "Myelin" or named.type == "Myelin"):
        layer.myelin_graph = -1  # a TensorRT 8.x region: numbered in finish()
    layer.foreign_range = named.foreign_range
    layer.onnx_nodes, layer.mapping = named.onnx_nodes, named.mapping
    if layer.type == "unknown":
        layer.type = named.type
    return layer


def nodes_from_name(name: str) -> Layer:
    """A layer known only by name: `a + b`, `{ForeignNode[a...b]}`, `PWN(a, b)`, reformats, Myelin kernels."""
    layer = Layer(name=name, type="unknown")
    base = without_profile(name)
    if _REFORMAT.match(base) or MYELIN_KERNEL.search(base):
        layer.type = "Reformat" if _REFORMAT.match(base) else "unknown"
        return layer
    if base.startswith(_FOREIGN_PREFIX) and base.endswith(_FOREIGN_SUFFIX):
        layer.type = "Myelin"
        inner = base[len(_FOREIGN_PREFIX) : -len(_FOREIGN_SUFFIX)]
        first, dots, last = inner.partition("...")
        if not dots:  # a region of the nodes it names: `{ForeignNode[(Unnamed Layer* 0) [DynamicQuantize]]}`
            layer.onnx_nodes, layer.mapping = onnx_names(inner), MAPPING_NAME
            return layer
        first_names, last_names = onnx_names(first), onnx_names(last)
        first_parts, last_parts = split_top(first, " + "), split_top(last, " + ")
        layer.onnx_nodes, layer.mapping = unique(first_names + last_names), MAPPING_RANGE
        # the ends of the range: the outermost ONNX-looking names, else what TensorRT wrote
        layer.foreign_range = ((first_names or first_parts)[0].strip(), (last_names or last_parts)[-1].strip())
        return layer
    layer.onnx_nodes, layer.mapping = onnx_names(base), MAPPING_NAME
    return layer


def onnx_names(text: str) -> list[str]:
    """The ONNX node names in a fused layer name, leaving out what TensorRT made up."""
    pieces = (_CLONE.sub("", piece.strip()) for part in split_top(text, " + ") for piece in _pwn_leaves(part))
    return unique(piece for piece in pieces if piece and not is_trt_generated(piece))


def is_trt_generated(name: str) -> bool:
    """Names of layers TensorRT adds (copies, reshapes around a GEMM, unnamed layers) and of weights."""
    return bool(
        _TRT_INTERNAL.search(name) or _TRT_PREFIX.match(name) or name.endswith(" copy") or _TENSOR_NAME.search(name) or _INITIALIZER.search(name)
    )


def _pwn_leaves(part: str) -> list[str]:
    """`PWN(PWN(a, b), c)` -> [a, b, c]: pointwise fusions nest; unwrapped with a work list, not recursion."""
    leaves, work = [], [part.strip()]
    while work:
        item = work.pop()
        if item.startswith("PWN(") and item.endswith(")"):
            work.extend(reversed([p.strip() for p in split_top(item[4:-1], ", ")]))
        else:
            leaves.append(item)
    return leaves


_OPEN, _CLOSE = "([{", ")]}"


def split_top(text: str, separator: str) -> list[str]:
    """Split on `separator` outside brackets. Brackets are counted only where the separator occurs,
    so the cost is one pass over the text."""
    if separator not in text:
        return [text]
    parts, start, depth, scanned = [], 0, 0, 0
    index = text.find(separator)
    while index != -1:
        chunk = text[scanned:index]
        depth += sum(chunk.count(c) for c in _OPEN) - sum(chunk.count(c) for c in _CLOSE)
        scanned = index
        if depth <= 0:
            parts.append(text[start:index])
            start = index + len(separator)
            depth = 0
        index = text.find(separator, index + len(separator))
    parts.append(text[start:])
    return parts


def unique(names) -> list[str]:
    return list(dict.fromkeys(n.strip() for n in names if n.strip()))


# ---------------------------------------------------------------- after parsing


def finish(plan: EnginePlan) -> EnginePlan:
    """Profiles, TensorRT 8.x region numbers, regions, and notes on what the file cannot tell."""
    _check_unique(plan)
    _assign_profiles(plan)
    next_graph = 1 + max((layer.myelin_graph for layer in plan.layers if layer.myelin_graph is not None), default=-1)
    for layer in plan.layers:
        if layer.myelin_graph == -1:
            layer.myelin_graph, next_graph = next_graph, next_graph + 1
    plan.settle()
    if plan.verbosity == "layer_names_only":
        plan.notes.append(
            "built with LAYER_NAMES_ONLY profiling verbosity: layers carry no [ONNX Layer] Metadata, so ONNX nodes are "
            f"approximated from names and ForeignNode ranges (marked 'name'/'range'); for the exact per-node mapping {REBUILD_DETAILED}"
        )
    elif not any(layer.mapping == MAPPING_METADATA for layer in plan.layers):
        plan.notes.append("no layer has [ONNX Layer] Metadata (TensorRT 8.x or a tool that drops it): ONNX nodes are approximated from layer names (marked 'name')")
    return plan


def _check_unique(plan: EnginePlan) -> None:
    seen: dict[str, int] = {}
    for index, layer in enumerate(plan.layers):
        first = seen.setdefault(layer.name, index)
        if first != index:
            raise LayerInfoParseError(
                plan.source, plan.format, f"layers {first} and {index}", f"duplicate layer name {layer.name!r}",
                "unique layer names in one engine (several engines concatenated into one file?)",
            )


def _assign_profiles(plan: EnginePlan) -> None:
    """` [profile N]` in the layer's name; a Myelin kernel may carry it only in its tensors' names, and a Myelin
    graph takes its kernels' profile. (Other layers of profile N always have it in their own name.)"""
    graph_profile: dict[int, int] = {}
    for layer in plan.layers:
        profile = profile_of(layer.name)
        layer.profile = profile if profile is not None else (layer.tensor_profile if layer.myelin_graph is not None else 0)
        if layer.myelin_graph is not None and layer.myelin_graph >= 0:
            graph_profile[layer.myelin_graph] = max(graph_profile.get(layer.myelin_graph, 0), layer.profile)
    for layer in plan.layers:
        if layer.myelin_graph in graph_profile:
            layer.profile = graph_profile[layer.myelin_graph]
