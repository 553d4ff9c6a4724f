"""A stage's code: its entry's module and every module of ours it imports, directly or not (imports inside functions too,
not those under `if TYPE_CHECKING:`), each with its source's sha256. `from package import name` depends on `package.name`
when that is a module, else on the package's `__init__`; a package's `__init__` is no dependency of its modules (the list
of stages decides nothing of int8's result). Computed once per process.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

from pipeline.core.fileio import sha256_file

OURS = ("pipeline", "quant", "trt")


def code_key(entry_module: str) -> dict[str, str]:
    """{module: sha256 of its source} for the import closure of `entry_module`."""
    return {module: module_sha256(module) for module in import_closure(entry_module)}


@functools.cache
def import_closure(module: str) -> tuple[str, ...]:
    """`module` and every module of ours it imports, directly or not, sorted."""
    seen: set[str] = set()
    pending = [module]
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending += imports_of(name)
    return tuple(sorted(seen))


@functools.cache
def imports_of(module: str) -> tuple[str, ...]:
    """The modules of ours that `module`'s import statements name (resolved as described above)."""
    path = _source(module)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (base := _absolute(node, package)).split(".")[0] in OURS:
            found += [f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base for alias in node.names]
    return tuple(sorted({name for name in found if name.split(".")[0] in OURS}))


@functools.cache
def module_sha256(module: str) -> str:
    return sha256_file(_source(module))


def clear_caches() -> None:
    """Forget what was read (a test edits sources between two keys)."""
    for cached in (import_closure, imports_of, module_sha256, _is_module):
        cached.cache_clear()


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` but those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack += node.orelse
        else:
            stack += ast.iter_child_nodes(node)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


@functools.cache
def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a name inside a module, not a submodule
        return False


def _source(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no source for {module}")
    return Path(spec.origin)
