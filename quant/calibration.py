"""Calibration data for INT8: synthetic but valid samples from the profile, or a user's .npz.

Both give `{input name: array}` with the samples concatenated along axis 0 (ModelOpt's
`calibration_data` format), each sample of the profile's calibration shape (opt sizes).
A user's file is checked against the ONNX model's inputs: every name present, dtype and
shape right, no pickled objects, no NaN or Inf. Held-out accuracy samples use other seeds.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pipeline.core.errors import InputError
from pipeline.core.fileio import require_file
from pipeline.core.profiles import Profile
from pipeline.core.samples import make_inputs
from pipeline.core.seeds import CALIBRATION_SEED


def synthetic(profile: Profile, samples: int, seed: int = CALIBRATION_SEED) -> dict[str, np.ndarray]:
    """`samples` random valid feeds at the profile's opt shapes, concatenated along axis 0."""
    feeds = [make_inputs(profile, seed=seed + i) for i in range(samples)]
    return {name: np.concatenate([f[name] for f in feeds], axis=0) for name in feeds[0]}


def split(data: dict[str, np.ndarray], batch: int) -> list[dict[str, np.ndarray]]:
    """Back into per-step feeds of `batch` rows each."""
    rows = len(next(iter(data.values())))
    return [{name: array[i : i + batch] for name, array in data.items()} for i in range(0, rows, batch)]


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


def load_npz(path: Path, model_inputs: dict[str, tuple[str, list]]) -> dict[str, np.ndarray]:
    """Load and check a user's calibration file.

    `model_inputs` maps each ONNX input to (numpy dtype name, dims) where a dim is an int or
    None (dynamic). Arrays hold samples concatenated along axis 0.
    """
    path = require_file(path, "calibration file", "pass an .npz with one array per model input (numpy.savez)")
    data = read_npz(path)
    missing = sorted(model_inputs.keys() - data.keys())
    if missing:
        raise InputError(f"{path}: no array for model input {missing[0]!r} (has {sorted(data)}); add one per input: {sorted(model_inputs)}")
    rows = {name: data[name].shape[0] if data[name].ndim else 0 for name in model_inputs}
    for name, (dtype, dims) in model_inputs.items():
        array = data[name]
        if array.dtype != np.dtype(dtype):
            raise InputError(f"{path}: input {name!r} has dtype {array.dtype}, the model expects {dtype}; convert it with .astype({dtype!r})")
        if array.ndim != len(dims) or any(d is not None and d != s for d, s in zip(dims[1:], array.shape[1:], strict=False)):
            raise InputError(f"{path}: input {name!r} has shape {list(array.shape)}, the model expects [samples, {', '.join(str(d) if d is not None else '?' for d in dims[1:])}] (samples concatenated on axis 0)")
        if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
            raise InputError(f"{path}: input {name!r} contains NaN or Inf at flat index {int(np.argmin(np.isfinite(array).reshape(-1)))}; calibration needs finite values")
    if len(set(rows.values())) != 1 or 0 in rows.values():
        raise InputError(f"{path}: inputs have different sample counts {rows}; every array needs the same number of rows on axis 0")
    return {name: data[name] for name in model_inputs}


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz, each member's header checked before any data is read (no pickles, no
    shape that claims more bytes than the member holds, so a corrupt header cannot exhaust memory)."""
    hint = "write it again with numpy.savez (one plain numeric array per input)"
    if not zipfile.is_zipfile(path):
        raise InputError(f"{path}: not an .npz file (not a zip archive); {hint}")
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                _check_member(path, archive, info, hint)
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        raise InputError(f"{path}: not a readable .npz file ({type(err).__name__}: {err}); {hint}") from err
    except MemoryError as err:
        raise InputError(f"{path}: its arrays do not fit in memory; use fewer calibration samples") from err


def _check_member(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, hint: str) -> None:
    name = info.filename.removesuffix(".npy")
    with archive.open(info) as member:
        try:
            version = np.lib.format.read_magic(member)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(member)
        except ValueError as err:
            raise InputError(f"{path}: member {name!r} is not a .npy array ({err}); {hint}") from err
        header_bytes = member.tell()
    if dtype.hasobject:
        raise InputError(f"{path}: array {name!r} holds Python objects (pickled), which are refused (allow_pickle=False); {hint}")
    claimed = math.prod(shape) * dtype.itemsize
    held = info.file_size - header_bytes
    if claimed != held:
        raise InputError(f"{path}: array {name!r} claims shape {list(shape)} {dtype} ({claimed} bytes) but holds {held} bytes: the file is corrupt or truncated; {hint}")


def model_inputs(onnx_path: Path) -> dict[str, tuple[str, list]]:
    """Each ONNX input's numpy dtype name and dims (None where dynamic)."""
    from onnx import helper

    from pipeline.core.onnxfile import load_onnx

    model = load_onnx(onnx_path)
    return {
        i.name: (helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name,
                 [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim])
        for i in model.graph.input
    }


