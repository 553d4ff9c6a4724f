"""Encoder-decoders (T5, BART, Marian: task "seq2seq-lm"; Whisper: "speech2seq-lm"), one part a build (`[export] part`).

- encoder: the profile's inputs -> `last_hidden_state` and each decoder layer's cross-attention keys and values,
  `present.{i}.encoder.key/value` (Optimum's names): what the model's own decoder writes into an empty cross-attention
  cache on a dummy token (`encode`), so no per-architecture table; the dummy step reaches no output.
- decoder: one graph for every step, Optimum's decoder_with_past_model.onnx taking an empty self-attention cache too:
  `input_ids`, `encoder_attention_mask` (not Whisper's), `past_key_values.{i}.decoder/encoder.key/value` -> `logits`,
  `present.{i}.decoder.key/value`. No If node, no cross-attention projection: one engine, one optimization profile.
  Dims: `encoder_seq` is the profile's `seq`, `seq` the decoder tokens of one call (`DECODER_SEQ`), `past_seq` see `past_range`.

The decoder's generation check runs the encoder in torch and saves its inputs and cross-attention caches with the
reference, so later stages decode their decoder alone on them. torch and transformers are imported at call time.
"""

from __future__ import annotations

import inspect
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import InputError, ProfileError, first_line
from pipeline.core.generation import Runner
from pipeline.core.profiles import InputSpec, Profile

ENCODER_SEQ = "encoder_seq"
DECODER_SEQ = {"min": 1, "opt": 1, "max": 4}  # decoder tokens a call: 1 when decoding, up to 4 for a forced prefix (Whisper's task tokens)
CROSS_INPUT = re.compile(r"past_key_values\.\d+\.encoder\.(key|value)")  # the decoder's cross-attention cache, the encoder part's outputs
GENERATION_ROWS = 2  # rows of encoder input the generation check decodes


def prepare_part(model: Any, profile: Profile) -> tuple[Any, Profile]:
    """The part's module, its forward taking the export profile's inputs in order by name, and that profile (the
    decoder's derived from the model). Attention runs eager: T5's SDPA attention does not trace with a dynamic decoder
    length (torch.export cannot view its output), and one attention code for every model keeps the parts alike."""
    model.eval().set_attn_implementation("eager")
    encoder = model.get_encoder()
    accepted = inspect.signature(encoder.forward).parameters
    unknown = [spec.name for spec in profile.inputs if spec.name not in accepted]
    if unknown:
        offered = [a for a in ("input_ids", "attention_mask", "input_features") if a in accepted]
        raise ProfileError(f"{profile.source}: inputs: {type(encoder).__name__}.forward has no argument {unknown[0]!r}; the profile's "
                           f"[[inputs]] are the encoder's: {', '.join(offered)}")
    if profile.export.part == "encoder":
        return _bind_encoder(model, profile), profile
    hidden, self_layout, cross_layout = _prefill(model, profile)
    decoder = decoder_profile(profile, model, self_layout, cross_layout, hidden)
    return _bind_decoder(model, decoder, len(self_layout), int(hidden.shape[2])), decoder


def encode(model: Any, named: dict[str, Any]) -> dict[str, Any]:
    """The encoder part's outputs on `named` (module docstring), the decoder run by its class's forward, not a part's bound one."""
    import torch
    from transformers import DynamicCache, EncoderDecoderCache

    hidden = model.get_encoder()(**named, return_dict=True).last_hidden_state
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    type(model).forward(model, encoder_outputs=encoder_output(hidden), attention_mask=named.get("attention_mask"), past_key_values=cache, use_cache=True,
                        decoder_input_ids=torch.zeros((hidden.shape[0], 1), dtype=torch.long, device=hidden.device), return_dict=True)
    return {"last_hidden_state": hidden, **{f"present.{i}.encoder.{kind}": getattr(layer, f"{kind}s")
                                            for i, layer in enumerate(cache.cross_attention_cache.layers) for kind in ("key", "value")}}


def encoder_output(hidden: Any) -> Any:
    """The encoder's output as a model's forward reads it: BaseModelOutput's fields, and the `router_logits` a mixture of
    experts' forward copies into its own output (SwitchTransformers, NLLB-MoE: None, no router loss at inference)."""
    from transformers.modeling_outputs import MoEModelOutput

    return MoEModelOutput(last_hidden_state=hidden)


