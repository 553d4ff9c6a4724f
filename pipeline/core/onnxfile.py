"""Reading a user's ONNX file: every way it can be unusable becomes one line saying what to do.

onnx is imported at call time. Weights stored as external data are checked to exist (and to
be long enough) without reading them, so a model with a missing `.data` file is refused when
it is opened, not half way through a stage.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.errors import InputError
from pipeline.core.fileio import describe_os_error, require_file

HINT = "pass an ONNX file written by torch.onnx.export or onnx.save"


def load_onnx(path: Path | str, what: str = "ONNX file", hint: str = HINT, weights: bool = False):
    """The parsed ModelProto of a readable ONNX file (weights left on disk unless `weights`)."""
    import onnx
    from google.protobuf.message import DecodeError

    path = require_file(path, what, hint)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: not an ONNX model (protobuf cannot parse it: {type(err).__name__}); {hint}") from err
    except MemoryError as err:
        raise InputError(f"{path}: not an ONNX model (its protobuf claims more memory than there is); {hint}") from err
    if not model.HasField("graph"):
        raise InputError(f"{path}: not an ONNX model (no graph in it); {hint}")
    check_external_data(external_tensors(model), path)
    if weights:
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, str(path.parent))
    return model


def external_tensors(model) -> list[tuple[str, str, int, int | None]]:
    """(tensor name, location, offset, length) of every initializer stored outside the file."""
    import onnx

    found = []
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        length = int(info["length"]) if info.get("length", "").isdigit() else None
        offset = int(info["offset"]) if info.get("offset", "").isdigit() else 0
        found.append((tensor.name, info.get("location", ""), offset, length))
    return found


def check_external_data(tensors: list[tuple[str, str, int, int | None]], model_path: Path) -> None:
    """Each external weight's file exists beside the model, inside its folder, and holds its bytes."""
    folder = model_path.resolve().parent
    for name, location, offset, length in tensors:
        data = (folder / location).resolve()
        if not location or folder not in data.parents:
            raise InputError(f"{model_path}: weight {name!r} points outside the model's folder ({location!r}); keep external data beside the .onnx")
        if not data.is_file():
            raise InputError(f"{model_path}: weight {name!r} is stored in {location!r}, which is missing; copy it beside the .onnx (or re-save with onnx.save(..., save_as_external_data=False))")
        size = data.stat().st_size
        if offset + (length or 0) > size:
            raise InputError(f"{model_path}: weight {name!r} needs bytes {offset}..{offset + (length or 0)} of {location!r}, which holds {size}; the data file is truncated or from another model")


@contextlib.contextmanager
def private_copy(source: Path, external: list[tuple[str, str, int, int | None]], beside: Path) -> Iterator[tuple[Path, Path]]:
    """(work folder, copy of `source` with its external data files) for a library that writes to
    the file it is given or beside it; the folder (`.<beside without its dots and .onnx>.work.*.tmp`) is removed
    afterwards, and a run killed before that leaves a name the next build cleans up.

    The folder's name holds no ".onnx": ModelOpt names its intermediates with
    `path.replace(".onnx", "_ir10.onnx")` on the whole path (an IR > 10 model), which would point
    into a folder that does not exist."""
    try:
        workdir = Path(tempfile.mkdtemp(prefix=f".{beside.name.lstrip('.').replace('.onnx', '')}.work.", suffix=".tmp", dir=beside.parent))
    except OSError as err:
        raise InputError(describe_os_error(err, beside.parent)) from err
    try:
        copy = workdir / Path(source).name
        try:
            shutil.copyfile(source, copy)
            for location in dict.fromkeys(location for _, location, _, _ in external):
                (workdir / location).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(source).parent / location, workdir / location)
        except OSError as err:
            raise InputError(describe_os_error(err, workdir)) from err
        yield workdir, copy
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
