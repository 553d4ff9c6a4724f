"""What the encoder-decoder parts' layout costs (pipeline/models/seq2seq.py): FLOPs of one decode step of the decoder
part as it is exported (the cross-attention caches are inputs: `_bind_decoder`'s forward), of the same step on main's
earlier layout (cross-attention keys and values computed from encoder_hidden_states at every step: an empty
cross-attention cache), and what the encoder part adds to compute them once a sequence (`encode` less the encoder alone
less the dummy decoder step, whose self-attention and logits the exported graph drops as dead code). Counted with
torch's FlopCounterMode on the meta device (no weights, nothing downloaded), batch 1, one new token, PAST cached tokens,
whisper-tiny and t5-small sized configs.

Run: python bench/seq2seq_step_cost.py     -> bench/results/seq2seq_step_cost.json (seconds)
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results" / "seq2seq_step_cost.json"
PAST = 64
MODELS = {  # the sizes of the checkpoints' configs (openai/whisper-tiny, google-t5/t5-small), random weights
    "whisper-tiny": ("whisper", {"d_model": 384, "encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 6,
                                 "decoder_attention_heads": 6, "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536, "vocab_size": 51865,
                                 "num_mel_bins": 80}, [1500]),
    "t5-small": ("t5", {"d_model": 512, "d_ff": 2048, "num_layers": 6, "num_heads": 8, "d_kv": 64, "vocab_size": 32128,
                        "decoder_start_token_id": 0}, [128, 512]),
}


def flops(run) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


def encoder_inputs(model, encoder_length: int) -> dict:
    import torch

    if model.config.model_type == "whisper":  # 2 frames a position
        return {"input_features": torch.empty(1, model.config.num_mel_bins, 2 * encoder_length, device="meta")}
    return {"input_ids": torch.zeros(1, encoder_length, dtype=torch.long, device="meta")}


def measure(model, shape: tuple[int, int, int], encoder_length: int) -> dict[str, float]:
    """GFLOPs of one step in this layout and in main's, and of the encoder part without and with the cross caches."""
    import torch
    from transformers import DynamicCache, EncoderDecoderCache

    from pipeline.models.seq2seq import _bind_decoder, encode

    layers, heads, head_dim = shape
    cache = lambda length: [torch.empty(1, heads, length, head_dim, device="meta")] * 2  # noqa: E731
    ids = torch.zeros(1, 1, dtype=torch.long, device="meta")
    feeds = encoder_inputs(model, encoder_length)
    encoder = flops(lambda: model.get_encoder()(**feeds))
    with_caches = flops(lambda: encode(model, feeds))
    hidden = torch.empty(1, encoder_length, model.config.d_model, device="meta")
    recomputed = flops(lambda: model(encoder_outputs=(hidden,), decoder_input_ids=ids, use_cache=True, past_key_values=EncoderDecoderCache(
        DynamicCache(ddp_cache_data=[cache(PAST) for _ in range(layers)]), DynamicCache())))
    names = [f"past_key_values.{i}.{part}.{kind}" for i in range(layers) for part in ("decoder", "encoder") for kind in ("key", "value")]
    decoder = _bind_decoder(model, SimpleNamespace(inputs=[SimpleNamespace(name=n) for n in ["input_ids", *names]]), layers, model.config.d_model)
    step = lambda past: decoder(ids, *(t for i in range(layers) for t in (*cache(past), *cache(encoder_length))))  # noqa: E731
    this_layout, dummy_step = flops(lambda: step(PAST)), flops(lambda: step(0))
    del model.forward  # the class's again
    added = with_caches - encoder - dummy_step
    return {"step_gflops": round(this_layout / 1e9, 4), "step_gflops_main_recomputed": round(recomputed / 1e9, 4),
            "saved_a_step": round(recomputed / this_layout, 2), "encoder_gflops": round(encoder / 1e9, 4),
            "encoder_added_gflops": round(added / 1e9, 4), "added_in_steps_saved": round(added / (recomputed - this_layout), 2)}


def main() -> None:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    results = {"past": PAST, "models": []}
    for name, (model_type, fields, lengths) in MODELS.items():
        config = transformers.AutoConfig.for_model(model_type, **fields)
        auto = transformers.AutoModelForSpeechSeq2Seq if model_type == "whisper" else transformers.AutoModelForSeq2SeqLM
        with torch.device("meta"):
            model = auto.from_config(config, attn_implementation="eager").eval()
        layers = getattr(config, "decoder_layers", None) or config.num_decoder_layers
        heads = getattr(config, "decoder_attention_heads", None) or config.num_heads
        head_dim = getattr(config, "d_kv", None) or config.d_model // heads
        for length in lengths:
            results["models"].append({"model": name, "encoder_length": length, **measure(model, (layers, heads, head_dim), length)})
            print(results["models"][-1])
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
