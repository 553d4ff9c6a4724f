"""`init --hf` for an encoder-decoder (t5, bart, mbart, marian, whisper): its task, the encoder's inputs, and the
check that the model runs on them. The profile describes the encoder's inputs; a build makes the encoder and the
decoder with past, each a model of its own (pipeline/parts.py)."""

from __future__ import annotations

from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.profiles import ENCODER_DECODER_TASKS, Profile
from pipeline.models.decoder import max_positions
from pipeline.models.hf import AUTO_CLASSES

LONGEST_SOURCE = 128  # the starter's longest source sequence, within the model's positions
EXPORT = {"new_tokens": 16}
EXPORT_COMMENT = ('a build makes the encoder and the decoder with past, each in OUT/<part>/ (part = "encoder" or "decoder": that one only); '
                  "new_tokens: the greedy tokens the generation check decodes")


def task_of(transformers: Any, source: str, config: Any, task: str | None) -> str:
    """The task init writes: the one asked for, else the one a checkpoint's `architectures` names, else base; for an
    encoder-decoder its generation head (seq2seq-lm, or speech2seq-lm for Whisper), another head refused."""
    if not config.is_encoder_decoder:
        return task or _architecture_task(transformers, config) or "base"
    heads = [t for t in ENCODER_DECODER_TASKS if type(config) in getattr(transformers, AUTO_CLASSES[t])._model_mapping]
    if task in ENCODER_DECODER_TASKS or (task is None and heads):
        return task or heads[0]
    name = type(config).__name__.removesuffix("Config")
    if task is None:
        raise InputError(f"init --hf {source}: {name} is an encoder-decoder transformers maps to no generation head "
                         f"({' or '.join(AUTO_CLASSES[t] for t in ENCODER_DECODER_TASKS)}); write its profile by hand (docs/decoders.md)")
    raise InputError(f"init --hf {source}: {name} is an encoder-decoder; init writes its generation model (--task {heads[0] if heads else 'seq2seq-lm'}: "
                     f"the encoder and the decoder with past, two models of one build), not --task {task}")


def _architecture_task(transformers: Any, config: Any) -> str | None:
    """The task whose auto class maps the config to the class its `architectures` names (save_pretrained writes it)."""
    named = set(getattr(config, "architectures", None) or ())
    for task, auto_class in AUTO_CLASSES.items():
        try:
            mapped = getattr(transformers, auto_class)._model_mapping[type(config)]
        except (KeyError, ValueError):
            continue
        if any(model_class.__name__ in named for model_class in (mapped if isinstance(mapped, tuple) else (mapped,))):
            return task
    return None


def encoder_decoder_inputs(config: Any, task: str) -> tuple[dict, list[tuple[dict, str]]]:
    """dims {name: (min, opt, max)} and the encoder's [[inputs]] rows with a comment each: token ids and their mask,
    or Whisper's log-mel features (its encoder takes exactly 2 * max_source_positions frames)."""
    batch = {"batch": (1, 2, 4)}
    if task == "speech2seq-lm":
        mel, positions = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", None)
        if not (isinstance(mel, int) and isinstance(positions, int)):
            raise InputError(f"init --hf {config.model_type}: init writes the inputs of a Whisper-like speech model (num_mel_bins, "
                             "max_source_positions in its config); write this model's [[inputs]] by hand (docs/decoders.md)")
        features = {"name": "input_features", "dtype": "float32", "shape": ["batch", mel, 2 * positions], "range": [-1.0, 1.0]}
        return batch, [(features, f"log-mel features: {mel} mel bins x {2 * positions} frames (2 x max_source_positions), scaled as "
                                  "WhisperFeatureExtractor does (about -1..1)")]
    longest = min(max_positions(config) or LONGEST_SOURCE, LONGEST_SOURCE)
    rows = [({"name": "input_ids", "dtype": "int64", "shape": ["batch", "seq"], "range": [0, config.vocab_size]}, "source token ids inside the vocabulary"),
            ({"name": "attention_mask", "dtype": "int64", "shape": ["batch", "seq"], "fill": "mask"}, "1 for source tokens, 0 for padding at the end")]
    return {**batch, "seq": (1, min(16, longest), longest)}, rows


def run_encoder_decoder(model: Any, profile: Profile, sizes: dict[str, int] | None) -> None:
    """Run the model once on the encoder's inputs at the profile's max dims (`sizes` overriding them) with
    new_tokens decoder tokens: the source and the generated tokens fit its positions."""
    import torch

    from pipeline.core.samples import make_inputs

    feeds = {name: torch.from_numpy(array) for name, array in make_inputs(profile, seed=0, which="max", dims=sizes).items()}
    batch = next(iter(feeds.values())).shape[0]
    starts = (getattr(model.generation_config, "decoder_start_token_id", None), getattr(model.config, "decoder_start_token_id", None),
              getattr(model.config, "pad_token_id", None))
    start = next((token for token in starts if isinstance(token, int)), 0)
    model(**feeds, decoder_input_ids=torch.full((batch, profile.export.new_tokens), start, dtype=torch.long))
