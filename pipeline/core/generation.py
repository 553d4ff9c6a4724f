"""The generation check, a decoder's accuracy figure: greedy decoding of `[export] new_tokens` tokens from fixed prompts,
feeding the KV cache back (`present.{i}.*` -> `past_key_values.{i}.*`), or the whole sequence for a model without one.

One loop (`greedy`) drives any runner (`feeds -> {output name: array}`): torch at export, onnxruntime for the files after.
A candidate is fed torch's saved tokens (`follow`, teacher forcing) and `compare` scores each step on the same prefix:
free-running decoding would part from torch at the first near tie a rounding flips and count every later step wrong.
A base model without `logits` is decoded through its input embedding matrix (a tied head), read from the ONNX file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import InputError, ProfileError, StageFailed
from pipeline.core.graph import GraphIndex
from pipeline.core.profiles import Profile

PAST_INPUT = re.compile(r"past_key_values\.(\d+)\.(?:decoder\.)?(key|value)")  # an encoder-decoder's self-attention cache: .decoder.
PRESENT_OUTPUT = re.compile(r"present\.(\d+)\.(key|value)")
PROMPT_SEED = 22
Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


REFERENCE_TOP_K = 32  # the scores a saved reference keeps per step and row: the most likely tokens, not the vocabulary


@dataclass(frozen=True)
class Generation:
    tokens: np.ndarray  # [batch, new_tokens], int64
    logits: np.ndarray  # [new_tokens, batch, vocab]: the scores each token was chosen from (or [.., k] at `ids`)
    ids: np.ndarray | None = None  # [new_tokens, batch, k]: the vocabulary ids of `logits` when it keeps only k of them

    def top(self, k: int = REFERENCE_TOP_K) -> Generation:
        """The `k` highest scores of each step and row with their ids, highest first (itself if already cut)."""
        if self.ids is not None:
            return self
        k = min(k, self.logits.shape[-1])
        ids = np.argpartition(-self.logits, k - 1, axis=-1)[..., :k]
        ids = np.take_along_axis(ids, np.argsort(-np.take_along_axis(self.logits, ids, -1), axis=-1, kind="stable"), -1)
        return Generation(self.tokens, np.take_along_axis(self.logits, ids, -1), ids)


def decodes(profile: Profile, outputs: list[str]) -> bool:
    """A decoder of any make: the profile feeds it a KV cache (`past_key_values.{i}.*`) it gives back (`present.{i}.*`), or
    it returns a cache no input feeds back (a prefill-only export: each step of the check recomputes the prefix)."""
    past = [spec.name for spec in profile.inputs if PAST_INPUT.fullmatch(spec.name)]
    if not past:
        return any(PRESENT_OUTPUT.fullmatch(name) for name in outputs)
    return all(name.replace("past_key_values", "present") in outputs for name in past)


def prompts(profile: Profile) -> np.ndarray:
    """Fixed prompts [batch, length]: up to 2 rows, 8 tokens (fewer where seq or the cache cannot hold
    them and `new_tokens`), ids drawn with a fixed seed from input_ids' range."""
    spec = next((s for s in profile.inputs if s.name == "input_ids"), None)
    if spec is None or spec.range is None:
        raise ProfileError(f"{profile.source}: inputs: the generation check needs an input_ids input with a range (the vocabulary)")
    new = profile.export.new_tokens
    seq, past = profile.dims["seq"], profile.dims.get("past_seq")
    room = past.max + 1 - new if past is not None else seq.max - new  # the last step's cache holds prompt + new - 1 tokens
    length = min(8, seq.max, room)
    if length < 1:
        limit = f"dims.past_seq.max = {past.max}" if past is not None else f"dims.seq.max = {seq.max}"
        raise ProfileError(f"{profile.source}: export.new_tokens = {new} does not fit {limit} with a prompt of one token; "
                           f"lower new_tokens or raise {limit.split(' =')[0]}")
    if length < seq.min:
        raise ProfileError(f"{profile.source}: dims.seq.min = {seq.min}: the generation check's prompt of {length} tokens is shorter; lower dims.seq.min")
    batch = min(2, profile.dims["batch"].max) if "batch" in profile.dims else 1
    return np.random.default_rng(PROMPT_SEED).integers(int(spec.range[0]), int(spec.range[1]), (batch, length), dtype=np.int64)


