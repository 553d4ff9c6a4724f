"""The layers import one way: pipeline.core <- quant, trt <- the rest of pipeline (docs/design.md, "Layers")."""

import ast
import graphlib

import pytest
from conftest import REPO

LAYERS = {  # folder -> the packages of ours it may import
    "pipeline/core": ("pipeline.core",),
    "quant": ("pipeline.core", "quant"),
    "trt": ("pipeline.core", "trt"),
}
OURS = ("pipeline", "quant", "trt")


def imported_modules(path):
    """Every module an import statement of `path` names (for `from a import b`, also a.b: b may be a module)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield node.lineno, [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]


def allowed(module: str, prefixes: tuple[str, ...]) -> bool:
    return module.split(".")[0] not in OURS or any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(folder: str, prefixes: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((REPO / folder).rglob("*.py")):
        for line, names in imported_modules(path):
            # `from pipeline.core import x` names pipeline.core and pipeline.core.x: both allowed;
            # `from pipeline import errors` names pipeline (the application): not allowed
            if not allowed(names[0], prefixes):
                found.append(f"{path.relative_to(REPO)}:{line} imports {names[0]}")
    return found


@pytest.mark.parametrize("folder", list(LAYERS))
def test_imports_flow_one_way(folder):
    assert violations(folder, LAYERS[folder]) == []


def test_the_check_sees_a_violation(tmp_path, monkeypatch):
    """The check is not vacuous: an upward import in a file of the core is reported with its line."""
    core = tmp_path / "pipeline" / "core"
    core.mkdir(parents=True)
    (core / "bad.py").write_text("import json\nfrom pipeline.stages import Stage\nfrom pipeline.core import errors\n")
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    assert violations("pipeline/core", LAYERS["pipeline/core"]) == ["pipeline/core/bad.py:2 imports pipeline.stages"]


def tensorrt_imports(root) -> list[str]:
    """Every `import tensorrt` (or `from tensorrt ...`) outside trt/ in our packages."""
    found = []
    for package in OURS:
        for path in sorted((root / package).rglob("*.py")):
            if path.relative_to(root).parts[0] == "trt":
                continue
            for line, names in imported_modules(path):
                if names[0].split(".")[0] in ("tensorrt", "tensorrt_bindings"):
                    found.append(f"{path.relative_to(root)}:{line} imports {names[0]}")
    return found


def test_tensorrt_is_imported_only_inside_trt():
    assert tensorrt_imports(REPO) == []


def test_the_tensorrt_check_sees_an_import_in_a_function(tmp_path):
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "stage.py").write_text("def build():\n    import tensorrt as trt\n    return trt\n")
    (tmp_path / "trt").mkdir()
    (tmp_path / "trt" / "build.py").write_text("import tensorrt\n")
    assert tensorrt_imports(tmp_path) == ["pipeline/stage.py:2 imports tensorrt"]


def our_modules(repo) -> dict[str, object]:
    """Every module of ours by its dotted name -> its file."""
    modules = {}
    for folder in OURS:
        for path in sorted((repo / folder).rglob("*.py")):
            parts = path.relative_to(repo).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_cycle(repo) -> list[str]:
    """A cycle among our modules' imports (those inside functions included: they close a circle at run time), or []."""
    modules = our_modules(repo)

    def ours(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in modules.items():
        targets = {ours(name) for _, names in imported_modules(path) for name in names}
        # a module reading its own package's __init__ is Python's import order, not a circle
        graph[module] = {t for t in targets if t and t != module and not module.startswith(t + ".")}
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        return err.args[1]
    return []


def test_no_import_cycle():
    assert import_cycle(REPO) == []


def test_the_cycle_check_sees_a_cycle(tmp_path):
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "a.py").write_text("def f():\n    from pipeline.b import g\n")
    (tmp_path / "pipeline" / "b.py").write_text("from pipeline import a\n")
    assert sorted(set(import_cycle(tmp_path))) == ["pipeline.a", "pipeline.b"]


def sys_modules_assignments(folders) -> list[str]:
    """`sys.modules[...] = ...` (or del, or .setdefault/.update) in our code: patching another library's import."""
    found = []
    for path in folders:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else []
            calls = [node.func.value] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("setdefault", "update", "pop") else []
            for target in [*targets, *calls]:
                base = target.value if isinstance(target, ast.Subscript) else target
                if ast.unparse(base) == "sys.modules":
                    found.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path.name}:{node.lineno}")
    return found


def test_no_sys_modules_assignment_outside_tests(tmp_path):
    assert sys_modules_assignments(path for folder in (*OURS, "bench") for path in sorted((REPO / folder).rglob("*.py"))) == []
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text("import sys\nsys.modules['sympy'] = object()\n")
    assert sys_modules_assignments([stand_in]) == ["stand_in.py:2"]
