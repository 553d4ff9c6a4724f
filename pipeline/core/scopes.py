"""The torch module an ONNX node came from: the dynamo exporter's `pkg.torch.onnx.name_scopes` metadata (module paths from
the root down, then the FX node's name) or the TorchScript exporter's node name (`/encoder/layers.3/mha/attn/MatMul`) give
the same scope, ('encoder', 'layers.3', 'mha', 'attn'), whose parts joined with "." are the module's qualified name.
"""

from __future__ import annotations

import ast

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"


def scope_of_name(name: str) -> tuple[str, ...]:
    """TorchScript-style `/a/b.0/c/Op_1` -> ('a', 'b.0', 'c'); other names have no scope."""
    if not name.startswith("/"):
        return ()
    return tuple(part for part in name.strip("/").split("/")[:-1] if part)


def node_scope(name: str, metadata: dict[str, str]) -> tuple[str, ...]:
    """The module scope of a node, from its name_scopes metadata, else from its name."""
    scopes = metadata.get(NAME_SCOPES_KEY)
    if scopes:
        try:
            paths = [p for p in ast.literal_eval(scopes) if isinstance(p, str)]
        except (ValueError, SyntaxError):
            paths = []
        modules = paths[1:-1]  # drop the root '' and the FX node's own name
        return tuple(module[len(previous) + 1 :] if previous and module.startswith(previous + ".") else module
                     for previous, module in zip(["", *modules], modules))
    return scope_of_name(name)


def module_name(scope: tuple[str, ...]) -> str:
    """The qualified module name of a scope ('' for the root). TorchScript names a child of a
    Sequential or ModuleList by its qualified name (`/block/block.0/Gemm`): such a part is taken whole."""
    name = ""
    for part in scope:
        name = part if name and part.startswith(name + ".") else f"{name}.{part}" if name else part
    return name


def inline_functions(model) -> int:
    """Inline an onnx_ir model's local functions in place (as TensorRT's parser does), each inlined node taking the module
    scope of the call it replaced; the number of calls inlined."""
    from onnx_ir.passes.common import InlinePass

    functions = model.functions
    if not functions:
        return 0

    def expanded_size(function) -> int:
        return sum(expanded_size(functions[n.op_identifier()]) if n.op_identifier() in functions else 1 for n in function)

    original = list(model.graph)
    calls = [(expanded_size(functions[n.op_identifier()]), n.metadata_props.get(NAME_SCOPES_KEY)) for n in original if n.op_identifier() in functions]
    kept = {id(n) for n in original if n.op_identifier() not in functions}
    InlinePass()(model)
    inlined = iter([n for n in model.graph if id(n) not in kept])  # in call order: each call's body replaced it in place
    for count, scopes in calls:
        for _ in range(count):
            node = next(inlined)
            if scopes and NAME_SCOPES_KEY not in node.metadata_props:
                node.metadata_props[NAME_SCOPES_KEY] = scopes
    return len(calls)


def inline_functions_proto(model):
    """`inline_functions` for an onnx ModelProto: the model itself when it has no local function."""
    if not model.functions:
        return model
    import onnx_ir as ir

    inlined = ir.serde.deserialize_model(model)
    inline_functions(inlined)
    return ir.serde.serialize_model(inlined)
