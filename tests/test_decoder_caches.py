"""A decoder's KV cache read from the model (issue 38): multi-query, grouped-query, sliding-window and
partial-rotary decoders, small random-weight configs, export with their cache and pass the generation check."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import write_profile

from pipeline.core.profiles import load_profile

pytest.importorskip("transformers")

# the factories as a user writes them: AutoConfig.for_model with tiny sizes, the cache at its default (on)
FACTORIES = '''
from transformers import AutoConfig, AutoModelForCausalLM

CONFIGS = {
    "falcon": dict(multi_query=True, new_decoder_architecture=False, hidden_size=64, num_attention_heads=4),
    "qwen2": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2),
    "gemma2": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=6),
    "gptj": dict(n_embd=64, n_head=4, rotary_dim=8, n_positions=128),
    "phi": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, partial_rotary_factor=0.5),
}

def decoder(model_type):
    layers = {"n_layer": 2} if model_type == "gptj" else {"num_hidden_layers": 2, "max_position_embeddings": 128}
    config = AutoConfig.for_model(model_type, vocab_size=1000, bos_token_id=0, eos_token_id=1, pad_token_id=0,
                                  **layers, **CONFIGS[model_type])
    return AutoModelForCausalLM.from_config(config).eval()
'''


def profile_text(model_type: str) -> str:
    """Only batch and seq, as a user writes it for an encoder: the cache inputs are derived."""
    return (f'name = "{model_type}"\n[model]\nfactory = "caches:decoder"\nkwargs = {{ model_type = "{model_type}" }}\n'
            '[dims.batch]\nmin = 1\nopt = 2\nmax = 4\n[dims.seq]\nmin = 1\nopt = 8\nmax = 32\n'
            '[[inputs]]\nname = "input_ids"\ndtype = "int64"\nshape = ["batch", "seq"]\nrange = [0, 1000]\n'
            '[[inputs]]\nname = "attention_mask"\ndtype = "int64"\nshape = ["batch", "seq"]\nfill = "mask"\n')


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("caches")
    (root / "caches.py").write_text(FACTORIES)
    return root


def build(folder, model_type: str):
    from pipeline.models.module import build_module

    return build_module(load_profile(str(write_profile(folder, profile_text(model_type), f"{model_type}.toml"))))


@pytest.mark.parametrize(("model_type", "key_shape", "windows"), [
    ("falcon", ["batch", 1, "past_seq", 16], [None, None]),  # multi-query: its config says 4 heads
    ("qwen2", ["batch", 2, "past_seq", 16], [None, None]),  # grouped-query
    ("gemma2", ["batch", 2, "past_seq", 16], [6, None]),  # sliding then global layers
    ("gptj", ["batch", 4, "past_seq", 16], [None, None]),  # rotary on 8 of a head's 16 dims
])
def test_the_cache_layout_is_the_one_the_model_returns(folder, model_type, key_shape, windows):
    import torch

    from pipeline.models.decoder import cache_layout

    module, _, _, profile = build(folder, model_type)
    specs = {spec.name: spec for spec in profile.inputs}
    assert list(specs["past_key_values.1.key"].shape) == key_shape and list(specs["past_key_values.1.value"].shape) == key_shape
    assert [layer.sliding_window for layer in cache_layout(module)] == windows
    with torch.device("meta"):  # init reads it without memory
        meta = type(module)(module.config)
    assert [layer.key_heads for layer in cache_layout(meta)] == [key_shape[1]] * 2


@pytest.mark.parametrize("model_type", ["falcon", "qwen2", "gemma2", "gptj", "phi"])
def test_each_decoder_exports_with_its_cache_and_generates_as_torch(folder, model_type):
    from pipeline.export import export_model

    profile = load_profile(str(write_profile(folder, profile_text(model_type), f"{model_type}.toml")))
    result = export_model(profile, folder / f"{model_type}.onnx", generation_reference=folder / f"{model_type}.npz")
    assert result.derived["dims"]["past_seq"] == {"min": 0, "opt": 8, "max": 32}, "past_seq up to seq max by default, past the window too"
    assert result.generation["token_agreement"] == 1.0 and result.generation["tokens"] == 2 * 16


def test_a_sliding_window_decoder_decodes_as_with_its_own_cache(folder):
    """The export gives Gemma-2's sliding layers a full-length cache: its greedy run (8 prompt tokens, 16 new,
    window 6) is the one the model computes with its own cache, which keeps only the window."""
    import torch

    from pipeline.core.generation import greedy, prompts
    from pipeline.models.module import flatten_outputs

    module, _, _, profile = build(folder, "gemma2")
    names = [spec.name for spec in profile.inputs]

    def exported_layout(feeds):  # the bound forward the export traces, cache inputs in and present outputs out
        with torch.no_grad():
            output = module(*(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names))
        return {name: t.numpy() for name, t in flatten_outputs(output, profile)}

    exported = greedy(exported_layout, profile)
    own, scores = torch.from_numpy(prompts(profile)), []
    with torch.no_grad():
        output = type(module).forward(module, input_ids=own, use_cache=True)
        for _ in range(16):
            scores.append(output.logits[:, -1])
            token = output.logits[:, -1].argmax(-1, keepdim=True)
            output = type(module).forward(module, input_ids=token, past_key_values=output.past_key_values, use_cache=True)
    assert type(output.past_key_values.layers[0]).__name__ == "DynamicSlidingWindowLayer"
    assert output.past_key_values.layers[0].keys.shape[2] == 5 and exported.tokens.shape == (2, 16)
    assert np.allclose(torch.stack(scores).numpy(), exported.logits, atol=1e-4)


def test_a_cache_with_a_state_space_layer_is_refused_in_one_line():
    """Jamba's cache holds Mamba states beside its attention layers' keys and values: no past_key_values layout."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pipeline.core.errors import ProfileError
    from pipeline.models.decoder import cache_layout

    config = AutoConfig.for_model("jamba", vocab_size=1000, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                                  num_hidden_layers=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, num_experts=2,
                                  mamba_d_state=4, mamba_expand=2, use_mamba_kernels=False)
    with pytest.raises(ProfileError, match=r'layer 0 of its cache is a \w+ without key and value tensors .*set \[export\] cache = "none"'):
        cache_layout(AutoModelForCausalLM.from_config(config).eval())


