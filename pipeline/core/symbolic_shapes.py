"""onnxruntime's symbolic shape inference without its stray files: on a graph it cannot infer completely,
`SymbolicShapeInference.infer_shapes` (onnxruntime 1.24) saves `sym_shape_infer_temp.onnx` and a `<uuid1>.data` in the
current folder, then raises. ModelOpt and our memory estimate call it; `without_stray_files()` swaps in the same inference,
raising the same exception, that writes nothing.
"""

from __future__ import annotations

from typing import Any


def infer_shapes(in_mp: Any, int_max: int = 2**31 - 1, auto_merge: bool = False, guess_output_rank: bool = False, verbose: int = 0) -> Any:
    """`SymbolicShapeInference.infer_shapes`, step for step, less the save of the partial model."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference, get_opset

    opset = get_opset(in_mp)
    if not opset or opset < 7:
        return None  # onnxruntime's: only opset 7 and above
    inference = SymbolicShapeInference(int_max, auto_merge, guess_output_rank, verbose)
    complete = False
    inference._preprocess(in_mp)
    while inference.run_:
        complete = inference._infer_impl()
    inference._update_output_from_vi()
    if not complete:
        raise Exception("Incomplete symbolic shape inference")  # noqa: TRY002 - onnxruntime's own, which its callers catch
    return inference.out_mp_


def without_stray_files() -> None:
    """Make every caller's `SymbolicShapeInference.infer_shapes` this module's `infer_shapes` (idempotent)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    SymbolicShapeInference.infer_shapes = staticmethod(infer_shapes)
