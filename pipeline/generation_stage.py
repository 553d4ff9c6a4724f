"""The generation check in the stages after export (pipeline/core/generation.py does the decoding):
a decoder's optimized model must generate exactly the tokens torch did; the FP16 and INT8 models
record their agreement and are gated by `--min-token-agreement` (or the profile's quant settings)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.core.verify import OnnxSession
    from pipeline.stage import Job


GENERATION_READS = ("export", "inputs", "dims")  # the prompts, new_tokens and the cache inputs
GENERATION_INPUTS = ("export.*",)  # export.generation, present for a decoder only


def tokens_note(metrics: dict[str, Any]) -> str:
    """For a stage's line: at how many steps a decoder fed torch's tokens picks torch's next token ("" for an encoder)."""
    figures = metrics.get("generation")
    if figures and "skipped" in figures:
        return f", generation check skipped: {figures['skipped']}"
    if not figures:
        return ""
    prefill = " (no cache input: each step recomputes the prefix, no decode step is exported)" if figures.get("prefix_recomputed") else ""
    return f", next tokens {figures['token_agreement']:.0%} as torch's{prefill}"


def generation_figures(job: Job, candidate: Path | OnnxSession, stage: str) -> dict[str, Any] | None:
    """`candidate` fed the export's torch generation (pipeline/core/generation.py `follow`): None for a model the
    export did not decode (an encoder). optimize must agree exactly; fp16/int8 pass the gate."""
    from pipeline.core.generation import compare, follow, gate, load_feeds, load_reference, require_exact
    from pipeline.core.verify import OnnxSession

    if "generation" not in job.outputs_of("export"):
        return None
    path = job.input("export", "generation")
    profile = job.settings.profile
    started = time.perf_counter()
    reference, head = load_reference(path)
    fed = load_feeds(path)  # an encoder-decoder's decoder: its start tokens and the encoder outputs (cross-attention caches) torch decoded from
    session = candidate if isinstance(candidate, OnnxSession) else OnnxSession(candidate)
    figures = compare(reference, follow(session.run_named, profile, reference, head, ids=fed["prompt"], fixed=fed["fixed"]))
    figures["check_seconds"] = round(time.perf_counter() - started, 3)
    if stage == "optimize":
        require_exact(figures, stage, "torch's (the export's reference)")
        return figures
    figures["min_token_agreement"] = getattr(profile.quant, f"min_token_agreement_{stage}")  # --min-token-agreement overrides it
    gate(figures, stage, figures["min_token_agreement"])
    return figures


def fixed_feeds(job: Job) -> dict[str, Any] | None:
    """The inputs an encoder-decoder's decoder is fed at every step (the encoder outputs and mask its export decoded from), else None."""
    from pipeline.core.generation import load_feeds

    if "generation" not in job.outputs_of("export"):
        return None
    return load_feeds(job.input("export", "generation"))["fixed"] or None
