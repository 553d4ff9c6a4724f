"""Model size before memory: a Hugging Face model whose export would not fit this machine is refused in one line, its
parameters counted on torch's `meta` device; `init --hf MODEL_TYPE` writes `SMALL_CONFIG` instead of the default sizes.
"""

from __future__ import annotations

import copy
from typing import Any

from pipeline.core.errors import ProfileError
from pipeline.core.memory import available_bytes, gib

# Peak resident memory the export stage adds to the process, per exporter: (fixed bytes, factor of the FP32 weights).
# The fixed part is torch's tracing and onnxruntime's session; the factor, the module and then the session that checks
# the file (the export lets the module go before the session loads it). The line through a 29M- and a 174M-parameter
# Llama's peaks (bench/export_memory.py, bench/results/export_memory.json: dynamo 0.34 GB + 2.43x, torchscript, which
# also holds the proto it serializes, 0.19 GB + 4.13x), rounded up.
EXPORT_MEMORY = {"dynamo": (400_000_000, 2.5), "torchscript": (200_000_000, 4.5)}


def export_peak_bytes(weights: int, exporter: str) -> int:
    """What the export of a model with `weights` bytes of FP32 weights needs, by EXPORT_MEMORY."""
    fixed, factor = EXPORT_MEMORY[exporter]
    return int(fixed + factor * weights)

# What `init --hf MODEL_TYPE` writes for a config's size keys (those the config has, under its own
# names): a model that exports in seconds. Every key a user sets to grow it is one of these.
SMALL_CONFIG = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
}


# An encoder-decoder's small config: each side's depth, heads and feed-forward width under the names its config
# has (BART-like: encoder_layers, ...; T5: num_layers, num_decoder_layers, num_heads, d_kv, d_ff), its positions
# (Whisper: max_source_positions, the encoder's frames / 2; max_target_positions, the decoder's tokens).
SMALL_ENCODER_DECODER = {
    "d_model": SMALL_CONFIG["hidden_size"],
    "encoder_layers": SMALL_CONFIG["num_hidden_layers"], "decoder_layers": SMALL_CONFIG["num_hidden_layers"],
    "num_layers": SMALL_CONFIG["num_hidden_layers"], "num_decoder_layers": SMALL_CONFIG["num_hidden_layers"],
    "encoder_attention_heads": SMALL_CONFIG["num_attention_heads"], "decoder_attention_heads": SMALL_CONFIG["num_attention_heads"],
    "num_heads": SMALL_CONFIG["num_attention_heads"], "d_kv": SMALL_CONFIG["head_dim"],
    "encoder_ffn_dim": SMALL_CONFIG["intermediate_size"], "decoder_ffn_dim": SMALL_CONFIG["intermediate_size"], "d_ff": SMALL_CONFIG["intermediate_size"],
    "vocab_size": SMALL_CONFIG["vocab_size"], "decoder_vocab_size": SMALL_CONFIG["vocab_size"],
    "max_position_embeddings": SMALL_CONFIG["max_position_embeddings"], "max_source_positions": 64, "max_target_positions": 64,
}
# Token ids a config names, kept inside the smaller vocabulary.
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id")

# The small config's stage count (a CNN's or hierarchical transformer's per-stage lists are cut to it),
# the same as its layer count; its largest image side (a checkpoint folder keeps its own).
SMALL_STAGES = SMALL_CONFIG["num_hidden_layers"]
SMALL_IMAGE = 224
# List fields a config computes from the others (from depths, num_hidden_layers): never written.
DERIVED_LISTS = {"stage_names", "out_features", "out_indices", "attention_layers"}
# Counts of the last layers that reuse an earlier layer's cache instead of making their own (Gemma 3n's
# num_kv_shared_layers, 15 of 35): scaled to the small depth, at least one layer sharing and one making a cache.
SHARED_CACHE_LAYERS = ("num_kv_shared_layers",)
# The weights' std most configs draw with (BERT's, ViT's, Llama's initializer_range). SAM's, BLIP's and GOT-OCR2's
# vision configs default to 1e-10, a value only a checkpoint's loaded weights make harmless: drawn with it, SAM's vision
# outputs came out near 1e-20, under FP16's smallest value (its FP16 check read cosine 0). A small config draws with this.
INIT_STD = 0.02


