"""Running an ONNX model with node results exposed as graph outputs: what compare, trace and
divergence read. A working copy of the model (weights loaded, local functions inlined: a tensor
inside a function cannot be an output) gets the results as outputs and runs on onnxruntime's CPU
provider as written (every graph optimization off, so each node of the file runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import InputError, first_line
from pipeline.core.scopes import inline_functions_proto

SAVE_EXTERNAL_BYTES = 1_800_000_000  # a working copy larger than this keeps its weights in a .data file (protobuf's 2 GB limit)


def load_inlined(path: Path):
    """The model with its weights, local functions inlined."""
    from pipeline.core.onnxfile import load_onnx

    return inline_functions_proto(load_onnx(path, weights=True))


def tensor_types(model, feeds: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """The type shape inference gives each tensor (a TypeProto by name); with `feeds`, at their input
    shapes with values propagated. Inference is best effort: onnxruntime has the last word."""
    import onnx

    from pipeline.core.onnxfile import proto_bytes, without_weights

    if proto_bytes(model) > SAVE_EXTERNAL_BYTES:  # shape inference serializes the model: not past protobuf's 2 GB
        model = without_weights(model)
    elif feeds is not None:  # a copy whose inputs have the feeds' shapes
        model = onnx.ModelProto.FromString(model.SerializeToString())
        for graph_input in model.graph.input:
            if graph_input.name in feeds and graph_input.type.HasField("tensor_type"):
                for dim, size in zip(graph_input.type.tensor_type.shape.dim, feeds[graph_input.name].shape):
                    dim.Clear()
                    dim.dim_value = size
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=feeds is not None)
    except Exception:  # best effort: without propagating values (the same error again without feeds)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    return {v.name: v.type for v in [*inferred.graph.value_info, *inferred.graph.output]}


class Exposed:
    """`model` (of the file `path`) with `tensors` added to its outputs (each of its type in `types`,
    unless it is an output already), saved into `workdir` and loaded in one session; errors name `path`."""

    def __init__(self, path: Path, model, tensors: list[str], types: dict[str, Any], workdir: Path):
        import onnx

        from pipeline.core.onnxfile import proto_bytes
        from pipeline.core.verify import OnnxSession

        existing = {o.name for o in model.graph.output}
        for tensor in tensors:
            if tensor not in existing:
                model.graph.output.append(onnx.helper.make_value_info(tensor, types[tensor]))
        copy = workdir / f"{len(list(workdir.iterdir()))}.{path.stem}.exposed.onnx"
        onnx.save(model, str(copy), save_as_external_data=proto_bytes(model) > SAVE_EXTERNAL_BYTES, location=copy.name + ".data")
        self.path = path
        self.session = OnnxSession(copy, as_written=True, shown_as=path)
        self.inputs, self.outputs = self.session.inputs, self.session.outputs

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every output by name for one feed set (by input name; arrays the model does not take are left out)."""
        missing = sorted(set(self.inputs) - feeds.keys())
        if missing:
            raise InputError(f"{self.path}: model input {missing[0]!r} has no data (given: {', '.join(sorted(feeds))}); "
                             "both models must take the inputs given")
        try:
            results = self.session.session.run(None, {name: feeds[name] for name in self.inputs})
        except Exception as err:  # shapes or dtypes the model does not accept
            raise InputError(f"{self.path}: onnxruntime cannot run it on the inputs given ({first_line(err)}); give inputs of its shapes and dtypes") from err
        return dict(zip(self.outputs, results, strict=True))


def exposing_results(path: Path, workdir: Path, indices: bool = False) -> Exposed:
    """The model with every float tensor it computes exposed (its outputs too), and with `indices` every int32, int64
    and bool one (positions, top-k picks, masks), ready to run."""
    import onnx

    model = load_inlined(path)
    types = tensor_types(model)
    kinds = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    if indices:
        kinds |= {onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.BOOL}
    exposed = [tensor for node in model.graph.node for tensor in node.output if tensor in types and types[tensor].tensor_type.elem_type in kinds]
    return Exposed(path, model, exposed, types, workdir)