DECODE_STEPS = 3  # decode steps after each calibration prompt's prefill


def decoder_calibration(profile: Profile, onnx_path: Path, samples: int, seed: int = CALIBRATION_SEED) -> tuple[list[dict[str, np.ndarray]], str]:
    """`samples` feeds of a decoder with its KV cache, as it is fed when deployed: each random prompt (opt
    batch x opt seq tokens) is a prefill on an empty cache, then DECODE_STEPS greedy tokens, one at a
    time, on the cache the FP32 model (`onnx_path`) wrote. Random `past_key_values` are no stand-in:
    their scale is not the model's, and INT8 scales calibrated on them round a real cache's keys and
    values, and the attention output, to zero (greedy tokens then agree with FP32 on 0-6%)."""
    import onnx

    from pipeline.core.generation import embedding_head, greedy
    from pipeline.core.verify import OnnxSession

    session = OnnxSession(onnx_path)
    head = None if "logits" in session.outputs else embedding_head(onnx.load(str(onnx_path)))
    ids_spec = next(s for s in profile.inputs if s.name == "input_ids")
    low, high = ids_spec.range if ids_spec.range is not None else (0, 2)
    batch = profile.dims["batch"].opt if "batch" in profile.dims else 1
    length = max(1, min(profile.dims["seq"].opt, profile.dims["past_seq"].max + 1 - DECODE_STEPS))
    rng = np.random.default_rng(seed)
    feeds: list[dict[str, np.ndarray]] = []

    def recorded(step: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds.append(dict(step))
        return session.run_named(step)

    prompts = 0
    while len(feeds) < samples:
        greedy(recorded, profile, head, ids=rng.integers(int(low), int(high), (batch, length), dtype=np.int64), new_tokens=DECODE_STEPS + 1)
        prompts += 1
    return feeds[:samples], (f"synthetic, {samples} feeds ([quant] samples) of {batch} rows as the decoder is fed: the prefill of {prompts} random "
                             f"prompt(s) of {batch} x {length} tokens, then {DECODE_STEPS} decode steps each on the KV cache the FP32 model wrote")


def fed_as_decoder(profile: Profile, onnx_path: Path) -> bool:
    """Whether `decoder_calibration` applies: the model has KV cache inputs (`past_key_values.{i}.key/value`)
    and the profile describes them (`past_seq`) and the token ids it generates from (`input_ids`)."""
    from pipeline.core.generation import PAST_INPUT

    return ("past_seq" in profile.dims and any(s.name == "input_ids" for s in profile.inputs)
            and any(PAST_INPUT.fullmatch(name) for name in model_inputs(onnx_path)))


def calibration_data(profile: Profile, calib: Path | None, onnx_path: Path) -> tuple[dict[str, np.ndarray], str]:
    """A user's .npz checked against the model, else synthetic samples; and where they came from."""
    if calib is None:
        data = synthetic(profile, profile.quant.samples)
        rows = len(next(iter(data.values()))) if data else 0
        return data, f"synthetic, {profile.quant.samples} feeds at profile {profile.name}'s opt shapes ([quant] samples): {rows} samples"
    return load_npz(Path(calib), model_inputs(onnx_path)), str(Path(calib).resolve())
