"""Model size before memory: a Hugging Face model's parameters are counted on torch's `meta`
device (no memory) before it is built, and a model whose export would not fit this machine is
refused in one line. `init --hf MODEL_TYPE` writes `SMALL_CONFIG` instead of the default sizes.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.errors import ProfileError
from pipeline.core.memory import available_bytes

# Peak resident memory the export stage adds, over the FP32 weights' bytes (the model, the traced
# program, the ONNX proto and its file, the onnxruntime session that verifies it): 6.7x measured on
# a 29M-parameter Llama with the dynamo exporter, 5.9x with torchscript (bench/export_memory.py,
# bench/results/export_memory.json); rounded up.
EXPORT_MEMORY_FACTOR = 7

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


def small_config_fields(config: Any) -> dict[str, int]:
    """SMALL_CONFIG's keys that `config` has, under the config's own names (GPT-2: n_embd, n_layer, ...)."""
    reverse = {standard: own for own, standard in getattr(config, "attribute_map", {}).items()}
    names = {key: reverse.get(key, key) for key in SMALL_CONFIG}
    fields = {names[key]: value for key, value in SMALL_CONFIG.items() if hasattr(config, key)}
    if getattr(config, "num_key_value_heads", None) is None:  # a model without GQA takes no such key
        fields.pop(names["num_key_value_heads"], None)
    vocab = SMALL_CONFIG["vocab_size"]
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):  # special tokens stay inside the smaller vocabulary
        value = getattr(config, key, None)
        if isinstance(value, int) and value >= vocab:
            fields[key] = vocab - 1
    return fields


def count_parameters(auto_class: Any, config: Any) -> int:
    """The parameter count of the model `auto_class.from_config(config)` would build, counted on the meta device."""
    import torch

    with torch.device("meta"):
        model = auto_class.from_config(config)
    return sum(p.numel() for p in model.parameters())


def check_fits(auto_class: Any, config: Any, where: str, available: int | None = None) -> int:
    """Refuse (one line) a model whose FP32 weights times the export's memory factor exceed the memory
    available; return its parameter count."""
    parameters = count_parameters(auto_class, config)
    weights = parameters * 4
    available = available_bytes() if available is None else available
    if weights * EXPORT_MEMORY_FACTOR > available:
        keys = ", ".join(small_config_fields(config)) or "its size keys"
        raise ProfileError(
            f"{where}: the model has {parameters / 1e6:,.0f}M parameters, {_gib(weights)} of FP32 weights, and its export needs about "
            f"{EXPORT_MEMORY_FACTOR}x that ({_gib(weights * EXPORT_MEMORY_FACTOR)}); this machine has {_gib(available)} available. "
            f"Shrink the config ({keys}) or export on a larger machine"
        )
    return parameters


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"
