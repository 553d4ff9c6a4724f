"""The torch module a profile describes (from its factory or a Hugging Face model, in eval mode, seeded) with example
inputs, and its outputs flattened into named tensors in a fixed order. torch is imported at call time."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from pipeline.core.errors import InputError, PipelineError, ProfileError, first_line
from pipeline.core.modelsource import find_spec, importable_from
from pipeline.core.profiles import Profile
from pipeline.core.samples import make_inputs


def build_module(profile: Profile) -> tuple[Any, tuple, Any, Profile]:
    """The profile's torch model, its example inputs, dynamic shapes (or None) and the profile its export uses: a
    pretrained model's forward bound to the inputs by name, a decoder's cache inputs added (pipeline/models/decoder.py)."""
    from pipeline.core.generation import prompts
    from pipeline.models.decoder import generates, is_pretrained, prepare
    from pipeline.models.seq2seq import prepare_part

    module, example, dynamic_shapes = _build_hf(profile) if profile.model.is_hf else _build_model(profile)
    if profile.export.part is not None:  # one part of an encoder-decoder (pipeline/models/seq2seq.py)
        module, profile = prepare_part(module, profile)
    elif example is None and is_pretrained(module):
        module, profile = prepare(module, profile)
        if generates(module):
            prompts(profile)  # the generation check fits the profile's dims: said before the export, not after
    return module, example if example is not None else default_example(profile), dynamic_shapes, profile


def _build_model(profile: Profile) -> tuple[Any, tuple, Any]:
    """Call the factory: it returns a module, or (module, example_inputs[, dynamic_shapes])."""
    import torch

    module_name, function_name = profile.model.factory.split(":")
    where = f"{profile.source}: model.factory {profile.model.factory!r}"
    with importable_from(profile.folder):
        if find_spec(module_name, profile) is None:
            raise ProfileError(f"{where}: module {module_name!r} is not importable from {profile.folder} "
                               "or the installed packages; install it or fix the name")
        try:
            factory = getattr(importlib.import_module(module_name), function_name, None)
        except SyntaxError as err:
            raise ProfileError(f"{where}: {err.filename}:{err.lineno}: syntax error ({err.msg}); fix the module") from err
        except Exception as err:  # the module's own top-level code failed
            raise ProfileError(f"{where}: importing {module_name} raised {type(err).__name__}: {first_line(err)}; fix the module (--debug shows the traceback)") from err
    if not callable(factory):
        raise ProfileError(f"{where}: {module_name} has no function {function_name!r}")
    try:
        inspect.signature(factory).bind(**profile.model.kwargs)
    except TypeError as err:
        raise ProfileError(f"{profile.source}: model.kwargs {sorted(profile.model.kwargs)} do not fit {function_name}{_signature(factory)}: {err}") from err
    torch.manual_seed(profile.model.seed)
    try:
        made = factory(**profile.model.kwargs)
    except Exception as err:  # the user's code: any exception is theirs to fix, told in one line
        raise ProfileError(f"{where} raised {type(err).__name__}: {first_line(err)}; fix the factory (--debug shows the traceback)") from err
    if isinstance(made, torch.nn.Module):
        made = (made,)
    if not (isinstance(made, (tuple, list)) and 1 <= len(made) <= 3 and isinstance(made[0], torch.nn.Module)):
        raise ProfileError(
            f"{profile.source}: {profile.model.factory} returned {type(made).__name__}, "
            "expected a torch.nn.Module or (module, example_inputs[, dynamic_shapes])"
        )
    module, example, dynamic_shapes = (*made, None, None)[:3]
    if example is not None and len(example) != len(profile.inputs):
        raise ProfileError(f"{profile.source}: {profile.model.factory} gives {len(example)} example inputs, the profile declares {len(profile.inputs)}")
    return module.eval(), tuple(example) if example is not None else None, dynamic_shapes


def _build_hf(profile: Profile) -> tuple[Any, None, None]:
    """The profile's Hugging Face model (hf / hf_config, task), seeded; example inputs come from the profile."""
    import torch

    from pipeline.models.hf import load_hf_model

    torch.manual_seed(profile.model.seed)
    return load_hf_model(profile), None, None


