"""Decoders with a KV cache (GPT-2, Llama, Qwen2, ...): how a Hugging Face `PreTrainedModel` is called at export, as
`[export] cache` says. "with-past" (the default for a model that returns a cache): one graph for prefill and decode, laid
out as Optimum's `text-generation-with-past` (inputs `input_ids`, `attention_mask` of past + new tokens, `position_ids`,
`past_key_values.{i}.key/value` [batch, kv_heads, past_seq, head_dim]; outputs the model's own, then `present.{i}.key/value`),
the cache inputs derived from the cache the model returns where the profile does not list them. "none": `use_cache=False`.
torch and transformers are imported at call time only.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from pipeline.core.errors import InputError, ProfileError
from pipeline.core.generation import PAST_INPUT
from pipeline.core.profiles import Profile

PAST_DIM = "past_seq"
MASK_SHAPE = ["batch", f"{PAST_DIM}+seq"]


@dataclass(frozen=True)
class CacheLayer:
    """One layer of a decoder's KV cache as its prefill returned it: keys [batch, key_heads, tokens, key_dim], values alike."""

    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int
    dtype: str
    sliding_window: int | None  # a sliding-window layer's window: exported with a full-length cache, the mask applies the window


def prepare(model: Any, profile: Profile) -> tuple[Any, Profile]:
    """The model in eval mode, its forward taking the profile's inputs in order (see `bind_forward`),
    and the profile its export uses: with the cache inputs when the cache is exported."""
    mode = cache_mode(profile, model)
    if mode == "with-past":
        profile = with_past_profile(profile, model)
    return bind_forward(model.eval(), profile, mode), profile


def generates(module: Any) -> bool:
    """A Hugging Face decoder-only model (one that returns a KV cache), with or without its cache exported."""
    return is_pretrained(module) and not getattr(module.config, "is_encoder_decoder", False) and returns_cache(module)


def is_pretrained(module: Any) -> bool:
    """A transformers PreTrainedModel (without importing transformers when it was never imported)."""
    import sys

    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(module, transformers.PreTrainedModel)


def returns_cache(model: Any) -> bool:
    """The model's forward returns a KV cache when called as it is configured (see `_prefill_cache`)."""
    return bool(getattr(_prefill_cache(model), "layers", None))


def _prefill_cache(model: Any) -> Any:
    """The cache the model returns from a prefill of two tokens with its cache on, or None (BertModel
    takes past_key_values but returns a cache only when configured as a decoder). Works on the meta device."""
    import torch

    accepted = inspect.signature(type(model).forward).parameters
    if not ("past_key_values" in accepted and "input_ids" in accepted and getattr(model.config, "use_cache", False)):
        return None
    try:
        with torch.no_grad():
            ids = torch.zeros((1, 2), dtype=torch.long, device=next(model.parameters()).device)  # the meta device at init
            output = type(model).forward(model, input_ids=ids, use_cache=True, return_dict=True)
    except Exception:  # a model that needs more than token ids to run: its export says what is wrong
        return None
    return output.get("past_key_values") if hasattr(output, "get") else None


