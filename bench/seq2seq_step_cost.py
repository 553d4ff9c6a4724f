"""What the decoder part's layout costs (pipeline/models/seq2seq.py): each step computes the cross-attention keys
and values from encoder_hidden_states again, where Optimum's decoder_with_past_model.onnx reads them from cache inputs
computed once. Counted with torch's FlopCounterMode on the meta device (no weights, nothing downloaded) for one
decode step (batch 1, one new token, PAST cached tokens) of whisper-tiny and t5-small sized configs: the step as our
decoder graph runs it (an empty cross-attention cache) and as Optimum's with-past decoder runs it (a filled one).

Run: python bench/seq2seq_step_cost.py     -> bench/results/seq2seq_step_cost.json (seconds)
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results" / "seq2seq_step_cost.json"
PAST = 64
MODELS = {  # the sizes of the checkpoints' configs (openai/whisper-tiny, google-t5/t5-small), random weights
    "whisper-tiny": ("whisper", {"d_model": 384, "encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 6,
                                 "decoder_attention_heads": 6, "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536, "vocab_size": 51865,
                                 "num_mel_bins": 80}, [1500]),
    "t5-small": ("t5", {"d_model": 512, "d_ff": 2048, "num_layers": 6, "num_heads": 8, "d_kv": 64, "vocab_size": 32128,
                        "decoder_start_token_id": 0}, [128, 512]),
}


def step_flops(model, hidden: int, layers: int, heads: int, head_dim: int, encoder_length: int, cross_cached: bool) -> int:
    """FLOPs of one decode step, the cross-attention keys and values given (cross_cached) or computed from the encoder output."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import DynamicCache, EncoderDecoderCache

    def cache(length: int) -> DynamicCache:
        return DynamicCache(ddp_cache_data=[(torch.empty(1, heads, length, head_dim, device="meta"),) * 2 for _ in range(layers)])

    cross = cache(encoder_length) if cross_cached else DynamicCache()
    encoder_output = torch.empty(1, encoder_length, hidden, device="meta")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(encoder_outputs=(encoder_output,), decoder_input_ids=torch.zeros(1, 1, dtype=torch.long, device="meta"),
              past_key_values=EncoderDecoderCache(cache(PAST), cross), use_cache=True)
    return counter.get_total_flops()


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
            ours = step_flops(model, config.d_model, layers, heads, head_dim, length, cross_cached=False)
            cached = step_flops(model, config.d_model, layers, heads, head_dim, length, cross_cached=True)
            results["models"].append({"model": name, "encoder_length": length, "step_gflops_recomputed": round(ours / 1e9, 4),
                                      "step_gflops_cross_cached": round(cached / 1e9, 4), "ratio": round(ours / cached, 2),
                                      "cross_kv_share": round((ours - cached) / ours, 3)})
            print(results["models"][-1])
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
