"""The layers import one way: pipeline.core <- quant, trt <- the rest of pipeline (docs/design.md, "Layers")."""

import ast

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
