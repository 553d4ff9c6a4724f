"""The torch module an ONNX node came from.

The dynamo exporter records it in each node's `pkg.torch.onnx.name_scopes` metadata (the module
paths from the root down, then the FX node's own name); the TorchScript exporter in the node's
name (`/encoder/layers.3/mha/attn/MatMul`). Both give the same scope, one part per module level:
('encoder', 'layers.3', 'mha', 'attn'), whose parts joined with "." are the qualified name
`named_modules()` gives that module.
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
        parts, previous = [], ""
        for module in modules:
            parts.append(module[len(previous) + 1 :] if previous and module.startswith(previous + ".") else module)
            previous = module
        return tuple(parts)
    return scope_of_name(name)


def module_name(scope: tuple[str, ...]) -> str:
    """The qualified module name of a scope ('' for the root)."""
    return ".".join(scope)