@pytest.mark.parametrize(("declared", "expected"), [("", {"min": 0, "opt": 8, "max": 32}),
                                                    ("[dims.past_seq]\nmin = 0\nopt = 16\nmax = 64\n", {"min": 0, "opt": 16, "max": 64}),
                                                    ("[dims.past_seq]\nmin = 0\nopt = 16\nmax = 97\n", "dims.past_seq.max = 97: the model takes 128 positions, 96 of them beside dims.seq.max = 32; set it to 96 or less")])
def test_the_cache_range_is_the_profiles(folder, declared, expected):
    """Issue 33: the cache range was max positions - seq max (32,256 tokens for a Qwen2.5 profile asking for seq up to
    512), memory TensorRT's optimization profile reserves. It is the profile's `[dims.past_seq]`, else 0 to seq max;
    one beyond the model's positions is refused in one line."""
    import importlib
    import sys

    from pipeline.core.errors import ProfileError
    from pipeline.models.decoder import with_past_profile

    profile = load_profile(str(write_profile(folder, profile_text("qwen2") + declared, "qwen2-range.toml")))
    sys.path.insert(0, str(folder))
    try:
        model = importlib.import_module("caches").decoder("qwen2")
    finally:
        sys.path.remove(str(folder))
    if isinstance(expected, str):
        with pytest.raises(ProfileError, match=expected.replace(".", r"\.")):
            with_past_profile(profile, model)
        return
    assert with_past_profile(profile, model).dims["past_seq"].model_dump() == expected