def run_encoder(model: Any, feeds: dict[str, np.ndarray], profile: Profile) -> dict[str, Any]:
    """`encode` in torch on `feeds` (the profile's encoder inputs); a model that does not run on them is the user's to fix (one line)."""
    import torch

    try:
        with torch.no_grad():
            return encode(model, {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()})
    except Exception as err:
        given = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
        raise ProfileError(f"{profile.source}: inputs: the encoder of {type(model).__name__} does not run on {given} "
                           f"({type(err).__name__}: {first_line(err)}); give [[inputs]] the names and shapes it takes") from err


def _prefill(model: Any, profile: Profile) -> tuple[Any, list, list]:
    """The encoder's output on the profile's smallest inputs, and the self- and cross-attention cache layouts a 2-token prefill returns."""
    import torch
    from transformers import DynamicCache, EncoderDecoderCache

    from pipeline.core.samples import make_inputs
    from pipeline.models.decoder import cache_layout

    feeds = make_inputs(profile, seed=profile.model.seed, which="min")
    hidden = run_encoder(model, feeds, profile)["last_hidden_state"]
    with torch.no_grad():
        output = model(encoder_outputs=encoder_output(hidden), decoder_input_ids=torch.zeros((hidden.shape[0], 2), dtype=torch.long),
                       past_key_values=EncoderDecoderCache(DynamicCache(), DynamicCache()), use_cache=True, return_dict=True)
    cache = output.past_key_values
    return hidden, cache_layout(model, cache.self_attention_cache), cache_layout(model, cache.cross_attention_cache)


def decoder_profile(profile: Profile, model: Any, self_layout: list, cross_layout: list, hidden: Any) -> Profile:
    """The decoder part's profile: its inputs (module docstring) in Optimum's order and dims, from the encoder profile
    `profile`, the caches' layouts and the encoder's output `hidden` [batch, encoder length, hidden size]."""
    from pipeline.models.decoder import PAST_DIM

    specs = {spec.name: spec for spec in profile.inputs}
    text = "input_ids" in specs
    if "batch" not in profile.dims or (text and "seq" not in profile.dims):
        raise ProfileError(f"{profile.source}: dims: the decoder part needs the encoder inputs' dims named batch and seq (the source length); rename yours")
    encoder_length = ENCODER_SEQ if text else int(hidden.shape[1])  # Whisper's: fixed by its input_features
    inputs = [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "seq"], "range": [0, model.config.vocab_size]}]
    if text and "attention_mask" in specs:
        inputs.append({"name": "encoder_attention_mask", "dtype": specs["attention_mask"].dtype, "shape": ["batch", ENCODER_SEQ], "fill": "mask"})
    for i, (own, cross) in enumerate(zip(self_layout, cross_layout, strict=True)):
        for cache, layer, length in (("decoder", own, PAST_DIM), ("encoder", cross, encoder_length)):
            inputs += [{"name": f"past_key_values.{i}.{cache}.key", "dtype": layer.dtype, "shape": ["batch", layer.key_heads, length, layer.key_dim]},
                       {"name": f"past_key_values.{i}.{cache}.value", "dtype": layer.dtype, "shape": ["batch", layer.value_heads, length, layer.value_dim]}]
    dims = {"batch": profile.dims["batch"].model_dump(), **({ENCODER_SEQ: profile.dims["seq"].model_dump()} if text else {}),
            "seq": DECODER_SEQ, PAST_DIM: past_range(profile, model.config)}
    return Profile.model_validate({**profile.model_dump(), "inputs": inputs, "dims": dims, "source": profile.source})