def greedy(run: Runner, profile: Profile, head: np.ndarray | None = None, ids: np.ndarray | None = None,
           new_tokens: int | None = None, fixed: dict[str, np.ndarray] | None = None, forced: np.ndarray | None = None) -> Generation:
    """Greedy decoding of `new_tokens` (default: the profile's) from `ids` (default: `prompts(profile)`) through `run`;
    `fixed`: inputs fed unchanged at every step (an encoder-decoder's cross-attention caches and mask, one row per prompt);
    `forced` [batch, new_tokens]: the tokens fed back instead of the picks (teacher forcing: a reference's tokens)."""
    ids = prompts(profile) if ids is None else ids
    specs = {s.name: s for s in profile.inputs}
    past_names = [s.name for s in profile.inputs if PAST_INPUT.fullmatch(s.name)]
    batch, length = ids.shape
    past = {name: np.zeros((batch, specs[name].shape[1], 0, specs[name].shape[3]), np.float32) for name in past_names}
    tokens, scores = [], []
    new, seen = ids, 0  # tokens to feed, tokens already in the cache
    for index in range(profile.export.new_tokens if new_tokens is None else new_tokens):
        total = seen + new.shape[1]
        feeds = {"input_ids": new.astype(specs["input_ids"].dtype)}
        if "attention_mask" in specs:
            feeds["attention_mask"] = np.ones((batch, total), specs["attention_mask"].dtype)
        if "position_ids" in specs:
            feeds["position_ids"] = np.broadcast_to(np.arange(seen, total), new.shape).astype(specs["position_ids"].dtype)
        feeds |= past | (fixed or {})
        for name, spec in specs.items():  # anything else (token types): zeros of its shape
            if name not in feeds:
                feeds[name] = np.zeros([batch if s == "batch" else new.shape[1] if s == "seq" else s for s in spec.shape], spec.dtype)
        outputs = run(feeds)
        step = _next_token_scores(outputs, head, profile)
        token = step.argmax(axis=-1).astype(np.int64)
        tokens.append(token)
        scores.append(step)
        fed = token if forced is None else forced[:, index]
        if past_names:
            past = {name: outputs[name.replace("past_key_values", "present")] for name in past_names}
            new, seen = fed[:, None], total
        else:
            new = np.concatenate([new, fed[:, None]], axis=1)
    return Generation(np.stack(tokens, axis=1), np.stack(scores))


def _next_token_scores(outputs: dict[str, np.ndarray], head: np.ndarray | None, profile: Profile) -> np.ndarray:
    if "logits" in outputs:
        return outputs["logits"][:, -1].astype(np.float64)
    if "last_hidden_state" in outputs and head is not None:
        return outputs["last_hidden_state"][:, -1].astype(np.float64) @ head.T
    raise InputError(f"{profile.source}: the generation check needs a logits output (or last_hidden_state and an input embedding "
                     f"to decode through), the model gives {', '.join(outputs)}; export task causal-lm")


def embedding_head(model: Any) -> np.ndarray | None:
    """The input embedding matrix [vocab, hidden] of an ONNX model (the initializer the Gather of input_ids reads), or None."""
    graph = GraphIndex.of(model)
    sources = {"input_ids"}
    for node in graph.nodes:  # follow input_ids through Casts and reshapes (GPT-2 views them as [-1, seq])
        if node.op_type in ("Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze") and node.input and node.input[0] in sources:
            sources.add(node.output[0])
    for node in graph.nodes:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in sources:
            name = node.input[0]
            while graph.op(name) in ("Cast", "DequantizeLinear", "Identity"):
                name = graph.producer(name).input[0]
            value = graph.constant(name)
            if value is not None:
                return value.astype(np.float64)
    return None