def small_config_fields(config: Any, cut_lists: bool = True) -> dict[str, Any]:
    """The fields `init --hf MODEL_TYPE` writes to make `config` small, under its own names (GPT-2: n_embd, ...): SMALL_CONFIG's
    keys it has, its per-stage and per-layer lists cut to SMALL_STAGES (unless `cut_lists` is False: a fixed stage count), and
    the other head and feed-forward widths, images and special tokens within the small sizes."""
    defaults = config.to_dict()
    if getattr(config, "is_encoder_decoder", False):
        return _encoder_decoder_fields(config, defaults)
    if getattr(config, "is_heterogeneous", False):  # per-layer sizes (Gemma 4): read its global ones, as to_dict has them
        config = copy.copy(config)
        config.allow_global_per_layer_attribute_access = True
    reverse = {standard: own for own, standard in getattr(config, "attribute_map", {}).items()}
    names = {key: reverse.get(key, key) for key in SMALL_CONFIG}
    fields: dict[str, Any] = {names[key]: value for key, value in SMALL_CONFIG.items() if hasattr(config, key)
                              and not isinstance(getattr(config, key), (list, tuple))  # a per-stage list: cut below
                              and not isinstance(getattr(type(config), names[key], None), property)}  # computed (falcon's head_dim)
    if getattr(config, "num_key_value_heads", None) is None:  # a model without GQA takes no such key
        fields.pop(names["num_key_value_heads"], None)
    elif defaults.get("kv_lora_rank") and names["num_key_value_heads"] in fields:  # multi-head latent attention (DeepSeek-V2):
        fields[names["num_key_value_heads"]] = fields[names["num_attention_heads"]]  # its keys and values have every query head
    if cut_lists:
        fields.update(_shorter_lists(defaults, getattr(config, "num_hidden_layers", None)))
    fields.update(_shared_cache_layers(defaults, fields.get(names["num_hidden_layers"]), getattr(config, "num_hidden_layers", None)))
    if isinstance(std := defaults.get("initializer_range"), float) and std < INIT_STD / 100:
        fields["initializer_range"] = INIT_STD
    head_dim = SMALL_CONFIG["hidden_size"] // SMALL_CONFIG["num_attention_heads"]
    for key, value in defaults.items():
        if _is_head_width(key) and isinstance(value, int) and not isinstance(value, bool) and value > head_dim:
            fields[key] = head_dim  # gptj: rotary_dim 64 of a 16-wide head; deepseek's qk_rope_head_dim
        if _is_feed_forward_width(key) and isinstance(value, int) and not isinstance(value, bool) and value > SMALL_CONFIG["intermediate_size"]:
            fields[key] = SMALL_CONFIG["intermediate_size"]  # an expert's width: AXK1's 192 experts of 2048 needed 24 GiB at batch 16
        if key == "image_size" and _largest_side(value) > SMALL_IMAGE:
            fields[key] = SMALL_IMAGE if isinstance(value, int) else [SMALL_IMAGE] * len(value)
    fields.update(_mrope_fields(type(config), defaults, fields.get(names["head_dim"], head_dim)))
    if defaults.get("per_layer_config"):
        layers = fields.get(names["num_hidden_layers"], defaults.get(names["num_hidden_layers"]))
        fields["per_layer_config"] = per_layer_fields(defaults, fields, layers, fields.get("layer_types", defaults.get("layer_types")))
    if not any(names[key] in fields for key in SMALL_CONFIG):
        fields.update(_small_parts(config, cut_lists))
    return {**fields, **_token_ids(config)}


def _small_parts(config: Any, cut_lists: bool) -> dict[str, dict[str, Any]]:
    """A composite config's parts made small, where its own top level has no sizes (CLIP, SigLIP, OWL-ViT: a text and a
    vision config, each a model of its own): each part's fields under its name, for the config to build it from."""
    return {key: small for key, value in vars(config).items()
            if key.endswith("_config") and hasattr(value, "model_type") and hasattr(value, "to_dict")
            and (small := small_config_fields(value, cut_lists))}