def past_range(profile: Profile, config: Any) -> dict[str, int]:
    """The decoder's cache lengths: the profile's `[dims.past_seq]`, else 0 to the source length's max (a translation is
    about as long as its source; Whisper's: its decoder positions), opt the generation check's; within the decoder's positions."""
    from pipeline.models.decoder import PAST_DIM, max_positions

    positions = getattr(config, "max_target_positions", None) or max_positions(config)
    room = positions - DECODER_SEQ["max"] if positions else None
    asked, new = profile.dims.get(PAST_DIM), profile.export.new_tokens
    if asked is not None and room is not None and asked.max > room:
        raise ProfileError(f"{profile.source}: dims.{PAST_DIM}.max = {asked.max}: the decoder takes {positions} positions, {room} of them "
                           f"beside {DECODER_SEQ['max']} new tokens a call; set it to {room} or less")
    bounds = [x for x in (profile.dims["seq"].max if "seq" in profile.dims else None, room) if x is not None]
    longest = min(bounds) if bounds else new
    past = asked.model_dump() if asked is not None else {"min": 0, "opt": max(1, min(longest, new)), "max": longest}
    if past["max"] < new - 1:
        raise ProfileError(f"{profile.source}: export.new_tokens = {new} does not fit dims.{PAST_DIM}.max = {past['max']} (the last step reads "
                           f"{new - 1} cached tokens); lower new_tokens or raise dims.{PAST_DIM}.max")
    return past


def _bind_encoder(model: Any, profile: Profile) -> Any:
    """The whole model, its forward taking the profile's inputs in order and returning `encode`'s outputs."""
    names = [spec.name for spec in profile.inputs]

    def forward(*inputs):
        return encode(model, dict(zip(names, inputs, strict=True)))

    model.forward = forward  # on the instance: node names keep the model's scopes
    return model


def _bind_decoder(model: Any, profile: Profile, layers: int, hidden_size: int) -> Any:
    """The whole model, its forward taking the decoder profile's inputs in order: the cross-attention cache marked updated,
    so it is read, not computed; zeros stand for the encoder states a decoder layer needs to run its cross-attention
    (BART's, Whisper's), which no projection reads."""
    import torch
    from transformers import DynamicCache, EncoderDecoderCache

    names, own = [spec.name for spec in profile.inputs], model.forward

    def forward(*inputs):
        named = dict(zip(names, inputs, strict=True))
        pairs = {cache: [(named[f"past_key_values.{i}.{cache}.key"], named[f"past_key_values.{i}.{cache}.value"]) for i in range(layers)]
                 for cache in ("decoder", "encoder")}
        cache = EncoderDecoderCache(DynamicCache(ddp_cache_data=pairs["decoder"]), DynamicCache(ddp_cache_data=pairs["encoder"]))
        cache.is_updated = dict.fromkeys(range(layers), True)
        key = pairs["encoder"][0][0]
        stand_in = torch.zeros((key.shape[0], key.shape[2], hidden_size), dtype=key.dtype, device=key.device)
        output = own(decoder_input_ids=named["input_ids"], encoder_outputs=encoder_output(stand_in), attention_mask=named.get("encoder_attention_mask"),
                     past_key_values=cache, use_cache=True, return_dict=True)
        present = output.past_key_values.self_attention_cache.layers
        return {"logits": output.logits, **{f"present.{i}.decoder.{kind}": getattr(layer, f"{kind}s") for i, layer in enumerate(present)
                                            for kind in ("key", "value")}}

    model.forward = forward
    return model


def generation_inputs(profile: Profile) -> dict[str, np.ndarray]:
    """The encoder inputs the generation check decodes from: GENERATION_ROWS rows of the profile's (encoder's) inputs at opt sizes."""
    from pipeline.core.generation import PROMPT_SEED
    from pipeline.core.samples import make_inputs

    return make_inputs(profile, seed=PROMPT_SEED, dims={"batch": min(GENERATION_ROWS, profile.dims["batch"].max)})


def start_ids(model: Any, rows: int, profile: Profile) -> np.ndarray:
    """[rows, 1] of the model's decoder_start_token_id (else its bos_token_id, as `generate` takes), where greedy decoding starts."""
    generation, config = model.generation_config, model.config
    choices = (getattr(generation, "decoder_start_token_id", None), getattr(config, "decoder_start_token_id", None), getattr(generation, "bos_token_id", None))
    start = next((choice for choice in choices if choice is not None), None)
    if not isinstance(start, int):
        raise ProfileError(f"{profile.source}: model: the model has no decoder_start_token_id to start decoding from; set it in hf_config")
    return np.full((rows, 1), start, dtype=np.int64)