def save_reference(path: Path, generation: Generation, head: np.ndarray | None, feeds: dict[str, np.ndarray] | None = None) -> None:
    """The tokens, each step's `REFERENCE_TOP_K` scores with their ids and a base model's embedding `head`, in float32: sized
    by the check, not the vocabulary (a 152k-token model's full scores made a 1.1 GB file). `feeds`: see `load_feeds`."""
    from pipeline.core.fileio import atomic_path

    top = generation.top()
    arrays = {"tokens": top.tokens, "ids": top.ids.astype(np.int32), "logits": top.logits.astype(np.float32)}
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **arrays, **({"head": head.astype(np.float32)} if head is not None else {}), **(feeds or {}))


def load_reference(path: Path) -> tuple[Generation, np.ndarray | None]:
    with np.load(path) as data:
        head = data["head"].astype(np.float64) if "head" in data else None
        return Generation(data["tokens"], data["logits"].astype(np.float64), data["ids"].astype(np.int64)), head


def load_feeds(path: Path) -> dict[str, Any]:
    """What a reference's generation was fed beside the profile's prompts: `prompt` (the ids it started from, else None),
    `fixed` (inputs fed at every step: an encoder-decoder's cross-attention caches and mask) and `encoder` (the encoder's inputs), by name."""
    with np.load(path) as data:
        return {"prompt": data["prompt"] if "prompt" in data else None,
                **{group: {k.removeprefix(f"{group}."): data[k] for k in data if k.startswith(f"{group}.")} for group in ("fixed", "encoder")}}


def follow(run: Runner, profile: Profile, reference: Generation, head: np.ndarray | None = None, ids: np.ndarray | None = None,
           fixed: dict[str, np.ndarray] | None = None) -> Generation:
    """`run` decoding `reference`'s tokens (teacher forcing): its pick and scores at every step after the reference's prefix."""
    return greedy(run, profile, head, ids, reference.tokens.shape[1], fixed, forced=reference.tokens)


def compare(reference: Generation, candidate: Generation) -> dict[str, Any]:
    """Token agreement of a `candidate` that `follow`ed the reference, the first step and row where it picks another token,
    and per-step figures of the scores of the reference's `REFERENCE_TOP_K` most likely tokens."""
    reference = reference.top()
    equal = reference.tokens == candidate.tokens
    differing = np.argwhere(~equal)
    first = (int(differing[:, 1].min()), int(differing[differing[:, 1] == differing[:, 1].min()][0, 0])) if differing.size else None
    steps = []
    for step in range(reference.logits.shape[0]):
        want, got = reference.logits[step], np.take_along_axis(candidate.logits[step], reference.ids[step], -1)
        centre = want.mean(axis=-1, keepdims=True)
        steps.append({"cosine_centered": round(_cosine(want - centre, got - centre), 6), "max_abs_diff": float(np.max(np.abs(want - got)))})
    return {
        "token_agreement": round(float(equal.mean()), 4),
        "tokens": int(equal.size),
        "first_divergent_step": first[0] if first else None,
        "first_divergent_row": first[1] if first else None,
        "steps": steps,
        "min_cosine_centered": min(s["cosine_centered"] for s in steps),
        "max_abs_diff": max(s["max_abs_diff"] for s in steps),
    }


def require_exact(figures: dict[str, Any], stage: str, what: str) -> None:
    """Fail the stage when the candidate's tokens are not exactly the reference's."""
    if figures["first_divergent_step"] is not None:
        step, row = figures["first_divergent_step"], figures["first_divergent_row"]
        raise StageFailed(f"{stage}: greedy generation differs from {what} at step {step}, batch row {row} "
                          f"(token agreement {figures['token_agreement']:.2%}, logits max_abs_diff={figures['steps'][step]['max_abs_diff']:.3g} "
                          "at that step); the model is not token-exact: report this with the model")


def gate(figures: dict[str, Any], stage: str, minimum: float) -> None:
    """Fail the stage when the token agreement is below `minimum`."""
    if not figures["token_agreement"] >= minimum:
        raise StageFailed(f"{stage}: next-token agreement {figures['token_agreement']:.2%} < {minimum:.2%} (fed torch's greedy tokens, "
                          f"first step that picks another: {figures['first_divergent_step']}, batch row {figures['first_divergent_row']}); "
                          "exclude sensitive nodes, try another preset or more calibration data, or lower --min-token-agreement")


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.sum(a * b) / norm) if norm else 1.0
