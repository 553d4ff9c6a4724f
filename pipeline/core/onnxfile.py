"""Reading a user's ONNX file: every way it can be unusable is one line saying what to do (external weights are checked
to exist and be long enough when it is opened, not half way through a stage). Writing: weights past
`external_data_threshold()` (1 GiB; protobuf's limit is 2 GiB) go to `<name>.data` beside the model, and `atomic_onnx`
moves both into place together, so no temporary name is ever recorded. onnx is imported at call time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.errors import InputError
from pipeline.core.fileio import TEMP_NAME, check_output_target, describe_os_error, external_data_file, move_into_place, require_file

HINT = "pass an ONNX file written by torch.onnx.export or onnx.save"
EXTERNAL_DATA_ENV = "PIPELINE_EXTERNAL_DATA_BYTES"
DEFAULT_EXTERNAL_DATA_BYTES = 1 << 30
SMALLEST_EXTERNAL_TENSOR = 1024  # bytes: smaller weights stay in the model file (as onnx.save does)


def external_data_threshold() -> int:
    """Bytes of weights above which a model is written with external data ($PIPELINE_EXTERNAL_DATA_BYTES, e.g. 0 to force it on a small model)."""
    value = os.environ.get(EXTERNAL_DATA_ENV, "").strip()
    if not value:
        return DEFAULT_EXTERNAL_DATA_BYTES
    if not value.isdigit():
        raise InputError(f"{EXTERNAL_DATA_ENV}={value!r}: not a number of bytes; set a whole number (0 writes every model with external data)")
    return int(value)


def ir_weight_bytes(model) -> int:
    """Bytes of an onnx_ir model's initializers (read from their headers, not their data)."""
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def proto_bytes(model) -> int:
    """About the bytes `model` serializes to (its weights and nodes), counted a part at a time: protobuf cannot size a
    whole message past 2 GB (`ByteSize()` raises EncodeError), which a quantized 0.5B decoder is in memory."""
    graph = model.graph
    return sum(tensor.ByteSize() for tensor in graph.initializer) + sum(node.ByteSize() for node in graph.node)


def save_onnx(model, path: Path) -> None:
    """Write a ModelProto to `path`. Past the external-data threshold, its weights of 1 KiB or more go to
    `<name>.data` beside it (relative location); `model` is left as it was, weights in memory."""
    import onnx

    path, data = Path(path), external_data_file(path)
    if proto_bytes(model) <= external_data_threshold():
        onnx.save_model(model, str(path))
        data.unlink(missing_ok=True)  # an earlier model's data, now unused
        return
    moved = []
    try:
        with open(data, "wb") as handle:
            for tensor in model.graph.initializer:
                if not tensor.HasField("raw_data") or tensor.ByteSize() < SMALLEST_EXTERNAL_TENSOR:
                    continue  # typed fields (rare in large weights) stay in the model file
                raw, offset = tensor.raw_data, handle.tell()
                handle.write(raw)
                moved.append((tensor, raw))
                onnx.external_data_helper.set_external_data(tensor, location=data.name, offset=offset, length=len(raw))
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
        if not moved:
            data.unlink()
        onnx.save_model(model, str(path))
    finally:
        for tensor, raw in moved:
            tensor.ClearField("external_data")
            tensor.ClearField("data_location")
            tensor.raw_data = raw


@contextlib.contextmanager
def atomic_onnx(target: Path) -> Iterator[Path]:
    """Yield `<work folder>/<target's name>` to write a model (and its `.data`) to; if the block succeeds, the data then the
    model are renamed onto `target`'s. The work folder's name is one remove_stale_temp_files knows, with no ".onnx" in it
    (see private_copy). OSErrors while writing become one-line InputErrors naming the target."""
    target = Path(target)
    check_output_target(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f".{target.name.replace('.onnx', '')}.", suffix=".tmp", dir=target.parent))
    except OSError as err:
        raise InputError(describe_os_error(err, target.parent)) from err
    written, data = folder / target.name, external_data_file(folder / target.name)
    ours = {str(p) for p in (written, data, target, external_data_file(target))}
    try:
        yield written
        _gather_external_data(written)
        has_data = data.is_file()
        if has_data:
            move_into_place(data, external_data_file(target))  # before the model: a model never points at data not there
        move_into_place(written, target)
        if not has_data:
            external_data_file(target).unlink(missing_ok=True)  # an older model's
    except OSError as err:
        if err.filename is not None and str(err.filename) not in ours:
            raise  # about another file (an input): not ours to describe as a write failure
        raise InputError(describe_os_error(err, target).replace(str(written), str(target))) from err
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _gather_external_data(written: Path) -> None:
    """A writer that stored weights in files of other names (torch's TorchScript exporter writes one per
    weight): the model is written again by save_onnx, so its data is `<name>.data` or inline."""
    import onnx

    expected = {written.name, external_data_file(written).name}
    stray = [p for p in written.parent.iterdir() if p.name not in expected and not TEMP_NAME.match(p.name)]
    if not stray or not written.is_file():
        return
    model = onnx.load(str(written))
    for path in stray:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    save_onnx(model, written)


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


def constants_as_tensors(model) -> int:
    """Rewrite in place the Constants with a value_int(s)/value_float(s) attribute (the dynamo exporter's) as a tensor `value`,
    the form onnxruntime's shape inference and ModelOpt's Cast folding read; how many were rewritten."""
    import numpy as np
    from onnx import helper, numpy_helper

    types = {"value_int": np.int64, "value_ints": np.int64, "value_float": np.float32, "value_floats": np.float32}
    rewritten = 0
    for node in model.graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name in types:
            attribute = node.attribute[0]
            array = np.array(helper.get_attribute_value(attribute), types[attribute.name])
            node.ClearField("attribute")
            node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(array)))
            rewritten += 1
    return rewritten


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


def stored_bytes(path: Path, model=None) -> int:
    """Bytes of an ONNX file and its external data files (`model`: the file parsed without weights, where the caller has it)."""
    import onnx

    model = model if model is not None else onnx.load(str(path), load_external_data=False)
    locations = dict.fromkeys(location for _, location, _, _ in external_tensors(model))
    return path.stat().st_size + sum((path.parent / location).stat().st_size for location in locations if (path.parent / location).is_file())


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
    """(work folder, copy of `source` with its external data) for a library that writes beside the file it is given;
    removed afterwards, under a name the next build cleans up. The name holds no ".onnx": ModelOpt's
    `path.replace(".onnx", "_ir10.onnx")` on the whole path would point into a folder that does not exist."""
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


def without_weights(model):
    """A copy of `model` whose initializers of 1 KiB or more keep their name, type and shape, not their data (what
    shape inference reads of them: it then takes milliseconds), built without copying the data."""
    import onnx

    light = onnx.ModelProto()
    graph = model.graph
    light.graph.CopyFrom(onnx.helper.make_graph(graph.node, graph.name, graph.input, graph.output, value_info=graph.value_info))
    for tensor in graph.initializer:
        if tensor.ByteSize() < SMALLEST_EXTERNAL_TENSOR:
            light.graph.initializer.append(tensor)
        else:
            light.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    return light
