"""The export's generation check of a decoder: torch's greedy decoding first (the reference, made while the module is
held), then the exported file on onnxruntime decoding torch's tokens once the module is let go (pipeline/export.py);
an encoder-decoder's decoder part checks step by step beside its module (pipeline/models/seq2seq.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.core.profiles import Profile
from pipeline.models.module import flatten_outputs, run_module

if TYPE_CHECKING:
    from pipeline.core.verify import OnnxSession

Status = Callable[[str], None]
Case = tuple[dict[str, int], dict[str, np.ndarray], dict[str, np.ndarray]]  # a check: sizes, feeds, torch's outputs by name


@dataclass(frozen=True)
class TorchGeneration:
    """torch's greedy decoding, the generation check's reference, made before the module is let go."""

    generation: Any
    head: np.ndarray | None  # a base model's embedding matrix, its logits' head
    seconds: float


def torch_generation(profile: Profile, module: Any, onnx_path: Path, cases: list[Case], status: Status) -> TorchGeneration | dict[str, Any] | None:
    """torch's greedy decoding for a decoder's generation check; {"skipped": why} where its picks cannot be fed back;
    None for a model that does not generate (an encoder-decoder's decoder part: its own check, after the verification)."""
    import time

    import torch

    from pipeline.core.generation import decodes, greedy
    from pipeline.models.decoder import generates

    outputs = cases[0][2]
    if profile.export.part == "decoder" or not (generates(module) or decodes(profile, list(outputs))):
        return None
    unfed = _tokens_it_does_not_take(profile, outputs)
    if unfed:
        return {"skipped": unfed}
    status("generation check: greedy decoding with torch")
    head = None if "logits" in outputs else _input_embedding(module, onnx_path)  # a base model: decoded through its embedding
    started = time.perf_counter()
    with _one_thread(torch):
        reference = greedy(_torch_runner(module, profile), profile, head)
    return TorchGeneration(reference, head, time.perf_counter() - started)


def _input_embedding(module: Any, onnx_path: Path) -> np.ndarray | None:
    """A base model's input embedding matrix: transformers' `get_input_embeddings()`, the weights the exported Gather
    reads, without loading every weight of the file beside the module; else the ONNX file's (pipeline/core/generation.py)."""
    import onnx

    from pipeline.core.generation import embedding_head

    try:
        return module.get_input_embeddings().weight.detach().numpy().astype(np.float64)
    except (AttributeError, NotImplementedError):  # not a transformers model, or one without a single input embedding
        return embedding_head(onnx.load(str(onnx_path)))


def follow_on_onnxruntime(profile: Profile, reference: TorchGeneration, session: OnnxSession, reference_path: Path | None, status: Status) -> dict[str, Any]:
    """The exported file on onnxruntime (`session`) decoding torch's tokens (pipeline/core/generation.py): its picks must be
    torch's at every step. torch's run is saved to `reference_path` (if given) for later stages."""
    import time

    from pipeline.core.generation import PAST_INPUT, compare, follow, require_exact, save_reference

    status("generation check: greedy decoding on onnxruntime vs torch")
    started = time.perf_counter()
    figures = compare(reference.generation, follow(session.run_named, profile, reference.generation, reference.head))
    require_exact(figures, "export", "torch's")
    if reference_path is not None:
        save_reference(reference_path, reference.generation, reference.head)
    fed_back = any(PAST_INPUT.fullmatch(spec.name) for spec in profile.inputs)
    seconds = reference.seconds + time.perf_counter() - started
    return {**figures, "check_seconds": round(seconds, 3), **({} if fed_back else {"prefix_recomputed": True})}


def decoder_part_generation(given: Profile, profile: Profile, module: Any, session: OnnxSession, reference_path: Path | None,
                             status: Status) -> dict[str, Any]:
    """The generation check of an encoder-decoder's decoder part, on the encoder part's outputs for `given`'s inputs."""
    import torch

    from pipeline.models.seq2seq import check_decoder_generation

    status("generation check: greedy decoding on onnxruntime vs torch, on the encoder's cross-attention caches")
    with _one_thread(torch):
        return check_decoder_generation(given, profile, module, _torch_runner(module, profile), session, reference_path)


def _tokens_it_does_not_take(profile: Profile, outputs: dict[str, np.ndarray]) -> str | None:
    """Why greedy decoding cannot feed the model the tokens it picks: its logits score more classes than its input_ids
    range (HiggsAudio's 8192 audio codebook entries against its 1000 text tokens: the picked ids overran the embedding);
    None where it can."""
    spec = next(s for s in profile.inputs if s.name == "input_ids")  # prompts() required it, with a range
    width = outputs["logits"].shape[-1] if "logits" in outputs else None
    if width is not None and width > spec.range[1]:
        return f"its logits score {width} classes and input_ids takes {spec.range[1]:g}, so its picks cannot be fed back"
    return None


def _torch_runner(module: Any, profile: Profile) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """The module as the generation loop runs a model: feeds by input name -> outputs by name."""
    import torch

    names = [spec.name for spec in profile.inputs]

    def torch_run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        output = run_module(module, tuple(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names), profile)
        return {name: t.numpy() for name, t in flatten_outputs(output, profile)}

    return torch_run


@contextlib.contextmanager
def _one_thread(torch: Any) -> Iterator[None]:
    """torch on one thread while it decodes: a decode step's operations are too small to share, yet torch splits them and
    each split waits for a core (10x the decode time on a loaded 2-core machine); and a GEMM split across threads rounds
    differently, so one thread makes the reference the same on any machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
