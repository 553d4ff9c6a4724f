"""Where an exported model first departs from torch, in the torch model's own terms.

The torch model runs with a forward hook on every submodule, capturing what each returns (and,
for a dump, what it was given); the ONNX model runs on onnxruntime with every intermediate float
tensor exposed (exposed.py). A module maps to a tensor through the scope each ONNX node
records (pipeline/core/scopes.py): of the tensors the nodes of the module (and its children) make
that other nodes read, the last in graph order with the module's output shape is its output
(a module the exporter folded into the one before it: `_compare_folded`). Modules are listed in the order they finish in torch (children before their parent), so the first
one over the tolerance is where the export first goes wrong (`TorchComparison`; `ExportersComparison`
holds both exporters' exports against torch and their alignment, for compare --exporters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import InputError, first_line
from pipeline.core.graph import GraphIndex
from pipeline.core.profiles import Profile
from pipeline.core.scopes import NAME_SCOPES_KEY, inline_functions_proto, module_name, node_scope
from pipeline.diagnose.compare import AlignedRow, Alignment, Verdicted

NO_NODE = "no ONNX node records this module (folded away, an identity, or inside a module exported as a function)"
FUSED = "fused with the next module"


@dataclass(frozen=True)
class ModuleError:
    module: str  # qualified name, as named_modules() gives it
    kind: str  # the module's class
    tensor: str | None  # the ONNX tensor compared; None when the module is not mapped
    shape: list[int]
    max_abs_diff: float | None
    relative: float | None  # max_abs_diff / max |torch|
    note: str  # why not mapped, or that a module ran several times ("" otherwise)


@dataclass
class TorchComparison(Verdicted):
    """An ONNX file against its torch model, module by module, in the order the modules finish in torch."""

    onnx: str
    profile: str
    tolerance: float  # the profile's export tolerance (max |onnx - torch|, x the module's largest magnitude above 1, as export's check)
    modules: int
    mapped: int  # modules mapped to an ONNX tensor
    first_diverging: ModuleError | None  # the first over the tolerance
    rows: list[ModuleError]

    @property
    def verdict(self) -> str:
        first = self.first_diverging
        if first is None:
            return f"no mapped module exceeds the tolerance {self.tolerance:g} ({self.mapped} of {self.modules} modules mapped)"
        return (f"first diverging module: {first.module} ({first.kind}, tensor {first.tensor!r}, max_abs_diff {first.max_abs_diff:.3g} "
                f"over the tolerance {self.tolerance:g}{_scaled(first)})")

    @property
    def fused(self) -> list[str]:
        """"B into A" for each module B compared at the ONNX node of the module A before it, which the exporter folded it into."""
        return [f"{after.module} into {before.module}" for before, after in zip(self.rows, self.rows[1:]) if before.note.startswith(FUSED)]


@dataclass
class ExportCheck:
    """One exporter's export of a model against torch."""

    outputs_max_abs_diff: float
    nodes: int
    modules: int
    mapped: int
    tolerance: float
    first_diverging: ModuleError | None
    worst_module: ModuleError | None  # the largest difference
    fused: list[str]  # "B into A": modules the exporter folded into the node of the module before them (TorchComparison.fused)