def check_decoder_generation(given: Profile, profile: Profile, model: Any, torch_run: Runner, session: Any, reference_path: Path | None) -> dict[str, Any]:
    """Greedy decoding with torch, followed by the exported decoder (`session`), on torch's cross-attention caches for
    `given`'s encoder inputs: its picks must be torch's. torch's run and what it was fed are saved to `reference_path`."""
    from pipeline.core.generation import compare, follow, greedy, require_exact, save_reference

    started = time.perf_counter()
    encoder_inputs = generation_inputs(given)
    fixed = cross_feeds({name: tensor.numpy() for name, tensor in run_encoder(model, encoder_inputs, given).items()}, profile)
    if any(spec.name == "encoder_attention_mask" for spec in profile.inputs):
        fixed["encoder_attention_mask"] = encoder_inputs["attention_mask"]
    prompt = start_ids(model, len(next(iter(encoder_inputs.values()))), profile)
    reference = greedy(torch_run, profile, ids=prompt, fixed=fixed)
    figures = compare(reference, follow(session.run_named, profile, reference, ids=prompt, fixed=fixed))
    require_exact(figures, "export", "torch's")
    if reference_path is not None:
        feeds = {"prompt": prompt, **{f"fixed.{k}": v for k, v in fixed.items()}, **{f"encoder.{k}": v for k, v in encoder_inputs.items()}}
        save_reference(reference_path, reference, None, feeds)
    return {**figures, "check_seconds": round(time.perf_counter() - started, 3)}


def cross_feeds(encoded: dict[str, np.ndarray], profile: Profile) -> dict[str, np.ndarray]:
    """The decoder's cross-attention cache inputs (`past_key_values.{i}.encoder.*`) from the encoder part's outputs
    (`present.{i}.encoder.*`); an encoder that lacks one the decoder `profile` takes is refused in one line."""
    wanted = [spec.name for spec in profile.inputs if CROSS_INPUT.fullmatch(spec.name)]
    missing = [name for name in wanted if name.replace("past_key_values", "present") not in encoded]
    if missing:
        raise InputError(f"the encoder has no output {missing[0].replace('past_key_values', 'present')!r} for the decoder's {missing[0]!r} "
                         f"(it outputs {', '.join(encoded)}): export the encoder part with this version")
    return {name: encoded[name.replace("past_key_values", "present")] for name in wanted}


def end_to_end_generation(encoder_onnx: Path, decoder_onnx: Path, reference: Path, profile: Profile) -> dict[str, Any]:
    """An encoder and a decoder file on onnxruntime following the decoder export's reference (model.generation.npz), the
    encoder run once on its inputs: `compare`'s figures. `profile`: the decoder part's, or the user's (the cache inputs
    then read from `decoder_onnx`)."""
    from pipeline.core.generation import compare, follow, load_feeds, load_reference
    from pipeline.core.verify import OnnxSession

    started = time.perf_counter()
    expected, _ = load_reference(reference)
    fed = load_feeds(reference)
    steps = _decoder_inputs(profile, decoder_onnx)
    fixed = {**fed["fixed"], **cross_feeds(OnnxSession(encoder_onnx).run_named(fed["encoder"]), steps)}
    candidate = follow(OnnxSession(decoder_onnx).run_named, steps, expected, ids=fed["prompt"], fixed=fixed)
    return {**compare(expected, candidate), "check_seconds": round(time.perf_counter() - started, 3)}


def _decoder_inputs(profile: Profile, decoder_onnx: Path) -> Profile:
    """`profile` as the generation loop reads it for the decoder: its inputs the decoder file's when it lacks the cache ones
    (unvalidated: the loop reads only names, dtypes and the cache's heads and head dims)."""
    import onnx

    from pipeline.core.generation import PAST_INPUT

    if any(PAST_INPUT.fullmatch(spec.name) for spec in profile.inputs):
        return profile
    graph = onnx.load(str(decoder_onnx), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    specs = [InputSpec.model_construct(name=value.name, dtype=onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name,
                                       shape=[d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim], fill="random", range=None)
             for value in graph.input if value.name not in initializers]
    return profile.model_copy(update={"inputs": specs})
