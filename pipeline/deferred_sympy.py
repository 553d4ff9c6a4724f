"""Keep sympy out of a process that only reads and rewrites ONNX graphs.

onnx_ir 1.1 imports sympy when it is imported (`_core.py`, and `_symbolic_shapes.py` reads
`sympy.Max` at module level) for arithmetic on symbolic dims, which reading, rewriting and
writing a model never does, and it is the largest part of importing onnx_ir. `defer()`
puts stand-ins for both modules in `sys.modules`; the first attribute read from either
imports the real module (which then replaces the stand-in there) and answers from it, so
nothing behaves differently, it only happens later or never.

Only for processes that import nothing else of sympy's (the `optimize` command: no torch), and
only before onnx_ir is imported: a stand-in is never a parent of a sympy submodule. Drop it
once onnx_ir imports sympy lazily.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

DEFERRED = ("sympy", "onnx_ir._symbolic_shapes")


class _Deferred(types.ModuleType):
    """A module that imports itself on the first attribute read it does not have."""

    def __getattr__(self, name: str):
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        real = importlib.import_module(self.__name__)
        self.__dict__.update(real.__dict__)  # later reads through this stand-in are plain attribute reads
        return getattr(real, name)


def defer() -> None:
    """Stand-ins for sympy and onnx_ir's sympy-reading module, unless either is imported already."""
    if any(name in sys.modules for name in ("sympy", "onnx_ir")):
        return
    for name in DEFERRED:
        sys.modules[name] = _Deferred(name)