def cache_layout(model: Any, cache: Any = None) -> list[CacheLayer]:
    """The model's KV cache layer by layer, read from the cache its prefill returns (or `cache`): what the model computes,
    not what its config suggests (a multi-query Falcon has one KV head where its config says 4)."""
    name = type(model).__name__
    layers = getattr(_prefill_cache(model) if cache is None else cache, "layers", None) or []
    for index, layer in enumerate(layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if getattr(keys, "ndim", 0) != 4 or getattr(values, "ndim", 0) != 4:
            kind = ("a layer that reuses an earlier layer's cache (KV sharing), which the with-past export does not take yet"
                    if type(layer).__name__ == "DummyLayer" else "a state-space or linear-attention layer?")
            raise ProfileError(f"{name}: layer {index} of its cache is a {type(layer).__name__} without key and value tensors "
                               f'[batch, heads, tokens, head_dim] ({kind}); set [export] cache = "none"')
    layout = [CacheLayer(layer.keys.shape[1], layer.keys.shape[3], layer.values.shape[1], layer.values.shape[3],
                         str(layer.keys.dtype).removeprefix("torch."), getattr(layer, "sliding_window", None) if getattr(layer, "is_sliding", False) else None)
              for layer in layers]
    unfit = next((layer.dtype for layer in layout if layer.dtype not in ("float32", "float16")), None)
    if unfit:
        raise ProfileError(f"{name}: its cache is {unfit}, which a profile input cannot be; load the model in float32")
    return layout


def cache_mode(profile: Profile, model: Any) -> str:
    """"with-past" or "none" for this profile and model (an encoder: "none"). Refuses what cannot be exported."""
    config, where = model.config, f"{profile.source}: export.cache"
    asked = profile.export.cache
    if asked == "none":
        return "none"
    if getattr(config, "is_encoder_decoder", False):
        if asked == "with-past":
            raise ProfileError(f"{where}: {type(model).__name__} is an encoder-decoder; one graph with past is not supported "
                               'for it: set cache = "none" (the whole model, no cache) or export its encoder and decoder as two profiles')
        return "none"
    if not returns_cache(model):
        if asked == "with-past":
            raise ProfileError(f"{where}: {type(model).__name__} takes no KV cache (no past_key_values, or use_cache off in its config); "
                               'remove cache = "with-past"')
        return "none"
    return "with-past"


def max_positions(config: Any) -> int | None:
    """The config's position limit; None where it has none (xlnet's max_position_embeddings reads -1: no limit)."""
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return limit if isinstance(limit, int) and limit > 0 else None


def with_past_profile(profile: Profile, model: Any) -> Profile:
    """The profile with the cache inputs its with-past export takes: its own, else one key and one value per layer of the
    cache the model returns (`cache_layout`), with the arguments its forward takes and `past_seq` from `past_range`."""
    names = [spec.name for spec in profile.inputs]
    if any(PAST_INPUT.fullmatch(n) for n in names):
        return profile
    if "seq" not in profile.dims or "batch" not in profile.dims:
        raise ProfileError(f"{profile.source}: dims: the with-past export of a decoder needs dims named batch and seq (new tokens); "
                           'rename yours, or set [export] cache = "none"')
    config, layout = model.config, cache_layout(model)
    past = past_range(profile, max_positions(config))
    by_name = {spec.name: spec.model_dump() for spec in profile.inputs}
    inputs = [by_name.get("input_ids", {"name": "input_ids", "dtype": "int64", "shape": ["batch", "seq"], "range": [0, config.vocab_size]})]
    inputs.append({"name": "attention_mask", "dtype": by_name.get("attention_mask", {}).get("dtype", "int64"), "shape": MASK_SHAPE, "fill": "mask"})
    if "position_ids" in inspect.signature(model.forward).parameters:
        inputs.append({"name": "position_ids", "dtype": "int64", "shape": ["batch", "seq"], "fill": "positions"})
    inputs += [spec for name, spec in by_name.items() if name not in ("input_ids", "attention_mask", "position_ids")]
    for i, layer in enumerate(layout):
        inputs += [{"name": f"past_key_values.{i}.key", "dtype": layer.dtype, "shape": ["batch", layer.key_heads, PAST_DIM, layer.key_dim]},
                   {"name": f"past_key_values.{i}.value", "dtype": layer.dtype, "shape": ["batch", layer.value_heads, PAST_DIM, layer.value_dim]}]
    data = {**profile.model_dump(), "inputs": inputs, "dims": {**profile.model_dump()["dims"], PAST_DIM: past}, "source": profile.source}
    return Profile.model_validate(data)


def past_range(profile: Profile, positions: int | None) -> dict[str, int]:
    """The cache lengths the export is built for: the profile's `[dims.past_seq]`, else 0 (prefill) to the profile's
    seq max (a prompt of seq.max tokens and as many generated), within the model's positions: TensorRT's optimization
    profile reserves memory for its max, so a 32k cache nobody asked for is not the default."""
    seq, asked = profile.dims["seq"], profile.dims.get(PAST_DIM)
    room = positions - seq.max if positions else None
    where = f"{profile.source}: dims.{PAST_DIM}.max"
    if room is not None and room < 1:
        raise ProfileError(f"{profile.source}: dims.seq.max = {seq.max} leaves no room for a KV cache within the model's {positions} positions; "
                           "lower dims.seq.max")
    if asked is not None:
        if room is not None and asked.max > room:
            raise ProfileError(f"{where} = {asked.max}: the model takes {positions} positions, {room} of them beside dims.seq.max = {seq.max}; "
                               f"set it to {room} or less")
        return {"min": asked.min, "opt": asked.opt, "max": asked.max}
    longest = seq.max if room is None else min(seq.max, room)
    return {"min": 0, "opt": min(seq.opt, longest), "max": longest}


def prefill_sizes(profile: Profile) -> list[dict[str, int]]:
    """Sizes of the prefill call (an empty cache, past_seq = 0) for a profile with a cache, else none."""
    if PAST_DIM not in profile.dims or profile.dims[PAST_DIM].min > 0:
        return []
    return [{**{name: d.opt for name, d in profile.dims.items()}, PAST_DIM: 0}]


def autocast_feeds(profile: Profile) -> dict[str, Any] | None:
    """Inputs for AutoCast's FP32 reference run on a model with a cache (its random ones cannot
    match the mask to past_seq + seq), at opt; or at the profile's min sizes where a dim's min is above 1 (AutoCast
    gives each dynamic dim 1: wav2vec2's convolution failed on one sample); else None (AutoCast's own)."""
    from pipeline.core.samples import make_inputs

    if PAST_DIM in profile.dims:
        return make_inputs(profile, seed=5100)
    if any(d.min > 1 for d in profile.dims.values()):
        return make_inputs(profile, seed=5100, dims={name: d.min for name, d in profile.dims.items()})
    return None


def derived_note(metrics: dict[str, Any]) -> str:
    """The export's key-metric suffix saying what was derived for a decoder's cache, else ""."""
    derived = metrics.get("derived_inputs")
    if not derived:
        return ""
    past = derived["dims"][PAST_DIM]
    caches = sum(1 for spec in derived["inputs"] if spec["name"].startswith("past_key_values."))  # an encoder-decoder's cross caches too
    return f", cache derived: {caches} past_key_values inputs, {PAST_DIM} {past['min']}..{past['max']}"


def derived_inputs(before: Profile, after: Profile) -> dict[str, Any] | None:
    """What `with_past_profile` added, for the manifest (None when nothing was derived)."""
    if before.inputs == after.inputs:
        return None
    return {"inputs": [s.model_dump() for s in after.inputs], "dims": {k: v.model_dump() for k, v in after.dims.items()}}


def apply_derived(profile: Profile, derived: dict[str, Any] | None) -> Profile:
    """The profile later stages use: `profile` with the inputs and dims the export derived (see `derived_inputs`)."""
    if not derived:
        return profile
    return Profile.model_validate({**profile.model_dump(), **derived, "source": profile.source})


def bind_forward(model: Any, profile: Profile, mode: str) -> Any:
    """Replace the model's forward (on the instance: node names keep its scopes) by one taking the profile's inputs in order,
    the cache inputs as a DynamicCache, the returned cache as `present.{i}.key/value` tensors."""
    names = [spec.name for spec in profile.inputs]
    accepted = inspect.signature(model.forward).parameters
    past = [n for n in names if PAST_INPUT.fullmatch(n)]
    unknown = [n for n in names if n not in accepted and n not in past]
    if unknown:
        offered = [a for a in ("input_ids", "attention_mask", "token_type_ids", "position_ids", "pixel_values", "inputs_embeds") if a in accepted]
        raise ProfileError(f"{profile.source}: inputs: {type(model).__name__}.forward has no argument {unknown[0]!r}; "
                           f"name the [[inputs]] after its arguments: {', '.join(offered)}")
    if past and mode != "with-past":
        raise ProfileError(f"{profile.source}: inputs: {past[0]!r} is a cache input but the export runs without a cache; "
                           'remove the past_key_values.* inputs or set [export] cache = "with-past"')
    layers = len(cache_layout(model)) if mode == "with-past" else 0
    if mode == "with-past" and sorted(past) != sorted(f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")):
        raise ProfileError(f"{profile.source}: inputs: the cache inputs must be past_key_values.{{i}}.key and .value for i in 0..{layers - 1} "
                           f"({type(model).__name__} has {layers} layers); remove them to have them derived")
    extra = {k: v for k, v in (("use_cache", mode == "with-past"), ("return_dict", True)) if k in accepted}
    keyword_forward = model.forward

    def forward(*inputs):
        named = dict(zip(names, inputs, strict=True))
        if mode == "with-past":
            from transformers import DynamicCache

            # full-length layers, sliding-window ones too (the mask applies the window): a sliding layer of the config's own
            # cache keeps its last window - 1 tokens, which torch.export traces only by specializing past_seq
            pairs = [(named.pop(f"past_key_values.{i}.key"), named.pop(f"past_key_values.{i}.value")) for i in range(layers)]
            named["past_key_values"] = DynamicCache(ddp_cache_data=pairs)
        output = keyword_forward(**named, **extra)
        return _with_present(output, layers, profile) if mode == "with-past" else output

    model.forward = forward
    return model


def _with_present(output: Any, layers: int, profile: Profile) -> dict[str, Any]:
    """The model's outputs in order, its cache replaced by present.{i}.key/value."""
    flat: dict[str, Any] = {}
    for key, value in output.items():
        if key != "past_key_values":
            flat[key] = value
            continue
        cache_layers = getattr(value, "layers", None)
        if cache_layers is None or len(cache_layers) != layers or not all(hasattr(c, "keys") and hasattr(c, "values") for c in cache_layers):
            raise InputError(f"{profile.source}: the model returned a {type(value).__name__} whose layout is not one key and one value "
                             f'tensor per layer ({layers} layers); set [export] cache = "none" to export it without its cache')
        for i, layer in enumerate(cache_layers):
            flat[f"present.{i}.key"], flat[f"present.{i}.value"] = layer.keys, layer.values
    return flat
