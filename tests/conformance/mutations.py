"""Mutations of the project's trt/ code: each is one textual edit of the real source, a mistake the
conformance tests must catch on each TensorRT version where it is one (tests/test_trt_conformance.py).

`mutated(mutation, folder)` writes the edited module into `folder`, imports it in place of the real one
for as long as the `with` lasts (code that imports it by name, as trt/builders.py's `builder` does,
gets the mutant) and puts the real one back. An edit whose text is not in the source exactly once
raises MutationNotApplied: the source moved, and the mutation must follow it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


class MutationNotApplied(AssertionError):
    """The text a mutation edits is not in the source exactly once."""


@dataclass(frozen=True)
class Mutation:
    module: str  # the module edited, e.g. "trt.build"
    old: str  # text of the real source, present exactly once
    new: str  # what replaces it
    scenario: str  # the conformance scenario (scenarios.py) run on the mutated code


MUTATIONS = {
    "no_profile": Mutation("trt.build", "        config.add_optimization_profile(profile)\n", "", "python_build"),
    "opt_above_max": Mutation("trt.build", "profile.set_shape(name, low, opt, high)", "profile.set_shape(name, low, high, opt)", "python_build"),
    "method_as_value": Mutation("trt.build", "name, op = error.node_name(), error.node_operator()", "name, op = error.node_name, error.node_operator()",
                                "python_build_parser_errors"),
    "flag_bit_literal": Mutation("trt.build", "1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)", "1 << 1", "python_build"),
}


def source_path(mutation: Mutation) -> Path:
    spec = importlib.util.find_spec(mutation.module)
    assert spec is not None and spec.origin, f"no module {mutation.module}"
    return Path(spec.origin)


def mutated_source(mutation: Mutation) -> str:
    """The module's real source with the mutation's edit made."""
    path = source_path(mutation)
    text = path.read_text()
    found = text.count(mutation.old)
    if found != 1:
        raise MutationNotApplied(f"{path}: {mutation.old!r} is there {found} times, not once; update tests/conformance/mutations.py")
    return text.replace(mutation.old, mutation.new)


@contextmanager
def mutated(mutation: Mutation, folder: Path) -> Iterator[ModuleType]:
    """The mutated module, imported as `mutation.module` while the `with` lasts."""
    real = importlib.import_module(mutation.module)
    source = folder / f"mutant_{mutation.module.replace('.', '_')}.py"
    source.write_text(mutated_source(mutation))
    spec = importlib.util.spec_from_file_location(mutation.module, source)
    mutant = importlib.util.module_from_spec(spec)
    package, _, name = mutation.module.rpartition(".")
    sys.modules[mutation.module] = mutant
    setattr(sys.modules[package], name, mutant)
    try:
        spec.loader.exec_module(mutant)
        yield mutant
    finally:
        sys.modules[mutation.module] = real
        setattr(sys.modules[package], name, real)
