"""Export stage: PyTorch model -> ONNX, verified against torch on onnxruntime CPU, output by output (flattened with stable
names by `flatten_outputs`, the ONNX graph's output names with either exporter). torch is imported at call time.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import logging
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import InputError, PipelineError, StageFailed, first_line
from pipeline.core.onnxfile import atomic_onnx, save_onnx
from pipeline.core.profiles import Profile
from pipeline.core.quiet import captured
from pipeline.core.samples import check_sizes
from pipeline.core.verify import OnnxSession, run_failure
from pipeline.export_failures import exporter_failure
from pipeline.export_generation import Case, Status, TorchGeneration, decoder_part_generation, follow_on_onnxruntime, torch_generation
from pipeline.fixed_dims import DimFixed, check_dims, dim_the_graph_fixed, fixed_at_run, shape_guards
from pipeline.models.decoder import derived_inputs
from pipeline.models.module import build_module, flatten_outputs, run_module
from pipeline.near_ties import untied_run


@dataclass(frozen=True)
class ExportResult:
    exporter: str
    opset: int
    nodes: int
    max_abs_diff: float
    checked_shapes: list[dict[str, list[int]]]
    outputs: list[str]
    derived: dict[str, Any] | None = None  # inputs and dims added for a decoder's cache (pipeline/models/decoder.py)
    generation: dict[str, Any] | None = None  # a decoder's greedy generation on onnxruntime vs torch (pipeline/core/generation.py)


def export_model(profile: Profile, output: Path, exporter: str | None = None, status: Status = lambda _: None,
                 functions: list[str] | None = None, generation_reference: Path | None = None) -> ExportResult:
    """Export the profile's model to `output` and check it (and a decoder's generation, torch's saved to `generation_reference`)
    against torch. `functions`: module classes exported as ONNX local functions (TorchScript exporter)."""
    exporter = exporter or profile.export.exporter
    if functions and exporter != "torchscript":
        raise InputError("--functions needs --exporter torchscript: torch's dynamo exporter does not export modules as ONNX functions")
    status("building the PyTorch model")
    given = profile
    module, example, dynamic_shapes, profile = build_module(profile)
    function_classes = _function_classes(module, functions or [])
    status(f"exporting with the {exporter} exporter (opset {profile.export.opset})")
    with atomic_onnx(output) as tmp:
        nodes = _write_onnx(tmp, module, example, dynamic_shapes, profile, exporter, function_classes)
        torch_side = TorchSide(module, given)
        del module
        status("running torch at the check sizes")
        cases = _torch_cases(profile, torch_side.module)
        reference = torch_generation(profile, torch_side.module, tmp, cases, status)
        if profile.export.part != "decoder":  # an encoder-decoder's decoder part runs torch and onnxruntime step by step
            torch_side.release()
        status("verifying against torch on onnxruntime (CPU)")
        # one session for the file, the verification's and the generation check's; the graph as written: onnxruntime's
        # basic level folds a Pad(0) into the MaxPool after it, whose padding is -inf (BiT's stem: 3e-3 off torch)
        try:
            session = OnnxSession(tmp, as_written=True)
        except InputError as failed:  # the exporter's file, not the user's
            raise StageFailed(f"export: the {exporter} exporter wrote a graph onnxruntime cannot load ({first_line(failed.__cause__).replace(str(tmp), output.name)}); "
                              "try the other exporter (--exporter)") from None
        try:
            result = _verify(profile, cases, torch_side, tmp, exporter, session, nodes)
        except StageFailed as failed:
            raise _draws_random(tmp, torch_side.name) or failed from None
        if profile.export.part == "decoder":
            generation = decoder_part_generation(given, profile, torch_side.module, session, generation_reference, status)
        elif isinstance(reference, TorchGeneration):
            generation = follow_on_onnxruntime(profile, reference, session, generation_reference, status)
        else:
            generation = reference  # None (no generation to check), or why it is skipped
    return replace(result, derived=derived_inputs(given, profile), generation=generation)


class TorchSide:
    """The torch module of an export, let go once torch's outputs and generation are computed: onnxruntime then loads the
    file without the module beside it (both at once held the weights twice, the export's peak: issue 33). A failed check
    that needs it again (which module the difference starts in) builds it again."""

    def __init__(self, module: Any, profile: Profile):
        self._module, self.profile, self.name, self.rebuilt = module, profile, type(module).__name__, False

    @property
    def module(self) -> Any:
        if self._module is None:
            self._module, self.rebuilt = build_module(self.profile)[0], True
        return self._module

    def release(self) -> None:
        self._module = None
        gc.collect()  # the module and the exporter's graphs are reference cycles


RANDOM_OPS = ("RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike", "Multinomial", "Bernoulli")


def _draws_random(path: Path, model_class: str) -> InputError | None:
    """Why a file cannot match torch when its graph draws random numbers (ViTMAE's forward draws its patch mask):
    each run differs, whatever the exporter; None for a graph without such a node."""
    from pipeline.core.onnxfile import load_onnx

    node = next((n for n in load_onnx(path).graph.node if n.op_type in RANDOM_OPS), None)
    if node is None:
        return None
    return InputError(f"export: {model_class}'s forward draws random numbers ({node.op_type} node {node.name!r}), so its outputs "
                      "differ on every run and no export of it can be checked against torch or calibrated; make the forward "
                      "deterministic for deployment (pass the randomness as an input where the model takes one, e.g. ViTMAE's noise)")


def export_unchecked(profile: Profile, output: Path, exporter: str) -> None:
    """The profile's model exported as export_model does, unchecked (init's trial of an exporter); a dim the graph runs at
    its opt size only is refused as DimFixed, so that init writes it static."""
    module, example, dynamic_shapes, profile = build_module(profile)
    with atomic_onnx(output) as tmp:
        _write_onnx(tmp, module, example, dynamic_shapes, profile, exporter, set())
        fixed = fixed_at_run(profile, OnnxSession(tmp, as_written=True), type(module).__name__)
        if fixed is not None:
            raise fixed


def _write_onnx(tmp: Path, module: Any, example: tuple, dynamic_shapes: Any, profile: Profile, exporter: str, function_classes: set[type]) -> int:
    """Run the exporter on the module, the file written to `tmp`; return its node count. A failure is one line
    (pipeline/export_failures.py), a dim the dynamo exporter fixed is refused (pipeline/fixed_dims.py). The dynamo
    exporter's graph is written a weight at a time (pipeline/core/irwriter.py): its own `save` serializes every weight
    twice over while the module holds them too."""
    import onnx
    import torch

    from pipeline.core.irwriter import write_model
    from pipeline.export_translations import custom_translations

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # e.g. "torchvision is not installed"
    input_names = [spec.name for spec in profile.inputs]
    # one run on the example inputs: a model that does not run on its profile's inputs is the user's to fix (exit 2)
    output_names = [name for name, _ in flatten_outputs(run_module(module, example, profile), profile)]
    shapes = _varargs_shapes(dynamic_shapes or _dynamo_shapes(profile), module) if exporter == "dynamo" else None
    try:  # the torchscript exporter prints its IR on failure: keep it out of the one-line error
        with warnings.catch_warnings(), captured(), _flat_forward(module, profile):
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                with shape_guards() as guards:
                    program = torch.onnx.export(
                        module, example, dynamo=True, opset_version=profile.export.opset,
                        input_names=input_names, output_names=output_names, dynamic_shapes=shapes,
                        optimize=False, verbose=False,  # our optimize stage does this, exactly (see issue 3)
                        custom_translation_table=custom_translations(),
                    )
                check_dims(profile, list(program.model.graph.inputs), guards, type(module).__name__)
                write_model(program.model, tmp)
                return len(program.model.graph)
            else:
                # torch always enables its ONNX log (it tests the function object, not its result),
                # which prints the whole IR to stdout on failure: send it to the captured stderr
                getattr(torch._C, "_jit_set_onnx_log_output_stream", lambda _: None)("stderr")
                try:
                    torch.onnx.export(
                        module, example, str(tmp), dynamo=False, opset_version=profile.export.opset,
                        input_names=input_names, output_names=output_names, dynamic_axes=_torchscript_axes(profile) or None, verbose=False,
                        export_modules_as_functions=function_classes or False,
                    )
                finally:  # torch leaves its log on, and the module hooks of --functions then log on every later forward
                    torch._C._jit_set_onnx_log_enabled(False)
                if function_classes:
                    _stamp_function_calls(tmp, module, example, function_classes)
                return len(onnx.load(str(tmp), load_external_data=False).graph.node)
    except DimFixed:
        raise
    except Exception as err:
        raise exporter_failure(err, module, example, exporter, profile) from err


def _function_classes(module: Any, names: list[str]) -> set[type]:
    """The submodule classes named in `names` (an unknown name is an error listing the model's classes)."""
    classes = {type(sub).__name__: type(sub) for _, sub in module.named_modules()}
    unknown = [name for name in names if name not in classes]
    if unknown:
        raise InputError(f"--functions {','.join(unknown)}: no submodule of that class; the model's classes are {', '.join(sorted(classes))}")
    return {classes[name] for name in names}


def _stamp_function_calls(onnx_path: Path, module: Any, example: tuple, classes: set[type]) -> None:
    """Give each function call node the module path of the instance it stands for (as the dynamo
    exporter's `name_scopes` metadata), so the module survives inlining: TorchScript names a call
    after its last operator's scope and the function body's nodes carry no scope at all."""
    import onnx
    import torch

    from pipeline.core.scopes import NAME_SCOPES_KEY

    ran: list[str] = []
    handles = [sub.register_forward_pre_hook(lambda _, __, name=name: ran.append(name)) for name, sub in module.named_modules() if type(sub) in classes]
    try:
        with torch.no_grad():
            module(*example)
    finally:
        for handle in handles:
            handle.remove()
    model = onnx.load(str(onnx_path))
    function_names = {f.name for f in model.functions}
    calls = [node for node in model.graph.node if node.op_type in function_names]
    if len(calls) != len(ran):
        return  # a module called in a way tracing flattened: leave the calls as TorchScript named them
    for node, name in zip(calls, ran):
        parts = name.split(".")
        scopes = ["", *(".".join(parts[: i + 1]) for i in range(len(parts))), node.op_type]
        node.metadata_props.add(key=NAME_SCOPES_KEY, value=repr(scopes))
    save_onnx(model, onnx_path)


@contextlib.contextmanager
def _flat_forward(module: Any, profile: Profile) -> Iterator[None]:
    """While exporting, `module.forward` returns the tuple of its flattened outputs, which the
    exporters can name. The module itself stays the root, so node names and scopes do not change."""
    forward, own = module.forward, module.__dict__.get("forward")

    def flat(*inputs):
        return tuple(tensor for _, tensor in flatten_outputs(forward(*inputs), profile))

    module.forward = flat
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


def _dynamo_shapes(profile: Profile) -> tuple[dict[int, Any], ...] | None:
    """Per input, in order (the forward's argument names need not match the profile's input names)."""
    import torch

    dims = {name: torch.export.Dim(name, min=d.min, max=d.max) for name, d in profile.dims.items() if d.min != d.max}
    shapes = tuple(
        {axis: dims[size] if size in dims else torch.export.Dim.AUTO  # a sum (past_seq+seq): torch.export derives it
         for axis, size in enumerate(spec.shape) if isinstance(size, str) and (size in dims or "+" in size)}
        for spec in profile.inputs
    )
    return shapes if any(shapes) else None


def _varargs_shapes(shapes: Any, module: Any) -> tuple | None:
    """Per-input dynamic shapes (a tuple, or a dict by the module's forward argument names) for the
    `forward(*inputs)` that `_flat_forward` installs: one tuple holding them in order."""

    if shapes is None:
        return None
    if isinstance(shapes, Mapping):
        shapes = tuple(shapes.get(name) for name in inspect.signature(module.forward).parameters)
    return (tuple(shapes),)


def _torchscript_axes(profile: Profile) -> dict[str, dict[int, str]]:
    from pipeline.core.profiles import dim_terms

    dynamic = {name for name, d in profile.dims.items() if d.min != d.max}
    axes = {spec.name: {i: s for i, s in enumerate(spec.shape) if isinstance(s, str) and set(dim_terms(s)) & dynamic} for spec in profile.inputs}
    return {name: a for name, a in axes.items() if a}


def _torch_cases(profile: Profile, module: Any) -> list[Case]:
    """torch's outputs on random valid inputs at the profile's check sizes."""
    from pipeline.models.decoder import prefill_sizes

    cases = []
    for i, sizes in enumerate(check_sizes(profile) + prefill_sizes(profile)):
        feeds, output = untied_run(profile, module, sizes, seed=1000 + i)
        cases.append((sizes, feeds, {name: t.numpy() for name, t in flatten_outputs(output, profile)}))
    return cases


def _verify(profile: Profile, cases: list[Case], torch_side: TorchSide, onnx_path: Path, exporter: str, session: OnnxSession, nodes: int) -> ExportResult:
    """Compare torch's outputs with onnxruntime's, output by output (by name)."""
    worst, checked = 0.0, []
    for i, (sizes, feeds, expected) in enumerate(cases):
        try:
            actual = session.run_named(feeds)
        except StageFailed as failed:
            fixed = i and dim_the_graph_fixed(profile, session, sizes, torch_side.name)
            raise fixed or StageFailed(f"export: the {exporter} exporter's graph does not run on onnxruntime at input shapes {_shapes(feeds)} "
                                       f"({run_failure(failed.__cause__)}); try the other exporter (--exporter)") from None
        if list(actual) != list(expected):
            raise StageFailed(f"export: the ONNX outputs {list(actual)} are not torch's {list(expected)} (input shapes {_shapes(feeds)}); "
                              "report this with the model")
        for name, want in expected.items():
            got = actual[name]
            if got.shape != want.shape:
                raise StageFailed(f"export: output {name!r} has shape {list(got.shape)} on onnxruntime, {list(want.shape)} in torch "
                                  f"(input shapes {_shapes(feeds)}); a dim was fixed at export: check [dims] and try the other exporter (--exporter)")
            diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if want.size else 0.0
            worst = max(worst, diff)
            # float32 rounding grows with the values: above 1 the tolerance is relative to the output's largest magnitude
            scale = max(1.0, float(np.max(np.abs(want)))) if want.size and np.issubdtype(want.dtype, np.floating) else 1.0
            if not np.isfinite(diff) or diff > profile.export.tolerance * scale:
                scaled = f" x {scale:.3g}, the output's largest magnitude" if scale > 1 else ""
                raise StageFailed(
                    f"export: onnxruntime differs from torch by max_abs_diff={diff:.3g} > tolerance {profile.export.tolerance:g}{scaled} "
                    f"({exporter} exporter, opset {profile.export.opset}, input shapes {_shapes(feeds)}, output {name!r}); "
                    f"{_first_diverging(profile, torch_side, onnx_path, feeds, expected)}; try the other exporter (--exporter) or another opset"
                )
        checked.append(_shapes(feeds))
    return ExportResult(exporter, profile.export.opset, nodes, worst, checked, list(cases[-1][2]))


def _first_diverging(profile: Profile, torch_side: TorchSide, onnx_path: Path, feeds: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> str:
    """Which torch module the difference starts in (pipeline/diagnose/divergence.py), for the failure line; the module built
    again where it was let go, and compared only if it gives the outputs the first build gave."""
    import tempfile

    from pipeline.diagnose.divergence import compare_to_torch

    try:
        module = torch_side.module
        if torch_side.rebuilt and not _same_outputs(profile, module, feeds, expected):
            return "modules not compared (the model built again gives other outputs than the one exported: its factory is not deterministic)"
        with tempfile.TemporaryDirectory() as workdir:
            result, _ = compare_to_torch(profile, module, onnx_path, feeds, Path(workdir))
    except PipelineError as err:
        return f"modules not compared ({err})"
    return result.verdict + ("; see `python -m pipeline compare --torch`" if result.first_diverging else "")


def _same_outputs(profile: Profile, module: Any, feeds: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> bool:
    import torch

    inputs = tuple(torch.from_numpy(np.ascontiguousarray(feeds[spec.name])) for spec in profile.inputs)
    again = {name: t.numpy() for name, t in flatten_outputs(run_module(module, inputs, profile), profile)}
    return list(again) == list(expected) and all(np.array_equal(again[name], want, equal_nan=True) for name, want in expected.items())


def _shapes(feeds: dict[str, np.ndarray]) -> dict[str, list[int]]:
    return {name: list(a.shape) for name, a in feeds.items()}
