"""Calibration data for INT8: synthetic but valid samples from the profile (opt shapes), or a user's .npz checked
against the model's inputs (pipeline/core/samples.py `load_npz`); `{input name: array}`, samples along axis 0
(ModelOpt's `calibration_data` format). Held-out accuracy samples use other seeds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.profiles import Profile
from pipeline.core.samples import batch_axes, load_npz, model_inputs, synthetic
from pipeline.core.seeds import CALIBRATION_SEED
from pipeline.core.verify import OnnxSession


def calibration_reader(feeds: list[dict[str, np.ndarray]], on_step: Callable[[int, int], None]):
    """An onnxruntime CalibrationDataReader over our feeds that reports each step taken."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.index = 0

        def get_next(self):
            if self.index >= len(feeds):
                return None
            self.index += 1
            on_step(self.index, len(feeds))
            return feeds[self.index - 1]

        def get_first(self):  # ModelOpt peeks at one feed to find the MHA shapes
            return feeds[0]

        def rewind(self):
            self.index = 0

    return Reader()


DECODE_STEPS = 3  # decode steps after each calibration prompt's prefill


@dataclass(frozen=True)
class DecoderSteps:
    """`decoder_calibration`'s feeds, where they came from, and, when asked for, the FP32 model's outputs of each feed
    (flattened in its output order, as quant.accuracy.model_outputs gives them): a held-out check's reference, run once."""

    feeds: list[dict[str, np.ndarray]]
    origin: str
    outputs: list[np.ndarray] | None = None


def decoder_calibration(profile: Profile, onnx_path: Path, samples: int, seed: int = CALIBRATION_SEED,
                        fixed: dict[str, np.ndarray] | None = None, session: OnnxSession | None = None,
                        keep_outputs: bool = False) -> DecoderSteps:
    """`samples` feeds of a decoder with its KV cache, as it is fed when deployed: each random prompt (opt
    batch x opt seq tokens) is a prefill on an empty cache, then DECODE_STEPS greedy tokens, one at a
    time, on the cache the FP32 model (`onnx_path`, run by `session` if given) wrote. Random `past_key_values` are no stand-in:
    their scale is not the model's, and INT8 scales calibrated on them round a real cache's keys and
    values, and the attention output, to zero (greedy tokens then agree with FP32 on 0-6%). `fixed`: inputs
    fed at every step, an encoder-decoder's real encoder outputs (cross-attention caches) and mask, their rows repeated to
    the batch, not random ones. `keep_outputs`: keep the FP32 outputs of each feed (DecoderSteps.outputs), up to
    quant.accuracy.OUTPUT_BUDGET values (None past it: the check then runs both models batch by batch)."""
    import onnx

    from pipeline.core.generation import embedding_head, greedy
    from quant import accuracy

    session = session if session is not None else OnnxSession(onnx_path)
    head = None if "logits" in session.outputs else embedding_head(onnx.load(str(onnx_path)))
    ids_spec = next(s for s in profile.inputs if s.name == "input_ids")
    low, high = ids_spec.range if ids_spec.range is not None else (0, 2)
    batch = profile.dims["batch"].opt if "batch" in profile.dims else 1
    length = max(1, min(profile.dims["seq"].opt, profile.dims["past_seq"].max + 1 - DECODE_STEPS))
    rng = np.random.default_rng(seed)
    rows = {name: array[np.arange(batch) % len(array)] for name, array in (fixed or {}).items()}
    feeds: list[dict[str, np.ndarray]] = []
    kept: list[list[np.ndarray]] | None = [] if keep_outputs else None

    def recorded(step: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        nonlocal kept
        feeds.append(dict(step))
        outputs = session.run_named(step)
        if kept is not None and len(kept) < samples:
            kept.append(list(outputs.values()))
            if sum(o.size for run in kept for o in run) > accuracy.OUTPUT_BUDGET:
                kept = None
        if "logits" in outputs and outputs["logits"].shape[-1] > high:  # scores over more than the tokens it takes (HiggsAudio's
            outputs = {**outputs, "logits": outputs["logits"][..., : int(high)]}  # 8192 audio codebook entries, 1000 text tokens): picked among those
        return outputs

    prompts = 0
    while len(feeds) < samples:
        greedy(recorded, profile, head, ids=rng.integers(int(low), int(high), (batch, length), dtype=np.int64), new_tokens=DECODE_STEPS + 1,
               fixed=rows)
        prompts += 1
    encoder = f", on the encoder output of the export's generation check ({len(rows)} inputs fed at every step)" if rows else ""
    return DecoderSteps(feeds[:samples], (f"synthetic, {samples} feeds ([quant] samples) of {batch} rows as the decoder is fed: the prefill of {prompts} random "
                                          f"prompt(s) of {batch} x {length} tokens, then {DECODE_STEPS} decode steps each on the KV cache the FP32 model wrote{encoder}"),
                        None if kept is None else accuracy.flatten(kept))


def fed_as_decoder(profile: Profile, onnx_path: Path) -> bool:
    """Whether `decoder_calibration` applies: the model has KV cache inputs (`past_key_values.{i}.key/value`)
    and the profile describes them (`past_seq`) and the token ids it generates from (`input_ids`)."""
    from pipeline.core.generation import PAST_INPUT

    return ("past_seq" in profile.dims and any(s.name == "input_ids" for s in profile.inputs)
            and any(PAST_INPUT.fullmatch(name) for name in model_inputs(onnx_path)))


def calibration_data(profile: Profile, calib: Path | None, onnx_path: Path) -> tuple[dict[str, np.ndarray], str]:
    """A user's .npz checked against the model, else synthetic samples; and where they came from."""
    if calib is None:
        data = synthetic(profile, profile.quant.samples, CALIBRATION_SEED, batch_axes(onnx_path))
        rows = len(next(iter(data.values()))) if data else 0
        return data, f"synthetic, {profile.quant.samples} feeds at profile {profile.name}'s opt shapes ([quant] samples): {rows} samples"
    return load_npz(Path(calib), model_inputs(onnx_path), batch_axes(onnx_path)), str(Path(calib).resolve())