def per_layer_fields(defaults: dict[str, Any], fields: dict[str, Any], layers: Any, kept_types: Any) -> dict[str, dict[str, Any]]:
    """A heterogeneous config's per-layer overrides (Gemma 4's full-attention layers) for the `layers` the small config keeps,
    sizes scaled as the global ones were; a kept layer takes those of the first layer of its type in `kept_types`."""
    overrides = {int(index): values for index, values in defaults["per_layer_config"].items()}
    types = defaults.get("layer_types")
    kept: dict[str, dict[str, Any]] = {}
    for index in range(layers if isinstance(layers, int) else 0):
        typed = isinstance(types, list) and isinstance(kept_types, list) and index < len(kept_types) and kept_types[index] in types
        like = types.index(kept_types[index]) if typed else index
        if like in overrides:
            kept[str(index)] = {key: _scaled(value, defaults.get(key), fields[key]) if key in fields else value for key, value in overrides[like].items()}
    return kept


def _shared_cache_layers(defaults: dict[str, Any], layers: Any, default_layers: Any) -> dict[str, int]:
    """SHARED_CACHE_LAYERS the config has, scaled from its `default_layers` to the small config's `layers`: the default 15
    of 35 against 2 layers made every layer a sharing one, and Gemma 3n's config refused it ("The set of layer types
    producing a cache is different than the set of layer types using them")."""
    if not all(isinstance(n, int) and n > 1 for n in (layers, default_layers)):
        return {}
    return {key: min(max(1, value * layers // default_layers), layers - 1) for key in SHARED_CACHE_LAYERS
            if isinstance(value := defaults.get(key), int) and not isinstance(value, bool) and value > 0}


def _mrope_fields(config_class: type, defaults: dict[str, Any], head_dim: int) -> dict[str, Any]:
    """A multimodal rotary embedding's sections (Qwen2-VL's mrope_section: time, height and width) summing to half the small
    head's rotary width: the model's default sections, [16, 24, 24] for a 128-wide head in its modeling code, not in the
    config, would not split a 16-wide one. For the configs whose rope validation names mrope_section."""
    if "mrope_section" not in getattr(config_class, "ignore_keys_at_rope_validation", ()):
        return {}
    key = "rope_parameters" if "rope_parameters" in defaults else "rope_scaling"
    rope = dict(defaults.get(key) or {})
    half = int(head_dim * rope.get("partial_rotary_factor", defaults.get("partial_rotary_factor", 1.0))) // 2
    count = len(rope.get("mrope_section") or ()) or 3
    rope["mrope_section"] = [half - (count - 1) * (half // count)] + [half // count] * (count - 1)
    return {key: rope}


def _scaled(value: Any, default: Any, small: Any) -> Any:
    """`value` (a layer's size where the config's is `default`) in a config whose size is `small`."""
    if all(isinstance(v, int) and not isinstance(v, bool) for v in (value, default, small)) and default > 0:
        return max(1, value * small // default)
    return value


def _encoder_decoder_fields(config: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    """SMALL_ENCODER_DECODER's keys the config has (both sides the same size), its token ids inside the vocabulary."""
    fields = {key: value for key, value in SMALL_ENCODER_DECODER.items() if key in defaults}
    starts = [getattr(config, key, None) for key in ("decoder_start_token_id", "bos_token_id")]
    if starts == [None, None] and isinstance(pad := getattr(config, "pad_token_id", None), int):
        fields["decoder_start_token_id"] = pad  # T5's checkpoints start decoding at the pad token; generate needs a start
    return {**fields, **_token_ids(config)}


def _token_ids(config: Any) -> dict[str, Any]:
    """Special tokens and suppressed ones (Whisper's begin_suppress_tokens) inside the smaller vocabulary: the ids
    beyond it moved to its end, keeping which are equal and their order (Whisper's start token stays after its end token)."""
    vocab = SMALL_CONFIG["vocab_size"]
    ids = {key: value for key in TOKEN_IDS if isinstance(value := getattr(config, key, None), int)}
    lists = {key: list(value) for key in ("suppress_tokens", "begin_suppress_tokens") if isinstance(value := getattr(config, key, None), (list, tuple))}
    beyond = [token for token in (*ids.values(), *(t for value in lists.values() for t in value)) if token >= vocab]
    if not beyond:
        return {}
    top = max(beyond)

    def moved(token: int) -> int:
        return max(vocab - 1 - (top - token), 0) if token >= vocab else token

    fields: dict[str, Any] = {key: moved(value) for key, value in ids.items() if value >= vocab}
    fields.update({key: [moved(token) for token in value] for key, value in lists.items() if any(token >= vocab for token in value)})
    return fields


def _shorter_lists(defaults: dict[str, Any], layers: Any) -> dict[str, Any]:
    """Per-stage lists (as long as `depths`, or as most flat lists) and per-layer lists cut to SMALL_STAGES entries, depths
    to one block per stage; run-length layer patterns (gpt_neo's attention_types) to cover as many layers."""
    flat = {key: value for key, value in defaults.items() if isinstance(value, list) and len(value) > SMALL_STAGES
            and key not in DERIVED_LISTS and all(isinstance(v, (int, float, str)) for v in value)}
    lengths = [len(value) for value in flat.values()]
    stages = len(defaults["depths"]) if isinstance(defaults.get("depths"), list) else max(set(lengths), key=lengths.count, default=0)
    shorter: dict[str, Any] = {}
    for key, value in flat.items():
        if len(value) in (stages, layers) and (len(value) == layers or lengths.count(stages) > 1 or key == "depths"):
            cut = value[:SMALL_STAGES]
            shorter[key] = [min(v, 1) for v in cut] if "depth" in key or "repeats" in key else cut
    for key, value in defaults.items():
        if isinstance(value, list) and value and all(_is_run(run) for run in value):
            pattern = value[0][0]
            shorter[key] = [[pattern, -(-SMALL_STAGES // len(pattern))]]
    return shorter


def _is_head_width(key: str) -> bool:
    """A per-head width other than head_dim: rotary_dim, qk_rope_head_dim, v_head_dim, xlnet's and funnel's d_head, ..."""
    return key != "head_dim" and (key.endswith("head_dim") or key == "d_head" or ("rotary" in key or "rope" in key) and key.endswith("_dim"))


def _is_feed_forward_width(key: str) -> bool:
    """A feed-forward width other than intermediate_size: moe_intermediate_size, shared_expert_intermediate_size, ..."""
    return key != "intermediate_size" and key.endswith("intermediate_size")


def _is_run(run: Any) -> bool:
    return isinstance(run, list) and len(run) == 2 and isinstance(run[0], list) and isinstance(run[1], int)


def _largest_side(value: Any) -> int:
    if isinstance(value, int):
        return value
    return max(value) if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value) else 0


def count_parameters(auto_class: Any, config: Any) -> int:
    """The parameter count of the model `auto_class.from_config(config)` would build, counted on the meta device."""
    import torch

    with torch.device("meta"):
        model = auto_class.from_config(config)
    return sum(p.numel() for p in model.parameters())


def check_fits(auto_class: Any, config: Any, where: str, exporter: str, available: int | None = None) -> int:
    """Refuse (one line) a model whose export would need more memory than is available (EXPORT_MEMORY); return its parameter count."""
    parameters = count_parameters(auto_class, config)
    weights = parameters * 4
    available = available_bytes() if available is None else available
    needs = export_peak_bytes(weights, exporter)
    if needs > available:
        keys = ", ".join(small_config_fields(config)) or "its size keys"
        fixed, factor = EXPORT_MEMORY[exporter]
        raise ProfileError(
            f"{where}: the model has {parameters / 1e6:,.0f}M parameters, {gib(weights)} of FP32 weights, and its export ({exporter}) needs "
            f"about {gib(needs)} ({factor:g}x the weights and {gib(fixed)}); this machine has {gib(available)} available. "
            f"Shrink the config ({keys}) or export on a larger machine"
        )
    return parameters