def default_example(profile: Profile) -> tuple:
    import torch

    return tuple(torch.from_numpy(a) for a in make_inputs(profile, seed=profile.model.seed, dims=export_sizes(profile)).values())


def run_module(module: Any, inputs: tuple, profile: Profile) -> Any:
    """The model's output on `inputs`, without gradients; any exception its forward raises is the user's to fix, said in
    one line naming the model's class and the input shapes (a ProfileError: exit 2)."""
    import torch

    try:
        with torch.no_grad():
            return module(*inputs)
    except PipelineError:
        raise
    except Exception as err:
        model = type(module)
        given = ", ".join(f"{spec.name} {list(getattr(t, 'shape', []))}" for spec, t in zip(profile.inputs, inputs))
        raise ProfileError(f"{profile.source}: inputs: {model.__module__}.{model.__qualname__} does not run on the profile's inputs {given} "
                           f"({type(err).__name__}: {first_line(err)}); give [[inputs]] the names and shapes its forward takes, "
                           "or fix its forward (--debug shows the traceback)") from err


def flatten_outputs(output: Any, profile: Profile, prefix: str = "") -> list[tuple[str, Any]]:
    """A model's outputs as (name, tensor) pairs in a fixed order: "output", a dict's keys, output_0, ..., nested names
    joined with "_", a KV cache's present.{i}.key/value. A number beside tensors is skipped (MaskFormer-Swin's spatial
    dims), and a tensor returned twice is one output under its first name, as the exporter writes it once (FLAVA)."""
    flat, seen = [], set()
    for name, tensor in _tensors(output, profile, prefix):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            flat.append((name, tensor))
    if not flat:
        raise InputError(f"{profile.source}: the model returned no tensor ({type(output).__name__} with nothing in it)")
    return flat


def _tensors(output: Any, profile: Profile, prefix: str) -> list[tuple[str, Any]]:
    import torch

    if isinstance(output, torch.Tensor):
        return [(prefix or "output", output)]
    if _is_cache(output):  # a transformers Cache: one key and one value tensor per layer, named as Optimum does
        return [(f"present.{i}.{kind}", getattr(layer, f"{kind}s")) for i, layer in enumerate(output.layers) for kind in ("key", "value")]
    if isinstance(output, Mapping):
        items = [(str(k), v) for k, v in output.items() if v is not None]
    elif isinstance(output, (tuple, list)):
        items = [(f"output_{i}" if not prefix else str(i), v) for i, v in enumerate(output) if v is not None]
    elif isinstance(output, int | float) and prefix:
        return []
    else:
        raise InputError(f"{profile.source}: the model's output {prefix or 'value'!r} is a {type(output).__name__}, not a tensor; "
                         "return tensors (or a KV cache, ModelOutput, dict, tuple or list of them)")
    return [pair for key, value in items for pair in _tensors(value, profile, f"{prefix}_{key}" if prefix else key)]


def _is_cache(output: Any) -> bool:
    """A transformers KV cache whose layers each hold one key and one value tensor."""
    import torch

    layers = getattr(output, "layers", None)
    return (isinstance(layers, list) and bool(layers) and type(output).__module__.startswith("transformers")
            and all(isinstance(getattr(layer, "keys", None), torch.Tensor) and isinstance(getattr(layer, "values", None), torch.Tensor)
                    for layer in layers))


def export_sizes(profile: Profile) -> dict[str, int]:
    """Sizes to trace with: opt, but never 1 for a dynamic dim (torch.export would specialize it)."""
    return {name: d.opt if d.min == d.max or d.opt > 1 else min(2, d.max) for name, d in profile.dims.items()}


def _signature(function) -> str:
    try:
        return str(inspect.signature(function))
    except (TypeError, ValueError):
        return "(...)"