@dataclass
class ExportersComparison(Verdicted):
    """compare --exporters: each exporter's export against torch, and the two exports aligned with each other."""

    profile: str
    torch: dict[str, ExportCheck]  # by exporter
    closer_to_torch: str | None  # None: both as close
    alignment: Alignment  # A: the dynamo export, B: the TorchScript one

    @property
    def verdict(self) -> str:
        """Which export is closer to torch, the modules of either over the tolerance, and where the two exports' results
        part (weights alone may differ: an exporter that folds a BatchNorm into its Conv stores other weights)."""
        return "; ".join([self._closeness(), *self._modules(), self._results()])

    def _closeness(self) -> str:
        errors = {exporter: side.outputs_max_abs_diff for exporter, side in self.torch.items()}
        closer = self.closer_to_torch
        if closer is None:
            return f"both exports are equally close to torch (outputs max_abs_diff {next(iter(errors.values())):.3g})"
        other = next(exporter for exporter in errors if exporter != closer)
        return f"closer to torch: {closer} export (outputs max_abs_diff {errors[closer]:.3g}, {other} {errors[other]:.3g})"

    def _modules(self) -> list[str]:
        return [f"the {exporter} export first exceeds the tolerance {side.tolerance:g} at {side.first_diverging.module} "
                f"({side.first_diverging.kind}, max_abs_diff {side.first_diverging.max_abs_diff:.3g})"
                for exporter, side in self.torch.items() if side.first_diverging]

    @property
    def first_different_result(self) -> AlignedRow | None:
        """The first row where the two exports compute different float values (not a weight)."""
        return next((r for r in self.alignment.rows if r.mark == "~" and r.a.kind == r.b.kind == "result" and r.a.dtype.startswith("float")), None)

    @property
    def agrees(self) -> bool:
        """No module of either export over the tolerance, and equal results wherever the two are paired."""
        return not any(side.first_diverging for side in self.torch.values()) and self.first_different_result is None

    def _results(self) -> str:
        different = [r for r in self.alignment.rows if r.mark == "~"]
        computed = self.first_different_result
        if computed is not None:
            return f"the two exports first compute a different result at row {computed.row} ({computed.a.op}, module {computed.a.module or computed.b.module or '-'})"
        if not different:
            return "the two exports agree on every paired result"
        why = "".join(f"; the {exporter} export folds {len(side.fused)} module{'s' if len(side.fused) != 1 else ''} into the one before "
                      f"({some(side.fused)})" for exporter, side in self.torch.items() if side.fused)
        return f"the two exports compute equal results on every paired row, only their weights differ ({len(different)} rows from row {different[0].row}){why}"

    def to_json(self) -> dict[str, Any]:
        return super().to_json() | {"alignment": self.alignment.to_json()}


