"""The generation check in the stages after export (pipeline/core/generation.py does the decoding):
a decoder's optimized model must generate exactly the tokens torch did; the FP16 and INT8 models
record their agreement and are gated by `--min-token-agreement` (or the profile's quant settings)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.core.verify import OnnxSession
    from pipeline.runner import Context


def generation_figures(ctx: Context, candidate: Path | OnnxSession, stage: str) -> dict[str, Any] | None:
    """Greedy generation of `candidate` against the export's torch reference: None for a model the
    export did not decode (an encoder). optimize must agree exactly; fp16/int8 pass the gate."""
    from pipeline.core.generation import compare, gate, greedy, load_reference, require_exact
    from pipeline.core.verify import OnnxSession

    path = ctx.manifest.output_path("export", "generation")
    if path is None or not path.exists():
        return None
    started = time.perf_counter()
    reference, head = load_reference(path)
    session = candidate if isinstance(candidate, OnnxSession) else OnnxSession(candidate)
    figures = compare(reference, greedy(session.run_named, ctx.profile, head))
    figures["check_seconds"] = round(time.perf_counter() - started, 3)
    if stage == "optimize":
        require_exact(figures, stage, "torch's (the export's reference)")
        return figures
    q = ctx.profile.quant
    minimum = ctx.options.get("min_token_agreement")
    figures["min_token_agreement"] = minimum if minimum is not None else getattr(q, f"min_token_agreement_{stage}")
    gate(figures, stage, figures["min_token_agreement"])
    return figures