def some(names: list[str], shown: int = 3) -> str:
    """The first `shown` names, and how many more."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


@dataclass
class Capture:
    kind: str
    calls: int
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]


def capture_modules(module: Any, feeds: dict[str, np.ndarray]) -> dict[str, Capture]:
    """Run `module` on `feeds` (in order) with a hook on every submodule; what each got and returned
    (its last call), in the order the modules first finished."""
    import torch

    captured: dict[str, Capture] = {}

    def hook(name: str):
        def record(sub, args, kwargs, output) -> None:
            calls = captured[name].calls + 1 if name in captured else 1
            # the last call is kept: a module's last node in the graph (what it maps to) is its last call's
            captured[name] = Capture(type(sub).__name__, calls, [*_tensors(args), *_tensors(kwargs)], _tensors(output))
        return record

    handles = [sub.register_forward_hook(hook(name), with_kwargs=True) for name, sub in module.named_modules() if name]
    try:
        with torch.no_grad():
            module(*(torch.from_numpy(a) for a in feeds.values()))
    except Exception as err:  # the model's own code: any exception type
        raise InputError(f"the torch model raised {type(err).__name__} on the inputs given ({first_line(err)}); give inputs of the "
                         f"shapes and dtypes its profile declares ({', '.join(f'{k} {list(a.shape)} {a.dtype}' for k, a in feeds.items())})") from err
    finally:
        for handle in handles:
            handle.remove()
    return captured


def _tensors(value: Any) -> list[np.ndarray]:
    """The tensors in an argument or output (tuples, lists, dicts and ModelOutputs flattened in order)."""
    import torch

    if isinstance(value, torch.Tensor):  # copied: the model may change it in place later (ResNet's `x += residual`)
        return [value.detach().cpu().numpy().copy()]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [a for item in value for a in _tensors(item)]
    return []


@dataclass
class OnnxScopes:
    by_module: dict[str, list[tuple[str, int]]]  # qualified module name -> (tensor, node position) of its nodes and its children's
    graph: GraphIndex

    def escaping(self, outputs: list[tuple[str, int]]) -> list[str]:
        """Of `outputs` (one module call's nodes), the tensors read outside them or returned by the graph: the call's results, in graph order."""
        inside = {position for _, position in outputs}
        ordered = sorted(set(outputs), key=lambda item: item[1])
        return [t for t, _ in ordered if t in self.graph.outputs or set(self.graph.readers.get(t, ())) - inside]


def module_scopes(onnx_path: Path) -> OnnxScopes:
    """What each module's nodes produce, and who reads each tensor."""
    import onnx

    graph = GraphIndex.of(inline_functions_proto(onnx.load(str(onnx_path), load_external_data=False)))
    by_module: dict[str, list[tuple[str, int]]] = {}
    for position, node in enumerate(graph.nodes):
        scope = node_scope(node.name, {p.key: p.value for p in node.metadata_props})
        for depth in range(1, len(scope) + 1):
            by_module.setdefault(module_name(scope[:depth]), []).extend((t, position) for t in node.output if t)
    return OnnxScopes(by_module, graph)


def compare_to_torch(profile: Profile, module: Any, onnx_path: Path, feeds: dict[str, np.ndarray],
                     workdir: Path) -> tuple[TorchComparison, dict[str, Capture]]:
    """Per torch module, the error of the ONNX tensor it maps to (`first_diverging`: the first over the
    profile's export tolerance), and what each module got and returned. `module` is the profile's torch
    model (the caller builds it: export.py calls this module, so this one never imports export.py);
    `feeds` are in the profile's input order."""
    from pipeline.diagnose.exposed import exposing_results

    captures = capture_modules(module, feeds)
    values = {name: np.asarray(value, np.float64) for name, value in exposing_results(onnx_path, workdir).run(feeds).items()}  # float tensors, as float64
    scopes = module_scopes(onnx_path)
    if not any(scopes.by_module.values()):
        raise InputError(f"{onnx_path}: no node records the torch module it came from (no `{NAME_SCOPES_KEY}` metadata and no "
                         "`/module/...` node names), so its tensors cannot be matched to torch modules; compare --torch takes any ONNX file "
                         "of this model whose nodes keep them: an export, or the optimize stage's model.opt.onnx (the precision stages' "
                         "models drop them: compare model.opt.onnx with --torch, and with the quantized model by name)")
    calls = {name: capture.calls for name, capture in captures.items()}
    rows = [_compare_module(name, capture, _last_call_outputs(name, calls, scopes.by_module), scopes, values) for name, capture in captures.items()]
    rows = _compare_folded(rows, list(captures.values()), values)
    tolerance = profile.export.tolerance
    first = next((r for r in rows if r.max_abs_diff is not None and not r.max_abs_diff <= tolerance * _magnitude(r)), None)
    return TorchComparison(str(onnx_path), profile.name, tolerance, len(rows), sum(r.tensor is not None for r in rows), first, rows), captures


def _magnitude(row: ModuleError) -> float:
    """The module's largest output magnitude where above 1, else 1: float32 rounding grows with the values, and the
    export's check scales its tolerance so (a BiT conv's outputs near 100 carry 1e-4 of rounding)."""
    return max(1.0, row.max_abs_diff / row.relative) if row.relative else 1.0


def _scaled(row: ModuleError) -> str:
    magnitude = _magnitude(row)
    return f" x {magnitude:.3g}, its largest magnitude" if magnitude > 1 else ""


def _last_call_outputs(name: str, calls: dict[str, int], scopes: dict[str, list[tuple[str, int]]]) -> list[tuple[str, int]]:
    """The ONNX outputs of a module's last call. The dynamo exporter puts every call of a module in its
    scope (the last node is the last call's). TorchScript scopes call k > 1 of `a.b` as `a.b_<k-1>` and
    that call's submodules as `a.b.c_<k-1>`: the last call is its own scope and its submodules' last calls."""
    count = calls.get(name, 1)
    if count == 1:
        return scopes.get(name, [])
    head, _, last = name.rpartition(".")
    repeated = f"{head}.{last}_{count - 1}" if head else f"{last}_{count - 1}"
    if repeated not in scopes:
        return scopes.get(name, [])
    children = [child for child in calls if child.startswith(name + ".")]
    return [*scopes[repeated], *(output for child in children for output in _last_call_outputs(child, calls, scopes))]


def _compare_module(name: str, capture: Capture, outputs: list[tuple[str, int]], scopes: OnnxScopes, values: dict[str, np.ndarray]) -> ModuleError:
    note = f"ran {capture.calls} times: the last call is compared" if capture.calls > 1 else ""
    if not capture.outputs:
        return ModuleError(name, capture.kind, None, [], None, None, "returned no tensor")
    want = capture.outputs[0]
    if not np.issubdtype(want.dtype, np.floating):
        return ModuleError(name, capture.kind, None, list(want.shape), None, None, f"returns {want.dtype}, not a float tensor")
    if not outputs:
        return ModuleError(name, capture.kind, None, list(want.shape), None, None, NO_NODE)
    # the module's results are the tensors its nodes make that others read; with k results of this shape
    # (rotary embeddings: cos, sin), the first is k-th from the end (the last call's, for a module run again)
    same_shape = sum(1 for a in capture.outputs if a.shape == want.shape)
    candidates = [t for t in scopes.escaping(outputs) if t in values and values[t].shape == want.shape]
    if len(candidates) < same_shape:
        return ModuleError(name, capture.kind, None, list(want.shape), None, None,
                           f"its ONNX nodes return {len(candidates)} tensor(s) of its output shape {list(want.shape)}, it returns {same_shape}")
    tensor = candidates[-same_shape]
    return _difference(name, capture.kind, tensor, values[tensor], want, note)


def _difference(name: str, kind: str, tensor: str, got: np.ndarray, want: np.ndarray, note: str) -> ModuleError:
    diff = float(np.max(np.abs(got - want.astype(np.float64)))) if want.size else 0.0
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    return ModuleError(name, kind, tensor, list(want.shape), diff, diff / scale if scale else None, note)


def _compare_folded(rows: list[ModuleError], captures: list[Capture], values: dict[str, np.ndarray]) -> list[ModuleError]:
    """`rows` (in `captures`' order) with each module that has no ONNX node of its own but changes what the module run
    just before it returned (a BatchNorm after its Conv) compared at that module's tensor: the exporter folded the two into
    one node (TorchScript folds Conv+BatchNorm), whose result is the pair's. The first module's own result is not in the
    model: it is marked not comparable instead of being compared with the pair's."""
    rows = list(rows)
    for k in range(len(rows) - 1):
        before, after = rows[k], rows[k + 1]
        if before.tensor is None or after.tensor is not None or after.note != NO_NODE or not _siblings(before.module, after.module) \
                or not _consumes(captures[k], captures[k + 1]):
            continue
        got, want = values[before.tensor], captures[k + 1].outputs[0]
        if got.shape != want.shape:
            continue
        rows[k + 1] = _difference(after.module, after.kind, before.tensor, got, want,
                                  f"folded by the exporter into the ONNX node of {before.module} ({before.kind}): compared at the pair's result")
        rows[k] = ModuleError(before.module, before.kind, None, before.shape, None, None,
                              f"{FUSED} ({after.module}, {after.kind}) into one ONNX node: its own result is not in the model, not comparable")
    return rows


def _siblings(a: str, b: str) -> bool:
    """Children of one module (stem.0 and stem.1, conv1 and bn1): a fold pairs neighbours, never a module and the first
    submodule of the next one (encoder.layers.0 and encoder.layers.1.attention.query, inside a function call)."""
    return a.rpartition(".")[0] == b.rpartition(".")[0]


def _consumes(before: Capture, after: Capture) -> bool:
    """`after` was given what `before` returned and returned something else (not an identity or a dropout)."""
    if not (before.outputs and after.inputs and after.outputs):
        return False
    given, returned = after.inputs[0], after.outputs[0]
    if given.shape != before.outputs[0].shape or not np.array_equal(given, before.outputs[0]):
        return False
    return given.shape != returned.shape or not np.array_equal(given, returned)


def dump_modules(captures: dict[str, Capture], folder: Path) -> list[Path]:
    """One npz per module, its last call (inputs as input_0.., outputs as output_0..; plain arrays, no pickle)."""
    from pipeline.core.fileio import atomic_path

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, capture in captures.items():
        target = folder / f"{_file_name(name)}.npz"
        arrays = {f"input_{i}": a for i, a in enumerate(capture.inputs)} | {f"output_{i}": a for i, a in enumerate(capture.outputs)}
        with atomic_path(target) as tmp, open(tmp, "wb") as handle:
            np.savez(handle, **arrays)
        written.append(target)
    return written


def _file_name(module: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", module)
